"""What touches the machine (needs root), by purpose: the fabric in Mininet (``fabric``), the
switch ports' queue datapath (``datapath``), the run's child processes and their launchers
(``processes``), a run across servers (``cluster``); and beside them what a run created and
its clean-up (``registry``), what this machine can do (``capabilities``) and how fast
(``speed``), the all-pairs check (``reachability``), link events on the live fabric
(``events``) and a live run's queues (``live``)."""
