"""Controller process: ``python -m testbed.controller --plan P --events E --port N``.

os-ken >= 4 ships no manager command, so this is the launcher: eventlet patching
first, then os-ken's configuration (OpenFlow listener on one explicit address, 127.0.0.1
unless a cluster's switches must reach it: never a wildcard) and the
AppManager running ``testbed.controller.app`` with os-ken's OpenFlow handler.
"""

from os_ken.lib import hub

hub.patch(thread=False)

import argparse  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402

from os_ken import cfg  # noqa: E402
from os_ken.base.app_manager import AppManager  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m testbed.controller")
    parser.add_argument("--plan", required=True, help="plan JSON (Plan.to_dict())")
    parser.add_argument("--events", required=True, help="JSON-lines file to append events to")
    parser.add_argument("--port", type=int, required=True, help="OpenFlow TCP port")
    parser.add_argument("--address", default="127.0.0.1",
                        help="the one address to listen on (checked by apply.processes.controller.check_listen_address)")
    parser.add_argument("--telemetry", default=None, help="folder for the telemetry JSON lines (off if unset)")
    parser.add_argument("--pins", default=None, help="the run's bpffs folder (marker maps: queue counters)")
    parser.add_argument("--queues-of", default=None,
                        help="comma-separated switches whose queues are on this machine (a cluster run; default all)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s controller %(name)s %(levelname)s %(message)s")
    from testbed.apply.processes.controller import check_listen_address

    cfg.CONF(args=["--ofp-listen-host", check_listen_address(args.address), "--ofp-tcp-listen-port", str(args.port)],
             project="os_ken")
    from testbed.controller import app

    app.SETTINGS.update(plan=args.plan, events=args.events, telemetry=args.telemetry, pins=args.pins,
                        queues_of=args.queues_of.split(",") if args.queues_of else None)
    AppManager.run_apps(["testbed.controller.app"])


if __name__ == "__main__":
    main()
