import struct

from testbed.apply import probe


def test_echo_request_golden_bytes():
    # type 8, code 0, checksum 0xf288 (worked out by hand: the one's complement of the
    # one's complement sum of the 16-bit words, checksum field 0, the odd last byte padded),
    # id 0x1234, seq 1, payload "testbed-probe"
    golden = bytes.fromhex("0800" "f288" "1234" "0001") + b"testbed-probe"
    assert probe.echo_request(0x1234, 1) == golden
    assert probe.checksum(golden) == 0  # a valid ICMP checksum sums to zero


def test_checksum_rfc1071_example():
    # RFC 1071 section 3 example words: 0001 f203 f4f5 f6f7 -> sum ddf2, checksum 220d
    assert probe.checksum(bytes.fromhex("0001f203f4f5f6f7")) == 0x220D


def test_parse_reply_reads_ttl_and_source():
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 41, 0, 0, 61, 1, 0, bytes([10, 0, 2, 1]), bytes([10, 0, 1, 1]))
    icmp = struct.pack("!BBHHH", 0, 0, 0, 0x1234, 1) + b"testbed-probe"
    assert probe.parse_reply(ip + icmp, 0x1234) == ("10.0.2.1", 61)
    assert probe.parse_reply(ip + icmp, 0x9999) is None  # someone else's echo
    request = struct.pack("!BBHHH", 8, 0, 0, 0x1234, 1)
    assert probe.parse_reply(ip + request, 0x1234) is None  # not a reply
