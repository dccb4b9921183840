"""The development commands of the `sweeper` CLI: `sandbox`, `testbed`, `audit`, and `sweep --sandbox`.

Registered under the `ledger_sweeper.cli` entry-point group (pyproject.toml), so the product's CLI
(sweeper.cli) never imports the harness: in a checkout installed for development (`pip install -e .`, which
scripts/setup.sh runs) this module is importable and its commands appear; an installed wheel carries no harness,
so the CLI skips the plugin and shows only the product's commands.

The harness is imported inside the commands, never at parse time: `sweeper --help` stays quick.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sweeper import cli
from sweeper import config as config_mod
from sweeper.cli import CliPlugins
from sweeper.errors import EXIT_ERROR, EXIT_OK, EXIT_REFUSED

DEFAULT_PORT = 21810  # harness.sandbox.DEFAULT_PORT, spelled here so that parsing imports no harness module


def register(plugins: CliPlugins) -> None:
    sandbox = plugins.add_command("sandbox", cmd_sandbox, help="local ZooKeeper with a synthetic Pulsar cluster "
                                  "(development)")
    sandbox.add_argument("action", choices=["up", "seed", "status", "down"],
                         help="status: what runs (ports, pids, data) and the seed's counts; exit 0 up, 3 down")
    sandbox_options(sandbox)
    sandbox.add_argument("--wipe", action="store_true", help="with `down`: delete the sandbox data too")
    plugins.common(sandbox)
    sandbox.set_defaults(home_holds_config=True)

    testbed = plugins.add_command("testbed", cmd_testbed,
                                  help="a real Apache Pulsar on loopback for tests (development, never production)")
    testbed.add_argument("action", choices=["up", "seed", "status", "crash", "down", "stop-bookie", "kill-bookie",
                                            "start-bookie"],
                         help="up: start; seed: workload + orphans + manifest; crash: kill -9 the broker; "
                              "stop-bookie / kill-bookie / start-bookie: one bookie (--bookie), by its pid")
    testbed.add_argument("--home", default="var/testbed", help="testbed state, data and logs")
    testbed.add_argument("--pulsar-home", help="a Pulsar distribution (default: the one jvm/pom.xml fetches)")
    testbed.add_argument("--metadata", choices=["zookeeper", "oxia"],
                         help="with `up`: where broker and bookie keep their metadata (default zookeeper; a broker "
                              "restarted after `crash` keeps its store). oxia needs the Oxia server binary "
                              "(docs/development.md)")
    testbed.add_argument("--wipe", action="store_true", help="with `down`: delete the testbed data too")
    testbed.add_argument("--bookie", default="0",
                         help="with stop-bookie, kill-bookie, start-bookie: the bookie's index (0-2) or id")
    plugins.common(testbed)
    testbed.set_defaults(check_credentials=False)  # its config names the testbed's own token, written by `up`

    audit = plugins.add_command("audit", cmd_audit, help="run notebooks/audit.ipynb headless and save it with its "
                                "plots (development: the notebook and its kernel are the checkout's)")
    audit.add_argument("--out", default="var/reports/audit.ipynb",
                       help="where to save the executed notebook with its plots (default var/reports/audit.ipynb)")
    audit.add_argument("--tables", help="table root (overrides [tables] root)")
    audit.add_argument("--run-id", help="render this existing run (`sweeper runs` lists them) instead of taking a "
                                        "new snapshot")
    plugins.common(audit)

    sweep = plugins.command("sweep")
    sandbox_options(sweep, when="with --sandbox: ")
    sweep.add_argument("--sandbox", action="store_true", help="start and seed the embedded sandbox first")
    sweep.set_defaults(home_holds_config=True)
    plugins.before("sweep", sweep_on_sandbox)


def sandbox_options(p: argparse.ArgumentParser, when: str = "") -> None:
    p.add_argument("--home", default="var/sandbox", help=f"{when}sandbox state directory (default var/sandbox)")
    p.add_argument("--port", type=int, default=None,
                   help=f"{when}ZooKeeper port for `up` (default {DEFAULT_PORT}); S3 and the Pulsar endpoint take "
                        "the three after it. `seed` uses the running sandbox's")
    p.add_argument("--topics", type=int, default=200, help=f"{when}topics in the seeded sandbox cluster (default 200)")
    p.add_argument("--seed", type=int, default=7,
                   help=f"{when}random seed of the sandbox cluster: the same seed seeds the same cluster (default 7)")
    p.add_argument("--max-rollovers", type=int, default=6,
                   help=f"{when}most ledgers a sandbox topic rolled over to (default 6)")
    p.add_argument("--layout", default="hierarchical", choices=["flat", "hierarchical", "long_hierarchical"],
                   help=f"{when}BookKeeper ledger layout of the sandbox (default hierarchical)")


def _port_flag(args: argparse.Namespace) -> str:
    return f" --port {args.port}" if getattr(args, "port", None) else ""


def cmd_sandbox(args: argparse.Namespace) -> int:
    from harness.sandbox import SandboxSpec, s3_endpoint, sandbox_down, sandbox_up, seed_sandbox
    from sweeper.codecs.layout import LedgerLayout

    home = Path(args.home)
    if args.action == "up":
        info = sandbox_up(home, port=args.port or DEFAULT_PORT)
        written = _write_sandbox_config(args)
        print(f"ZooKeeper sandbox serving on {info.connect_string} (pid {info.pid}, data {info.data_dir}); "
              f"S3 on {s3_endpoint(home)}; every command finds its config in {written}")
        return EXIT_OK
    if args.action == "status":
        from harness.sandbox import sandbox_status

        status = sandbox_status(home)
        for line in status.lines():
            print(line)
        return EXIT_OK if status.up else EXIT_REFUSED
    if args.action == "down":
        down = sandbox_down(home, wipe=args.wipe)
        wiped = "; data wiped" if args.wipe else ""
        if not down.stopped:
            print(f"no sandbox was running in {home}{wiped}")
        elif down.still_taken:
            print(f"sandbox stopped ({', '.join(down.stopped)}), but port(s) {down.still_taken} are still taken "
                  f"after 30 s: `ss -ltnp` names the process holding them{wiped}")
            return EXIT_REFUSED
        else:
            print(f"sandbox stopped ({', '.join(down.stopped)}); ports {', '.join(map(str, down.ports))} are free"
                  f"{wiped}")
        return EXIT_OK
    if args.action == "seed":
        from harness.zkserver import running_server
        from sweeper.errors import UsageError

        # The sandbox's own ZooKeeper (under its ServerClock, so ledger znodes get their past creation times).
        running = running_server(home / "zookeeper")
        if running is None:
            raise UsageError(f"no sandbox runs in {home}: `sweeper sandbox up{_port_flag(args)}` first")
        if args.port is not None and args.port != running.port:
            raise UsageError(f"--port {args.port}: the sandbox in {home} serves ZooKeeper on {running.port}; drop "
                             f"--port, or `sweeper sandbox down` and `up --port {args.port}`")
        cfg = cli.load_config(args).replace(bookkeeper={"zookeeper": running.connect_string}, pulsar={"zookeeper": ""})
        spec = SandboxSpec(
            seed=args.seed,
            topics=args.topics,
            layout=LedgerLayout(args.layout),
            max_rollovers=args.max_rollovers,
            ledgers_root=cfg.bookkeeper.ledgers_root,
            managed_ledgers_root=cfg.pulsar.managed_ledgers_root,
            schemas_root=cfg.pulsar.schemas_root,
            cluster_name=cfg.pulsar.cluster_name or "sandbox",
        )
        seeded = seed_sandbox(cfg.bookkeeper.zookeeper, spec, home / "manifest.json", s3=s3_endpoint(home))
        print(f"seeded {seeded.seed.znodes:,} znodes in {seeded.seed.seconds:.1f}s "
              f"({seeded.seed.rate:,.0f}/s); manifest: {seeded.manifest_path}")
        cli.print_counts("ground truth:", seeded.cluster.counts())
        return EXIT_OK
    raise AssertionError(args.action)



def _write_sandbox_config(args: argparse.Namespace) -> Path:
    """The sandbox's `sweeper.toml`, made from --config or the checkout's conf/local.toml (never from
    $SWEEPER_CONFIG, which may name a production cluster) with the running sandbox's ports."""
    from harness.sandbox import write_sandbox_config

    base = args.config or (str(config_mod.CHECKOUT_CONFIG) if config_mod.CHECKOUT_CONFIG.exists() else None)
    return write_sandbox_config(Path(args.home), config_mod.load(base))



