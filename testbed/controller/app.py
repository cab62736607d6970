"""The os-ken application: a thin adapter between OpenFlow and ``routing.FabricController``.

It translates the pure controller's messages to OpenFlow 1.5 (OVS takes a
group's hash fields only in 1.5; the switches also speak 1.3, so engineers'
``ovs-ofctl -O OpenFlow13`` commands work) and writes what
happened as JSON lines to the events file the run watches. Any exception in a
handler is written as a ``fatal`` event and ends the process with status 3: os-ken
would otherwise log it and carry on with a half-programmed fabric.
"""

from __future__ import annotations

import functools
import json
import os
import time
import traceback

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.ofproto import ofproto_v1_5

from os_ken.lib import hub

from testbed.wire import openflow
from testbed.controller import routing, telemetry
from testbed.controller.collector import Collector
from testbed.model.plan_file import PlanFile

# Set by testbed.controller.__main__ before the app is instantiated.
SETTINGS: dict = {}
FATAL_EXIT = 3


class Events:
    """Append-only JSON lines, flushed per event so the run (and a crash) sees them."""

    def __init__(self, path: str):
        self._file = open(path, "a", buffering=1)

    def write(self, event: str, **fields):
        fields.update(event=event, t_mono=time.monotonic(), t_wall=time.time())
        self._file.write(json.dumps(fields) + "\n")
        self._file.flush()


def fatal_on_error(handler):
    """End the controller loudly on any handler exception."""

    @functools.wraps(handler)
    def wrapper(self, ev):
        try:
            return handler(self, ev)
        except Exception as exc:  # noqa: BLE001 - every failure must end the process
            self.event_log.write("fatal", handler=handler.__name__, error=f"{type(exc).__name__}: {exc}",
                              traceback=traceback.format_exc())
            os._exit(FATAL_EXIT)

    return wrapper


