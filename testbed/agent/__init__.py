"""Emulated GPUs: the agent process (``__main__``, ``server``: one event loop for a server's
GPUs, each entering its namespace with ``netns``), one GPU (``runner``), which of its ops may
start (``ops``), its NICs and connections (``channel``), the RoCE transport (``transport``)
and congestion control (``dcqcn``), the Ultra-Ethernet-like transport (``uet``) and its
congestion control (``nscc``), and the settings from the plan (``config``)."""
