"""Emulated GPUs: the agent process (``runner``), its transport (``transport``) and
congestion control (``dcqcn``)."""
