import pytest

from testbed import units


@pytest.mark.parametrize("text,bps", [("400G", 400e9), ("800G", 800e9), ("25Gbps", 25e9), ("100M", 100e6),
                                      ("1.5T", 1.5e12), ("10 Mbit", 10e6), ("3.6T", 3.6e12), ("9600bps", 9600)])
def test_rates(text, bps):
    assert units.parse_rate_bps(text) == bps


@pytest.mark.parametrize("text,ns", [("1us", 1000), ("500ns", 500), ("2ms", 2_000_000), ("1.5s", 1_500_000_000),
                                     ("0us", 0), ("3\u00b5s", 3000)])
def test_durations(text, ns):
    assert units.parse_duration_ns(text) == ns


@pytest.mark.parametrize("text,nbytes", [("32MB", 32_000_000), ("100KB", 100_000), ("1MiB", 1_048_576),
                                         ("9000B", 9000), (4096, 4096), ("2GiB", 2 * 1024 ** 3)])
def test_sizes(text, nbytes):
    assert units.parse_size_bytes(text) == nbytes


def test_lengths_and_cable_delay():
    assert units.parse_length_m("100m") == 100
    assert units.parse_length_m("2km") == 2000
    assert units.cable_delay_ns(100) == 500  # 5 ns per metre of fibre


@pytest.mark.parametrize("parser,text", [(units.parse_rate_bps, "fast"), (units.parse_rate_bps, 400),
                                         (units.parse_rate_bps, "0G"), (units.parse_rate_bps, "400Q"),
                                         (units.parse_duration_ns, "5"), (units.parse_duration_ns, "-1us"),
                                         (units.parse_size_bytes, "12 parsecs"), (units.parse_length_m, True),
                                         (units.parse_rate_bps, "nanG")])
def test_rejects(parser, text):
    with pytest.raises(units.UnitError):
        parser(text)


def test_dilation_converts_rates_and_durations_not_bytes():
    d = units.Dilation(40000)
    assert d.rate_bps(400e9) == 10e6  # 400G at D=40000 is 10 Mbit/s (docs/architecture.md)
    assert d.duration_ns(1000) == 40_000_000  # 1 us of cable -> 40 ms
    assert d.real_duration_ns(d.duration_ns(123)) == pytest.approx(123)


@pytest.mark.parametrize("minimum,factor", [(0.5, 1), (1, 1), (1.1, 2), (64000, 100000), (20000, 20000),
                                            (20001, 50000), (3, 5)])
def test_nice_dilation(minimum, factor):
    assert units.Dilation.nice(minimum).factor == factor


def test_dilation_below_one_rejected():
    with pytest.raises(units.UnitError):
        units.Dilation(0.5)


def test_formatting():
    assert units.format_rate(400e9) == "400G"
    assert units.format_rate(4e6) == "4M"
    assert units.format_duration(1500) == "1.5us"
    assert units.format_size(100_000) == "100KB"


def test_a_dilation_reads_as_an_engineer_writes_it():
    assert [str(units.Dilation(f)) for f in (50000, 1100000, 2e6, 2.5, 1)] == ["50000", "1100000", "2000000", "2.5", "1"]