def _bookie_action(home: Path, action: str, which: str) -> int:
    """stop-bookie (SIGTERM), kill-bookie (SIGKILL) or start-bookie (same ports and data) on one testbed bookie."""
    from harness.testbed import bookie
    from harness.testbed.server import read_state

    info = read_state(home)
    if info is None:
        print(f"no testbed recorded under {home}: run `sweeper testbed up` first", file=sys.stderr)
        return EXIT_REFUSED
    ref: int | str = int(which) if which.isdigit() else which
    try:
        target = bookie.find_bookie(info, ref)
        if action == "stop-bookie":
            bookie.stop_bookie(info, ref)
        elif action == "kill-bookie":
            bookie.kill_bookie(info, ref)
        else:
            info = bookie.start_bookie(info, ref)
            target = bookie.find_bookie(info, ref)
    except bookie.BookieError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    state = "running" if target.alive else "down"
    print(f"bookie {target.index} ({target.bookie_id}): {state}, pid {target.pid}, HTTP {target.http_url}")
    return EXIT_OK


def cmd_testbed(args: argparse.Namespace) -> int:
    """The real Apache Pulsar testbed (tests and experiments only; see harness/testbed)."""
    from harness.testbed.server import TestbedError, status, testbed_crash, testbed_down, testbed_up

    home = Path(args.home)
    try:
        if args.action == "up":
            info = testbed_up(home, pulsar_home=args.pulsar_home, metadata=args.metadata)
            print(f"Pulsar {info.pulsar_version} testbed serving: broker {info.service_url}, admin {info.admin_url}, "
                  f"metadata {info.metadata_store_url}, S3 {info.s3_endpoint} (bucket {info.offload_bucket})")
            print(f"superuser token: {info.superuser_token_file}; sweeper config: {info.sweeper_config}; "
                  f"broker log: {info.log_file}")
            for bookie in info.bookies:
                print(f"bookie {bookie.index}: {bookie.bookie_id} (pid {bookie.pid}), HTTP {bookie.http_url}, "
                      f"data {bookie.ledger_dir}, log {bookie.log_file}")
        elif args.action == "seed":
            from harness.testbed.server import running_testbed
            from harness.testbed.world import build_world

            running = running_testbed(home)
            if running is None:
                print(f"no testbed running under {home}: run `sweeper testbed up` first", file=sys.stderr)
                return EXIT_REFUSED
            world = build_world(running)
            kinds: dict[str, int] = {}
            for orphan in world.manifest.orphans:
                kinds[orphan.kind] = kinds.get(orphan.kind, 0) + len(orphan.ledgers) + len(orphan.objects)
            print(f"workload and orphans written in {world.built_s:.0f}s; ground truth in {world.manifest_path}")
            cli.print_counts("induced orphans:", kinds)
        elif args.action == "crash":
            testbed_crash(home)
            print("broker killed (-9); the metadata store and the bookies still run; `sweeper testbed up` restarts it")
        elif args.action == "down":
            stopped = testbed_down(home, wipe=args.wipe)
            print("testbed stopped" if stopped else "no testbed was running", "(data wiped)" if args.wipe else "")
        elif args.action.endswith("-bookie"):
            return _bookie_action(home, args.action, args.bookie)
        else:
            print(json.dumps(status(home), indent=2))
    except TestbedError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    return EXIT_OK