class TestbedController(app_manager.OSKenApp):
    OFP_VERSIONS = [ofproto_v1_5.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.plan = plan = PlanFile.load(SETTINGS["plan"])
        self.event_log = Events(SETTINGS["events"])
        self.logic = routing.FabricController(plan)
        self.datapaths = {}
        self.event_log.write("started", pid=os.getpid(), switches=len(self.logic.switches))
        self.collector = Collector(SETTINGS["telemetry"], plan, SETTINGS.get("pins"), SETTINGS.get(
            "queues_of")) if SETTINGS.get("telemetry") else None
        self.poller = None

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    @fatal_on_error
    def on_features(self, ev):
        dp = ev.msg.datapath
        self.datapaths[dp.id] = dp
        self.event_log.write("switch_connected", dpid=dp.id)
        self._send(dp, self.logic.switch_connected(dp.id, time.monotonic()))

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    @fatal_on_error
    def on_barrier(self, ev):
        for out in self.logic.barrier_reply(ev.msg.datapath.id, time.monotonic()):
            if isinstance(out, routing.RerouteDone):
                self.event_log.write("reroute_done", switches=list(out.switches), flows=out.flows,
                                     groups=out.groups, seconds=out.seconds, down=list(out.down))
                continue
            self.event_log.write("switch_ready", dpid=out.dpid, name=out.name, flows=out.flows,
                              groups=out.groups, seconds=out.seconds)
        if self.logic.all_ready:
            self.event_log.write("fabric_ready")
            if self.collector is not None and self.poller is None:
                interval_ns = self.plan.telemetry.interval_emulated_ns
                self.poller = telemetry.Poller(interval_ns, time.monotonic_ns())
                hub.spawn(self._collect)

    def _collect(self):
        """Every interval: ask every switch for its port counters and its ECN counting
        flows (replies: on_port_stats, on_flow_stats; OVS answers OpenFlow 1.5 flow statistics as FLOW_DESC only), and read the queues."""
        try:
            while True:
                now = time.monotonic_ns()
                if self.poller.due(now):
                    for dp in list(self.datapaths.values()):
                        ofp, parser = dp.ofproto, dp.ofproto_parser
                        dp.send_msg(parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY))
                        dp.send_msg(parser.OFPFlowDescStatsRequest(dp, 0, routing.COUNT_TABLE, ofp.OFPP_ANY,
                                                               ofp.OFPG_ANY, 0, 0, parser.OFPMatch()))
                    queues = self.collector.poll_queues(now)
                    self.collector.poll_done(now, self.poller.skipped, queues)
                hub.sleep(self.poller.wait_s(time.monotonic_ns()))
        except Exception as exc:  # noqa: BLE001 - a dead collector must end the run loudly
            self.event_log.write("fatal", handler="_collect", error=f"{type(exc).__name__}: {exc}",
                                 traceback=traceback.format_exc())
            os._exit(FATAL_EXIT)

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    @fatal_on_error
    def on_port_stats(self, ev):
        name = self.logic.switches[ev.msg.datapath.id].name
        self.collector.write("ports", telemetry.port_records(time.monotonic_ns(), name, ev.msg.body))

    @set_ev_cls(ofp_event.EventOFPFlowDescStatsReply, MAIN_DISPATCHER)
    @fatal_on_error
    def on_flow_stats(self, ev):
        name = self.logic.switches[ev.msg.datapath.id].name
        self.collector.write("ecn", telemetry.ecn_records(time.monotonic_ns(), name, ev.msg.body))

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    @fatal_on_error
    def on_port_status(self, ev):
        """A port went down or came back (a pulled cable: ``testbed.apply.events``): reroute."""
        msg = ev.msg
        ofp, desc = msg.datapath.ofproto, msg.desc
        live = not (desc.state & ofp.OFPPS_LINK_DOWN) and not (desc.config & ofp.OFPPC_PORT_DOWN)
        now = time.monotonic()
        changes = self.logic.port_status(msg.datapath.id, desc.port_no, live, now)
        self.event_log.write("port_status", dpid=msg.datapath.id, port=desc.port_no, live=live,
                             reroute=[self.logic.switches[dp].name for dp, _ in changes])
        for dpid, msgs in changes:
            self._send(self.datapaths[dpid], msgs)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    @fatal_on_error
    def on_error(self, ev):
        msg = ev.msg
        raise RuntimeError(f"switch {msg.datapath.id:#x} rejected a message: type={msg.type} code={msg.code} "
                           f"data={bytes(msg.data)[:64].hex()}")

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    @fatal_on_error
    def on_dead(self, ev):
        dp = ev.datapath
        if dp.id is not None:
            self.datapaths.pop(dp.id, None)
            self.logic.switch_disconnected(dp.id, time.monotonic())
            self.event_log.write("switch_disconnected", dpid=dp.id)

    def _send(self, dp, msgs):
        ofp, parser = dp.ofproto, dp.ofproto_parser
        for m in msgs:
            if isinstance(m, routing.ClearSwitch):
                dp.send_msg(parser.OFPFlowMod(dp, command=ofp.OFPFC_DELETE, table_id=ofp.OFPTT_ALL,
                                              out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY))
                dp.send_msg(parser.OFPGroupMod(dp, command=ofp.OFPGC_DELETE, group_id=ofp.OFPG_ALL))
            elif isinstance(m, routing.GroupAdd):
                dp.send(openflow.select_group_add(self._next_xid(dp), m.group_id, m.ports, m.hash_fields))
            elif isinstance(m, routing.FlowAdd):
                actions = [self._action(parser, a) for a in m.actions]
                inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)] if actions else []
                if m.goto is not None:
                    inst.append(parser.OFPInstructionGotoTable(m.goto))
                dp.send_msg(parser.OFPFlowMod(dp, table_id=m.table, priority=m.priority,
                                              match=parser.OFPMatch(**dict(m.match)), instructions=inst))
            elif isinstance(m, routing.Barrier):
                dp.send_msg(parser.OFPBarrierRequest(dp))
            else:
                raise TypeError(f"unknown controller message {m!r}")

    @staticmethod
    def _next_xid(dp) -> int:
        """An xid for a message built outside os-ken (same counter os-ken's set_xid uses)."""
        dp.xid = (dp.xid + 1) & dp.ofproto.MAX_XID
        return dp.xid

    @staticmethod
    def _action(parser, action):
        kind = action[0]
        if kind == "output":
            return parser.OFPActionOutput(action[1])
        if kind == "group":
            return parser.OFPActionGroup(action[1])
        if kind == "dec_nw_ttl":
            return parser.OFPActionDecNwTtl()
        if kind == "pop_vlan":
            return parser.OFPActionPopVlan()
        raise TypeError(f"unknown action {action!r}")
