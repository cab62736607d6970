"""Scenarios: YAML in real units -> validated, frozen objects (no root needed).

A scenario file (``scenarios/*.yaml``) names a topology (``topologies/*.yaml``), may
override any of its fields under ``fabric:``, and sets queue and run options. ``--set
PATH=VALUE`` overrides apply to the resolved document before validation, so they are
checked exactly like the files. Every problem is reported with the file (or ``--set``) it
came from and its YAML path; all problems are collected before failing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from testbed.config.events import validate_events
from testbed.config.jobs import validate_jobs
from testbed.config.workload import validate_workload
from testbed import units
from testbed.config.checker import Checker, show
from testbed.config.source import NAME_RE, Origins, resolve
from testbed.errors import ConfigError


KINDS = ("leaf-spine", "top-of-rack", "rail-optimised")
DATAPATHS = ("auto", "kernel", "user")
ROUTINGS = ("ecmp", "adaptive")
MAX_ADAPTIVE_CHOICES = 16  # candidate ports per adaptive decision (MAX_CHOICES in bpf/marker.c)
# Address plan limits: leaf L, host n -> 10.0.L.n; switch names like spine12-eth130 must fit IFNAMSIZ.
MAX_LEAVES = 250
MAX_HOSTS_PER_LEAF = 250
MAX_SPINES = 64
MAX_GPUS = 1024
MAX_DILATION = 1e7
# report.html's plot sections, in their default order (``report: {first: [...]}`` moves some up)
REPORT_SECTIONS = ("throughput", "utilisation", "queues", "timeline", "counters", "collectives", "dcqcn", "cnps")

# -- frozen result objects -------------------------------------------------------------------


@dataclass(frozen=True)
class LinkSpec:
    """A class of links: rate in real bits/s and cable length (propagation delay follows)."""

    rate_bps: int
    cable_m: float

    @property
    def delay_ns(self) -> int:
        return units.cable_delay_ns(self.cable_m)


@dataclass(frozen=True)
class UplinkSpec:
    count: int
    link: LinkSpec


@dataclass(frozen=True)
class LeafSpec:
    """One leaf: how many GPU hosts hang off it and its uplinks to the spines."""

    hosts: int
    uplinks: UplinkSpec


@dataclass(frozen=True)
class Fabric:
    kind: str
    spines: int
    leaves: tuple  # of LeafSpec
    host_link: LinkSpec
    gpus_per_server: int
    nvlink_rate_bps: int
    # rail-optimised only: GPU k of every server sits on rail leaf k
    servers: int
    # ecmp: select groups hash the 5-tuple; adaptive: each data packet to the least
    # occupied shortest-path port (bpf/marker.c, "Adaptive routing")
    routing: str = "ecmp"


@dataclass(frozen=True)
class Ecn:
    kmin_bytes: int | None
    kmax_bytes: int | None
    pmax: float | None


@dataclass(frozen=True)
class Pfc:
    xoff_bytes: int | None
    xon_bytes: int | None
    headroom_bytes: int | None


@dataclass(frozen=True)
class Queues:
    """Switch egress queue settings. ``None`` values are derived from link rate and cable
    length by the queues stage; ``ecn``/``pfc`` of ``None`` mean the feature is off."""

    buffer_bytes: int | None
    ecn: Ecn | None
    pfc: Pfc | None
    trim: bool = False  # where the data class would drop, cut the packet to its headers instead


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    source: str  # file the scenario came from
    topology_source: str
    fabric: Fabric
    queues: Queues
    traffic: str | None  # the workload file, or None: the run only proves reachability
    workload: object  # traffic.Workload or None
    dilation: float | None  # None = auto
    datapath: str
    seed: int
    resolved: dict = field(compare=False, repr=False)  # the document as validated (for the manifest)
    origins: Origins | None = field(default=None, compare=False, repr=False)  # where each value came from
    events: tuple = ()  # config.events.Event: links down and up while it trains
    jobs: tuple = ()  # config.jobs.Job: several jobs on the fabric (then ``workload`` is None)
    cluster: tuple = ()  # servers to run across: this machine's address first (docs/cluster.md)

    def where(self, path: tuple) -> str:
        """``file: yaml.path`` (or ``--set ...``) of a value, for problems found after validation."""
        return self.origins.locate(path) if self.origins else ".".join(map(str, path))


# -- loading and validation ----------------------------------------------------------------


def load(ref: str | None = None, overrides: list[str] | tuple = ()) -> Scenario:
    """Load a scenario by name or path (a topology file is accepted too), apply ``--set``
    overrides and validate. Raises ConfigError listing every problem."""
    resolved, origins, label, topo_label = resolve(ref, overrides)
    return _validate(resolved, origins, source=label, topology_source=topo_label)


_SCENARIO_KEYS = ("name", "description", "topology", "fabric", "queues", "traffic", "workload", "dilation",
                  "datapath", "seed", "report", "events", "jobs", "cluster")
_FABRIC_KEYS = {
    "leaf-spine": ("kind", "description", "spines", "leaves", "hosts_per_leaf", "gpus_per_server",
                   "host_link", "uplinks", "nvlink", "routing"),
    "top-of-rack": ("kind", "description", "spines", "servers", "gpus_per_server", "servers_per_leaf",
                    "host_link", "uplinks", "nvlink", "routing"),
    "rail-optimised": ("kind", "description", "spines", "servers", "gpus_per_server",
                       "host_link", "uplinks", "nvlink", "routing"),
}
_LINK_KEYS = ("rate", "cable")
_UPLINK_KEYS = ("count", "rate", "cable")
_LEAF_KEYS = ("hosts", "uplinks")


def _validate(doc: dict, origins: Origins, source: str, topology_source: str) -> Scenario:
    c = Checker(origins)
    c.mapping(doc, (), _SCENARIO_KEYS)
    name = doc.get("name")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        c.problem(("name",), f"expected 1-32 characters of a-z, 0-9, - and _ starting with a letter or digit, "
                             f"got {show(name)}")
    description = doc.get("description") or ""
    if not isinstance(description, str):
        c.problem(("description",), f"expected text, got {show(description)}")
        description = ""
    fabric = _validate_fabric(c, doc.get("fabric"), ("fabric",))
    queues = _validate_queues(c, doc.get("queues"), ("queues",))
    traffic = doc.get("traffic")
    workload = None
    if doc.get("workload") is not None:
        gpus = sum(leaf.hosts for leaf in fabric.leaves) if fabric else None
        workload = validate_workload(c, doc["workload"], ("workload",), gpus)
    jobs = ()
    if doc.get("jobs") is not None:
        if doc.get("workload") is not None:
            c.problem(("jobs",), "give either jobs or traffic/workload, not both")
        jobs = validate_jobs(c, doc["jobs"], ("jobs",), sum(leaf.hosts for leaf in fabric.leaves)
                                   if fabric else None)
    dilation = doc.get("dilation", "auto")
    if isinstance(dilation, str) and dilation != "auto":
        try:  # YAML reads 1e7 (no dot, no sign) as text
            dilation = float(dilation)
        except ValueError:
            pass
    if dilation == "auto":
        dilation = None
    elif (isinstance(dilation, bool) or not isinstance(dilation, (int, float)) or not math.isfinite(dilation)
          or not 1 <= dilation <= MAX_DILATION):
        c.problem(("dilation",), f"expected 'auto' or a number from 1 to {MAX_DILATION:g} (at {MAX_DILATION:g}, one "
                                 f"microsecond of the fabric takes {MAX_DILATION / 1e6:g} s here), got {show(dilation)}")
        dilation = None
    datapath = c.choice(doc, "datapath", (), DATAPATHS, "auto")
    seed = c.integer(doc, "seed", (), default=1, minimum=0, maximum=2 ** 31 - 1)
    _validate_report(c, doc.get("report"), ("report",))
    cluster = _validate_cluster(c, doc.get("cluster"), ("cluster",))
    events = validate_events(c, doc.get("events"), ("events",))
    if events and workload is None and not jobs:
        c.problem(("events",), "events happen while the fabric trains: give the scenario a workload (traffic:)")
    if events and fabric is not None and fabric.routing == "adaptive":
        c.problem(("events",), "link events with fabric.routing: adaptive are not built (the decision tables "
                               "would keep choosing a dead port); use ecmp")
    if c.problems:
        raise ConfigError(c.problems)
    return Scenario(name=name, description=description.strip(), source=source, topology_source=topology_source,
                    fabric=fabric, queues=queues, traffic=traffic, workload=workload, dilation=dilation, datapath=datapath,
                    seed=seed, resolved=doc, origins=origins, events=events, jobs=jobs, cluster=cluster)


_SERVER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:_-]{0,252}")


def _validate_cluster(c: Checker, doc, path: tuple) -> tuple:
    """``cluster: [HERE, SERVER, ...]``: this machine's address on the servers' network, then
    each other server (an ssh target: a host name or address); ``run --cluster`` overrides it."""
    if doc is None:
        return ()
    if not isinstance(doc, list) or len(doc) < 2:
        c.problem(path, f"expected a list of at least two servers (this machine's address first, then each other "
                        f"server), got {show(doc)}")
        return ()
    out = []
    for i, server in enumerate(doc):
        if not isinstance(server, str) or not _SERVER_RE.fullmatch(server):
            c.problem((*path, i), f"expected a host name or address, got {show(server)}")
        elif server in out:
            c.problem((*path, i), f"{server} is listed twice; each server runs its share once")
        else:
            out.append(server)
    return tuple(out)


def _validate_report(c: Checker, doc, path: tuple):
    """``report: {first: [queues, timeline]}``: the report's plots a lab talks about, shown first."""
    if doc is None:
        return
    doc = c.mapping(doc, path, ("first",))
    first = doc.get("first", [])
    if not isinstance(first, list):
        c.problem(path + ("first",), f"expected a list of plot names such as [queues, timeline], got {show(first)}")
        return
    for i, key in enumerate(first):
        if key not in REPORT_SECTIONS:
            c.problem(path + ("first", i), f"expected one of {', '.join(REPORT_SECTIONS)}, got {show(key)}")


