"""Run the endpoint in the foreground for the local sandbox: ``python -m sweeper.sandbox.pulsar_endpoint``."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from .admin import AdminServer
from .server import PulsarEndpoint


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Test/sandbox Pulsar endpoint . Not for production.")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=6650)
    parser.add_argument("--persist-latency-ms", type=float, default=0.0,
                        help="hold send receipts this long, modelling a cluster's journal fsync and replication")
    parser.add_argument("--admin-port", type=int, default=0, help="also serve the admin REST sliver on this port")
    parser.add_argument(
        "--partitioned", action="append", default=[], metavar="TOPIC=N", help="create a partitioned topic"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    ep = PulsarEndpoint(args.data_dir, host=args.host, port=args.port, persist_latency_ms=args.persist_latency_ms)
    for spec in args.partitioned:
        topic, _, n = spec.rpartition("=")
        ep.create_partitioned_topic(topic, int(n))
    ep.start()
    admin = AdminServer(ep, host=args.host, port=args.admin_port).start() if args.admin_port else None
    print(ep.service_url, admin.url if admin else "", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if admin:
            admin.stop()
        ep.stop()


if __name__ == "__main__":
    main()
