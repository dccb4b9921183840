"""Run the endpoint in the foreground for the local sandbox: ``python -m harness.sandbox.pulsar_endpoint``."""

from __future__ import annotations

import argparse
import contextlib
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
    parser.add_argument("--register-zookeeper", default="", metavar="HOSTS",
                        help="register as a live broker under /loadbalance/brokers in this ZooKeeper, as brokers do")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    ep = PulsarEndpoint(args.data_dir, host=args.host, port=args.port, persist_latency_ms=args.persist_latency_ms)
    for spec in args.partitioned:
        topic, _, n = spec.rpartition("=")
        ep.create_partitioned_topic(topic, int(n))
    ep.start()
    admin = AdminServer(ep, host=args.host, port=args.admin_port).start() if args.admin_port else None
    registration = _register(args.register_zookeeper, ep.service_url, admin.url if admin else "") \
        if args.register_zookeeper else None
    print(ep.service_url, admin.url if admin else "", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if registration is not None:
            registration.stop()
            registration.close()
        if admin:
            admin.stop()
        ep.stop()


def _register(hosts: str, service_url: str, web_url: str):  # -> KazooClient
    """An ephemeral znode under /loadbalance/brokers, alive with this process's session (as a broker's is).

    A registration under this name left by an earlier run of the sandbox (ZooKeeper restores sessions from its
    data directory and restarts their timers, so it outlives a restart) is replaced, as a restarted broker
    replaces its own (Pulsar's ResourceLockImpl revalidates a lock whose value is its own by deleting the
    stale node and creating it again). Anything else under the name is not ours: the endpoint stops."""
    import json

    from kazoo.exceptions import NodeExistsError, NoNodeError

    from sweeper.zk import client as zkutil

    client = zkutil.connect(hosts)
    name = service_url.split("://", 1)[1]
    path = f"/loadbalance/brokers/{name}"
    data = json.dumps({"pulsarServiceUrl": service_url, "webServiceUrl": web_url, "sandbox": True}).encode()
    for _ in range(3):
        try:
            client.create(path, data, ephemeral=True, makepath=True)
            return client
        except NodeExistsError:
            try:
                held, stat = client.get(path)
                previous = json.loads(held or b"{}")
            except NoNodeError:
                continue
            except ValueError:
                previous = {}
            if not (isinstance(previous, dict) and previous.get("sandbox") is True
                    and previous.get("pulsarServiceUrl") == service_url):
                client.stop()
                raise SystemExit(f"{path} is registered by something else than this sandbox: not replaced") from None
            with contextlib.suppress(NoNodeError):
                client.delete(path, version=stat.version)
    client.stop()
    raise SystemExit(f"could not register {path}: it kept coming back")


if __name__ == "__main__":
    main()