def _link(c: Checker, doc, path: tuple, keys=_LINK_KEYS, default_cable="3m"):
    doc = c.mapping(doc, path, keys)
    rate = c.unit(doc, "rate", path, units.parse_rate_bps)
    cable = c.unit(doc, "cable", path, units.parse_length_m, default=default_cable)
    if rate is None or cable is None:
        return None
    return LinkSpec(rate_bps=rate, cable_m=cable)


def _uplinks(c: Checker, doc, path: tuple, spines: int | None, defaults: dict | None = None):
    merged = dict(defaults or {})
    if doc is not None and not isinstance(doc, dict):
        c.problem(path, f"expected a mapping with count, rate, cable, got {show(doc)}")
        return None
    merged.update(doc or {})
    c.mapping(merged, path, _UPLINK_KEYS)
    if spines == 0:
        if merged.get("count") not in (None, 0):
            c.problem(path + ("count",), "a fabric without spines has no uplinks; set spines >= 1")
            return None
        return UplinkSpec(count=0, link=LinkSpec(rate_bps=1, cable_m=0.0))
    count = c.integer(merged, "count", path, default=spines, minimum=1, maximum=256)
    link = _link(c, {k: v for k, v in merged.items() if k != "count"}, path, default_cable="100m")
    if count is None or link is None or spines is None:
        return None
    if count % spines:
        c.problem(path + ("count",), f"expected a multiple of spines ({spines}) so every spine gets the same "
                                     f"number of links, got {count}")
        return None
    return UplinkSpec(count=count, link=link)


