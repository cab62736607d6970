"""OpenFlow 1.5 select-group with a hash selection method: golden bytes, decoded by OVS itself."""

import shutil
import subprocess

import pytest

from testbed.wire import openflow as ofwire
from testbed.controller import routing

FIELDS = ("ipv4_src", "ipv4_dst", "ip_proto", "udp_src", "udp_dst")
# header | command ADD, type SELECT, group 1, bucket array 64 bytes, command_bucket_id ALL
# | 2 buckets: len 32, actions 16, id; output:port; weight property (type 0, len 6, weight 1)
# | NTR selection method property: 0xffff, len 73, vendor 0x154d, type 1, "hash", param 0, 5 OXM fields
GOLDEN = bytes.fromhex(
    "060f00a800000007" "0000010000000001" "00400000ffffffff"
    "0020001000000000" "0000001000000005" "ffff000000000000" "0000000600010000"
    "0020001000000001" "0000001000000006" "ffff000000000000" "0000000600010000"
    "ffff00490000154d" "0000000100000000" "6861736800000000" "0000000000000000" "0000000000000000"
    "80001604ffffffff" "80001804ffffffff" "80001401ff" "80001e02ffff" "80002002ffff" "00000000000000")


def test_select_group_golden_bytes():
    assert ofwire.select_group_add(7, 1, [5, 6], FIELDS) == GOLDEN
    assert len(GOLDEN) % 8 == 0


def test_oxm_field_headers():
    assert ofwire.oxm_field_mask("udp_src") == bytes.fromhex("80001e02ffff")  # class 0x8000, field 15, len 2
    assert ofwire.oxm_field_mask("ipv4_dst") == bytes.fromhex("80001804ffffffff")


@pytest.mark.skipif(shutil.which("ovs-ofctl") is None, reason="needs ovs-ofctl (Open vSwitch)")
def test_ovs_decodes_our_group_mod():
    msg = ofwire.select_group_add(9, 3, [5, 6, 7, 8], routing.HASH_FIELDS)
    out = subprocess.run(["ovs-ofctl", "ofp-print", msg.hex()], capture_output=True, text=True, check=True,
                         timeout=30).stdout
    assert "decode error" not in out
    assert ("ADD group_id=3,type=select,selection_method=hash,"
            "fields(ip_src,ip_dst,nw_proto,tcp_src,tcp_dst,udp_src,udp_dst),"
            "bucket=bucket_id:0,actions=output:5,bucket=bucket_id:1,actions=output:6,"
            "bucket=bucket_id:2,actions=output:7,bucket=bucket_id:3,actions=output:8") in out