def cmd_audit(args: argparse.Namespace) -> int:
    """Run notebooks/audit.ipynb headless and keep the executed copy, plots included."""
    import os

    import nbformat
    from nbclient import NotebookClient

    from harness import CHECKOUT as repo

    source = repo / "notebooks" / "audit.ipynb"
    out = Path(args.out)
    env = {"SWEEPER_REPO": str(repo), "PYSPARK_PYTHON": sys.executable}
    if args.config:
        env["SWEEPER_CONFIG"] = str(Path(args.config).resolve())
    if args.tables:
        env["SWEEPER_TABLES"] = str(Path(args.tables).resolve())
    os.environ.pop("SWEEPER_RUN_ID", None)
    if args.run_id:
        from sweeper import runs
        from sweeper.errors import UsageError
        from sweeper.report.console import read_store

        store = read_store(cli.load_config(args))
        if runs.succeeded(store, args.run_id, "reconcile") is None:
            raise UsageError(f"run {args.run_id} has no successful reconcile in {store.root}: `sweeper runs` lists "
                             "the runs there")
        env["SWEEPER_RUN_ID"] = args.run_id
    os.environ.update(env)
    notebook = nbformat.read(source, as_version=4)
    out.parent.mkdir(parents=True, exist_ok=True)
    print("[audit] running notebooks/audit.ipynb" + (f" on run {args.run_id}" if args.run_id else
                                                    " (a new snapshot and reconcile)") + "...", flush=True)
    try:
        NotebookClient(notebook, timeout=3600, kernel_name="python3",
                       resources={"metadata": {"path": str(source.parent)}}).execute()
    except Exception as exc:  # a cell failed: keep what ran, name the cell's error in one line
        nbformat.write(notebook, out)
        error = getattr(exc, "ename", type(exc).__name__), getattr(exc, "evalue", str(exc).splitlines()[0])
        print(f"audit failed: {error[0]}: {error[1]}; the notebook as far as it ran is in {out}", file=sys.stderr)
        return EXIT_ERROR
    nbformat.write(notebook, out)
    print(f"audit written to {out} (open it in Jupyter, VS Code or any notebook viewer)")
    return EXIT_OK



