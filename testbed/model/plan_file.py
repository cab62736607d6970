"""``plan.json`` read back as typed objects: what the run's child processes (GPU agents, the
PFC process, the controller) get instead of string keys.

The run writes ``plan.json`` once (``Plan.to_dict``) and every process reads that one file;
``PlanFile.from_dict(plan.to_dict())`` gives back the same switches, GPUs, servers, links,
routes, queues and telemetry objects the run planned with, and the training section with its
``Transport``. What is not in the file is not here: the scenario is its name only (the
processes never see the YAML), and the GPUs' ops stay the JSON lists each agent runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from testbed import units
from testbed.model.plan import Host, Link, Server, Switch, Telemetry
from testbed.model.queues import PortQueue
from testbed.model.routing import Route
from testbed.model.training import Transport

# what Plan.to_dict adds to an object's fields (properties, for readers of the JSON)
_DERIVED = {"dpid_hex", "a_intf", "b_intf"}


def _typed(cls, d: dict, **fix):
    """``cls`` from its JSON form: the derived keys dropped, ``fix`` (lists back to tuples) applied."""
    return cls(**{k: v for k, v in d.items() if k not in _DERIVED} | fix)


@dataclass(frozen=True)
class TrainingFile:
    """``plan.json``'s training section: what every agent runs with and each GPU's ops
    (``schedule.to_json``: a list of op dicts per GPU)."""

    iterations: int
    ideal: dict
    transport: Transport
    ranks: dict
    collectives: tuple
    ops: dict
    jobs: dict

    @classmethod
    def from_dict(cls, d: dict) -> "TrainingFile":
        return cls(iterations=d["iterations"], ideal=d["ideal"], transport=Transport.from_dict(d["transport"]),
                   ranks=d["ranks"], collectives=tuple(d["collectives"]), ops=d["ops"], jobs=d.get("jobs", {}))


@dataclass(frozen=True)
class PlanFile:
    """A run's ``plan.json``, typed (see the module docstring)."""

    scenario: str
    routing: str  # ecmp | adaptive
    dilation: units.Dilation
    switches: tuple
    hosts: tuple
    servers: tuple
    links: tuple
    routes: tuple
    queues: tuple
    training: TrainingFile | None
    telemetry: Telemetry | None
    link_delay: bool

    @classmethod
    def from_dict(cls, d: dict) -> "PlanFile":
        return cls(
            scenario=d["scenario"], routing=d["routing"], dilation=units.Dilation.of(d["dilation"]),
            switches=tuple(_typed(Switch, s) for s in d["switches"]),
            hosts=tuple(_typed(Host, h) for h in d["hosts"]),
            servers=tuple(_typed(Server, s, gpus=tuple(s["gpus"])) for s in d["servers"]),
            links=tuple(_typed(Link, lk) for lk in d["links"]),
            routes=tuple(_typed(Route, r, ports=tuple(r["ports"])) for r in d["routes"]),
            queues=tuple(PortQueue.from_dict(q) for q in d["queues"]),
            training=TrainingFile.from_dict(d["training"]) if d.get("training") else None,
            telemetry=_typed(Telemetry, d["telemetry"]) if d.get("telemetry") else None,
            link_delay=d["link_delay"])

    @classmethod
    def load(cls, path) -> "PlanFile":
        return cls.from_dict(json.loads(Path(path).read_text()))

    @cached_property
    def by_name(self) -> dict:
        """GPU name -> Host."""
        return {h.name: h for h in self.hosts}

    def host(self, name: str) -> Host:
        return self.by_name[name]

    @cached_property
    def fabric_links(self) -> tuple:
        """The links switches forward over (NVLink excluded), as ``Plan.fabric_links``."""
        return tuple(link for link in self.links if link.kind != "nvlink")
