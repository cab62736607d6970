"""Emulated GPUs: the agent process (``runner``: its event loop), its NICs and connections
(``channel``), transport (``transport``), congestion control (``dcqcn``) and settings from
the plan (``config``)."""
