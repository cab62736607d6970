"""Byte formats on the wire and in BPF maps (RoCEv2, PFC, OpenFlow groups, the marker's
maps), checked with golden bytes. Pure."""