def _sandbox_table_bucket(args: argparse.Namespace) -> None:
    """A table root on S3 with no endpoint of its own lives on the sandbox's S3: create its bucket."""
    from sweeper.objectstore.s3 import S3Target, s3_client
    from sweeper.tables.storage import TableStorage

    cfg = cli.load_config(args)
    storage = TableStorage(cfg.tables.root)
    if not storage.on_s3 or cfg.tables.s3_endpoint:
        return
    args.tables_s3_endpoint = args.s3_endpoint
    client = s3_client(S3Target(storage.bucket), args.s3_endpoint)
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if storage.bucket not in existing:
        client.create_bucket(Bucket=storage.bucket)
    print(f"sandbox: tables on {cfg.tables.root} (the sandbox's S3)")




def sweep_on_sandbox(args: argparse.Namespace) -> None:
    """`sweep --sandbox`: start and seed the sandbox, and point the sweep at it (its ZooKeeper, S3 and Pulsar)."""
    if not args.sandbox:
        return
    from harness.sandbox import SandboxError, s3_endpoint, sandbox_up
    from harness.sandbox.pulsar import running_pulsar

    info = sandbox_up(Path(args.home), port=args.port or DEFAULT_PORT)
    _write_sandbox_config(args)
    args.zookeeper = args.zookeeper or info.connect_string
    args.s3_endpoint = s3_endpoint(Path(args.home))
    pulsar = running_pulsar(Path(args.home) / "pulsar")
    if pulsar is not None:
        args.pulsar_urls = (pulsar.service_url, pulsar.admin_url)
    print(f"sandbox: ZooKeeper on {info.connect_string}, S3 on {args.s3_endpoint}, Pulsar on "
          f"{pulsar.service_url if pulsar else '-'}")
    if getattr(args, "execute", False):
        print("sandbox: its bookies are names without servers, so what they give back is not measured here; "
              "`sweeper testbed up` runs real bookies, then `sweeper sweep --config var/testbed/sweeper.toml "
              "--execute` shows it")
    try:
        cmd_sandbox(argparse.Namespace(**{**vars(args), "action": "seed", "port": None}))
    except SandboxError as exc:
        print(f"sandbox: {exc}; scanning what is there")
    _sandbox_table_bucket(args)
