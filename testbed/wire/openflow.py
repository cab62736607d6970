"""OpenFlow 1.5 wire formats os-ken cannot express, declared as data.

Why: Open vSwitch's default select-group hash (dp_hash, symmetric L3/L4) includes
TCP and SCTP ports but not UDP ports, so RoCEv2 flows that differ only in UDP
source port would all take one uplink. OVS accepts a per-group hash
(``selection_method=hash,fields(...)``) only as a Netronome experimenter group
property in an OpenFlow 1.5 group_mod; os-ken's property classes pad the
property in a way OVS rejects, so the message is built here byte by byte and
checked against ``ovs-ofctl ofp-print`` in the tests.
"""

from __future__ import annotations

import struct

OFP15_VERSION = 6
OFPT_GROUP_MOD = 15
OFPGC_ADD = 0
OFPGT_SELECT = 1
OFPG15_BUCKET_ALL = 0xFFFFFFFF
OFPAT_OUTPUT = 0
OFPCML_NO_BUFFER = 0xFFFF
OFPGBPT15_WEIGHT = 0
OFPGPT15_EXPERIMENTER = 0xFFFF
NTR_VENDOR_ID = 0x0000154D
NTRT_SELECTION_METHOD = 1
OFPXMC_OPENFLOW_BASIC = 0x8000

# OXM basic field: (field id, value length in bytes)
OXM_FIELDS = {
    "ip_proto": (10, 1),
    "ipv4_src": (11, 4),
    "ipv4_dst": (12, 4),
    "tcp_src": (13, 2),
    "tcp_dst": (14, 2),
    "udp_src": (15, 2),
    "udp_dst": (16, 2),
}


def _pad8(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 8)


def oxm_field_mask(name: str) -> bytes:
    """An OXM TLV naming a field to hash, its value all ones (the whole field)."""
    field, length = OXM_FIELDS[name]
    header = (OFPXMC_OPENFLOW_BASIC << 16) | (field << 9) | length
    return struct.pack("!I", header) + b"\xff" * length


def selection_method_property(fields, method: str = "hash", param: int = 0) -> bytes:
    """ntr_group_prop_selection_method: type, length, experimenter, exp_type, pad(4),
    method[16], param(8), then OXM TLVs; length excludes the padding to 8 bytes."""
    oxms = b"".join(oxm_field_mask(f) for f in fields)
    if len(method) >= 16:
        raise ValueError(f"selection method name too long: {method!r}")
    body = struct.pack("!IIxxxx16sQ", NTR_VENDOR_ID, NTRT_SELECTION_METHOD, method.encode(), param) + oxms
    return _pad8(struct.pack("!HH", OFPGPT15_EXPERIMENTER, 4 + len(body)) + body)


def output_action(port: int) -> bytes:
    return struct.pack("!HHIH6x", OFPAT_OUTPUT, 16, port, OFPCML_NO_BUFFER)


def bucket(bucket_id: int, port: int, weight: int = 1) -> bytes:
    """ofp15_bucket: len, action_array_len, bucket_id, actions, then the weight property."""
    actions = output_action(port)
    weight_prop = struct.pack("!HHH2x", OFPGBPT15_WEIGHT, 6, weight)  # length 6, padded to 8
    return struct.pack("!HHI", 8 + len(actions) + len(weight_prop), len(actions), bucket_id) + actions + weight_prop


def select_group_add(xid: int, group_id: int, ports, fields) -> bytes:
    """OFPT_GROUP_MOD (OpenFlow 1.5) adding a select group, one equal-weight bucket per port,
    hashing on ``fields``."""
    buckets = b"".join(bucket(i, p) for i, p in enumerate(ports))
    body = struct.pack("!HBxIH2xI", OFPGC_ADD, OFPGT_SELECT, group_id, len(buckets), OFPG15_BUCKET_ALL)
    body += buckets + selection_method_property(fields)
    return struct.pack("!BBHI", OFP15_VERSION, OFPT_GROUP_MOD, 8 + len(body), xid) + body
