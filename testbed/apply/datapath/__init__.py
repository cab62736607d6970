"""The switch ports' queue datapath: every egress port's queue for a run (``egress``), its
qdiscs through netlink (``tc``, the only pyroute2 import) and their counters (``qdiscstat``),
the eBPF ECN/WRED marker (``marker``) and its maps (``bpfmap``), and adaptive routing's
steering program at the GPU NICs (``steering``)."""