def _validate_fabric(c: Checker, doc, path: tuple) -> Fabric | None:
    if not isinstance(doc, dict):
        c.problem(path, f"expected a topology mapping, got {show(doc)}")
        return None
    kind = doc.get("kind")
    if kind not in KINDS:
        c.problem(path + ("kind",), f"expected one of {', '.join(KINDS)}, got {show(kind)}")
        return None
    c.mapping(doc, path, _FABRIC_KEYS[kind])
    spines = c.integer(doc, "spines", path, minimum=0, maximum=MAX_SPINES)
    host_link = _link(c, doc.get("host_link"), path + ("host_link",))
    gpus_per_server = c.integer(doc, "gpus_per_server", path, default=1, minimum=1, maximum=16)
    nvlink = c.mapping(doc.get("nvlink"), path + ("nvlink",), ("rate",))
    nvlink_rate = c.unit(nvlink, "rate", path + ("nvlink",), units.parse_rate_bps, default="3.6T")
    routing = c.choice(doc, "routing", path, ROUTINGS, "ecmp")
    uplink_doc = doc.get("uplinks")
    leaves: list[LeafSpec] = []
    servers = 0
    if kind == "leaf-spine":
        hosts_per_leaf = c.integer(doc, "hosts_per_leaf", path, minimum=1, maximum=MAX_HOSTS_PER_LEAF)
        raw_leaves = doc.get("leaves")
        if isinstance(raw_leaves, list):
            entries = raw_leaves
            if not 1 <= len(entries) <= MAX_LEAVES:
                c.problem(path + ("leaves",), f"expected 1 to {MAX_LEAVES} leaves, got {len(entries)}")
        else:
            count = c.integer(doc, "leaves", path, minimum=1, maximum=MAX_LEAVES)
            entries = [None] * (count or 0)
        base_uplinks = _uplinks(c, uplink_doc, path + ("uplinks",), spines)
        for i, entry in enumerate(entries):
            here = path + ("leaves", i)
            if entry is None:
                hosts, up = hosts_per_leaf, base_uplinks
            else:
                entry = c.mapping(entry, here, _LEAF_KEYS)
                hosts = c.integer(entry, "hosts", here, default=hosts_per_leaf, minimum=1,
                                  maximum=MAX_HOSTS_PER_LEAF)
                up = (_uplinks(c, entry["uplinks"], here + ("uplinks",), spines, defaults=uplink_doc)
                      if "uplinks" in entry else base_uplinks)
            if hosts is not None and gpus_per_server and hosts % gpus_per_server:
                c.problem(here if entry is not None else path + ("hosts_per_leaf",),
                          f"{hosts} hosts do not divide into servers of gpus_per_server={gpus_per_server}")
            if hosts is not None and up is not None:
                leaves.append(LeafSpec(hosts=hosts, uplinks=up))
        if len(leaves) == len(entries) and gpus_per_server:
            servers = sum(leaf.hosts for leaf in leaves) // gpus_per_server
    else:
        servers = c.integer(doc, "servers", path, minimum=1, maximum=MAX_HOSTS_PER_LEAF)
        up = _uplinks(c, uplink_doc, path + ("uplinks",), spines)
        if kind == "top-of-rack":
            per_leaf = c.integer(doc, "servers_per_leaf", path, minimum=1, maximum=MAX_HOSTS_PER_LEAF)
            if servers and per_leaf and gpus_per_server:
                if servers % per_leaf:
                    c.problem(path + ("servers_per_leaf",),
                              f"expected a divisor of servers ({servers}), got {per_leaf}")
                elif per_leaf * gpus_per_server > MAX_HOSTS_PER_LEAF:
                    c.problem(path + ("servers_per_leaf",), f"{per_leaf} servers x {gpus_per_server} GPUs is more "
                                                            f"than {MAX_HOSTS_PER_LEAF} hosts on one leaf")
                elif up is not None:
                    leaves = [LeafSpec(hosts=per_leaf * gpus_per_server, uplinks=up)] * (servers // per_leaf)
        elif servers and gpus_per_server and up is not None:
            leaves = [LeafSpec(hosts=servers, uplinks=up)] * gpus_per_server
    if spines == 0 and len(leaves) > 1:
        c.problem(path + ("spines",), f"{len(leaves)} leaves need at least one spine to reach each other")
    if leaves and sum(leaf.hosts for leaf in leaves) > MAX_GPUS:
        c.problem(path, f"{sum(leaf.hosts for leaf in leaves)} GPUs is more than the {MAX_GPUS} supported")
    if routing == "adaptive" and spines:
        for i, leaf in enumerate(leaves):
            if leaf.uplinks.count > MAX_ADAPTIVE_CHOICES:  # a leaf's choice is among all its uplinks
                c.problem(path + ("routing",), f"adaptive routing chooses among at most {MAX_ADAPTIVE_CHOICES} ports "
                                               f"per hop; leaf {i + 1} has {leaf.uplinks.count} uplinks")
                break
    if c.problems or spines is None or host_link is None or gpus_per_server is None or nvlink_rate is None:
        return None
    return Fabric(kind=kind, spines=spines, leaves=tuple(leaves), host_link=host_link,
                  gpus_per_server=gpus_per_server, nvlink_rate_bps=nvlink_rate, servers=servers,
                  routing=routing or "ecmp")


def _off(value) -> bool:
    return value is False or value == "off"


def _validate_queues(c: Checker, doc, path: tuple) -> Queues | None:
    doc = c.mapping(doc, path, ("buffer", "ecn", "pfc", "trim"))
    trim = doc.get("trim", "off")
    if trim not in (True, False, "on", "off"):
        c.problem(path + ("trim",), f"expected on or off, got {show(trim)}")
    buffer = c.unit(doc, "buffer", path, units.parse_size_bytes, required=False)
    ecn = pfc = None
    raw_ecn = doc.get("ecn", {})
    if not _off(raw_ecn):
        here = path + ("ecn",)
        e = c.mapping(raw_ecn, here, ("kmin", "kmax", "pmax"))
        kmin = c.unit(e, "kmin", here, units.parse_size_bytes, required=False)
        kmax = c.unit(e, "kmax", here, units.parse_size_bytes, required=False)
        pmax = e.get("pmax")
        if pmax is not None and (isinstance(pmax, bool) or not isinstance(pmax, (int, float)) or not 0 < pmax <= 1):
            c.problem(here + ("pmax",), f"expected a probability in (0, 1], got {show(pmax)}")
            pmax = None
        if kmin is not None and kmax is not None and kmin > kmax:
            c.problem(here + ("kmin",), f"kmin ({units.format_size(kmin)}) must not exceed kmax "
                                        f"({units.format_size(kmax)})")
        if kmax is not None and buffer is not None and kmax > buffer:
            c.problem(here + ("kmax",), f"kmax ({units.format_size(kmax)}) must not exceed the buffer "
                                        f"({units.format_size(buffer)})")
        ecn = Ecn(kmin_bytes=kmin, kmax_bytes=kmax, pmax=pmax)
    raw_pfc = doc.get("pfc", {})
    if not _off(raw_pfc):
        here = path + ("pfc",)
        p = c.mapping(raw_pfc, here, ("xoff", "xon", "headroom"))
        xoff = c.unit(p, "xoff", here, units.parse_size_bytes, required=False)
        xon = c.unit(p, "xon", here, units.parse_size_bytes, required=False)
        headroom = c.unit(p, "headroom", here, units.parse_size_bytes, required=False)
        if xoff is not None and xon is not None and xon > xoff:
            c.problem(here + ("xon",), f"xon ({units.format_size(xon)}) must not exceed xoff "
                                       f"({units.format_size(xoff)})")
        if buffer is not None and xoff is not None and (headroom or 0) + xoff > buffer:
            c.problem(here + ("xoff",), f"xoff + headroom ({units.format_size(xoff + (headroom or 0))}) must fit "
                                        f"in the buffer ({units.format_size(buffer)})")
        pfc = Pfc(xoff_bytes=xoff, xon_bytes=xon, headroom_bytes=headroom)
    return Queues(buffer_bytes=buffer, ecn=ecn, pfc=pfc, trim=trim in (True, "on"))
