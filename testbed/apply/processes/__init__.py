"""The run's child processes and their launchers: one helper for all of them (``child``),
the controller (``controller``), the GPU agents (``agents``), the PFC process (``pfcd``, the
process itself, and ``pfc_daemon``, the run's side of it), the reachability probe run in
each GPU's namespace (``probe``) and packet captures (``capture``)."""
