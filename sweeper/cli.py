"""`sweeper` command line: sandbox management and the pipeline stages.

Exit codes (for schedulers): 0 success, 1 unexpected error, 2 usage or configuration error,
3 a stage refused to run (wrong root, unreachable server or broker, a ZooKeeper certificate, login or
permission refused, failed gate, circuit breaker, a system topic that is not as configured, another
delete run holding the lock), 4 partial: some
deletes failed and wait in the retry queue (or were dead-lettered); rerun later.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sweeper import config as config_mod
from sweeper.config import ConfigError, SweeperConfig

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_REFUSED, EXIT_PARTIAL = 0, 1, 2, 3, 4
# The stages `sweep --until` names, in order (sweeper.pipeline.STAGES; spelled here so parsing imports no Spark).
SWEEP_STAGES = ("snapshot", "reconcile", "retention_debt", "emit", "delete")
DEFAULT_PORT = 21810  # the sandbox's (harness.sandbox.DEFAULT_PORT; the CLI does not import the harness to parse)
EXIT_INTERRUPTED = 130  # SIGINT or SIGTERM: stopped, what was done is on record


def strict(cfg: SweeperConfig) -> SweeperConfig:
    """The one-shot cleanup profile (after an upgrade or a migration): never looser than the config."""
    return cfg.replace(
        safety={"min_age_hours": max(cfg.safety.min_age_hours, 14 * 24.0),
                "max_orphan_fraction": min(cfg.safety.max_orphan_fraction, 0.02), "force_min_age": False},
        gates={"max_drop_fraction": min(cfg.gates.max_drop_fraction, 0.1), "allow_empty": False},
        delete={"max_deletes_per_run": min(cfg.delete.max_deletes_per_run, 1000),
                "deletes_per_second": min(cfg.delete.deletes_per_second, 50.0)})


# Commands that only read tables may run outside a checkout with just --tables; every other one needs a config.
_READ_ONLY = {"runs", "show", "dlq"}
_said_config: list[str] = []  # once per command, however many times its parts load the config
_heartbeat: list[Any] = []  # the running command's (sweeper.progress.Heartbeat), told of the Spark session


def _config_choice(args: argparse.Namespace) -> config_mod.ConfigChoice:
    home = getattr(args, "home", None) if args.command in ("sandbox", "sweep") else None
    sandbox_config = Path(home) / "sweeper.toml" if home else config_mod.SANDBOX_CONFIG
    return config_mod.find_config(args.config, sandbox_config=sandbox_config)


def _load_config(args: argparse.Namespace) -> SweeperConfig:
    choice = _config_choice(args)
    if choice.path is None and not (args.command in _READ_ONLY and getattr(args, "tables", None)):
        raise ConfigError(f"no config found (searched {config_mod.search_order()}): pass --config PATH "
                          "(conf/cluster.example.toml is a template) or run `sweeper sandbox up` for the sandbox")
    if choice.path is None:
        # A read of named tables: only the root matters, none of the cluster settings a stage would check.
        import dataclasses

        return SweeperConfig(tables=dataclasses.replace(SweeperConfig().tables, root=args.tables))
    if not _said_config and args.command not in _READ_ONLY:
        print(choice.describe(), flush=True)  # which cluster a command acts on is never a guess
        _said_config.append(str(choice.path))
    cfg = config_mod.load(choice.path)
    if args.command not in _READ_ONLY and args.command != "testbed":
        _check_credentials(cfg)
    if getattr(args, "strict", False):
        cfg = strict(cfg)
    overrides: dict[str, dict[str, object]] = {}
    if getattr(args, "tables", None):
        overrides["tables"] = {"root": args.tables}
    if getattr(args, "tables_s3_endpoint", None) and not cfg.tables.s3_endpoint:
        # The sandbox's S3 serves a table root on S3 that names no endpoint of its own.
        overrides["tables"] = {**overrides.get("tables", {}), "s3_endpoint": args.tables_s3_endpoint}
    if getattr(args, "zookeeper", None):
        overrides["bookkeeper"] = {"zookeeper": args.zookeeper}
    if getattr(args, "s3_endpoint", None):
        overrides["offload"] = {"endpoint_override": args.s3_endpoint}
    if getattr(args, "pulsar_urls", None):
        overrides["system_topic"] = {"service_url": args.pulsar_urls[0], "admin_url": args.pulsar_urls[1]}
    if getattr(args, "allow_no_brokers", False):
        # A cleanup with the brokers stopped: the run's report says the liveness check was waived.
        overrides["gates"] = {"require_live_brokers": False}
        print("liveness: --allow-no-brokers: no live broker registration is required for this run", file=sys.stderr)
    return cfg.replace(**overrides) if overrides else cfg


def _print_counts(title: str, counts: dict[str, int]) -> None:
    print(title)
    width = max((len(k) for k in counts), default=0)
    for key in sorted(counts):
        print(f"  {key:<{width}}  {counts[key]:>12,}")


def _reach_harness() -> None:
    """The sandbox and testbed are development tools that live in the checkout's `harness/`, outside the installed
    package (issue 22): an installed console script finds them beside this checkout's `sweeper/`, or says why not."""
    # Beside this sweeper/ (an editable install, `python -m`); beside the job script spark-submit ran (the
    # package itself then comes from the shipped zip); or the directory the command runs in.
    candidates = [Path(__file__).resolve().parents[1], Path.cwd()]
    if sys.argv and sys.argv[0].endswith(".py"):
        candidates.insert(1, Path(sys.argv[0]).resolve().parents[1])
    for checkout in candidates:
        if (checkout / "harness" / "__init__.py").is_file():
            if str(checkout) not in sys.path:
                sys.path.insert(0, str(checkout))
            return
    from sweeper.errors import UsageError

    raise UsageError("the sandbox and the testbed are development tools of the source checkout (its harness/ "
                     "directory), not part of the installed package: run this command from a checkout")


def cmd_sandbox(args: argparse.Namespace) -> int:
    _reach_harness()
    from harness.sandbox import SandboxSpec, s3_endpoint, sandbox_down, sandbox_up, seed_sandbox
    from sweeper.layout import LedgerLayout

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
        cfg = _load_config(args).replace(bookkeeper={"zookeeper": running.connect_string}, pulsar={"zookeeper": ""})
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
        _print_counts("ground truth:", seeded.cluster.counts())
        return EXIT_OK
    raise AssertionError(args.action)


def _check_credentials(cfg: SweeperConfig) -> None:
    """Every secret the config names is read now, before Spark starts: an unset variable or an unreadable file is
    the operator's configuration (exit 2, in a second), not a refusal 20 seconds into a run."""
    from sweeper.connections import Connections
    from sweeper.system_topic import SystemTopicError, read_token

    Connections.from_config(cfg)  # ZooKeeper's TLS/SASL/digest secrets, for every store
    try:
        read_token(cfg.system_topic)
    except SystemTopicError as exc:
        raise ConfigError(str(exc)) from None


def _port_flag(args: argparse.Namespace) -> str:
    return f" --port {args.port}" if getattr(args, "port", None) else ""


def _write_sandbox_config(args: argparse.Namespace) -> Path:
    """The sandbox's `sweeper.toml`, made from --config or the checkout's conf/local.toml (never from
    $SWEEPER_CONFIG, which may name a production cluster) with the running sandbox's ports."""
    from harness.sandbox import write_sandbox_config

    base = args.config or (str(config_mod.CHECKOUT_CONFIG) if config_mod.CHECKOUT_CONFIG.exists() else None)
    return write_sandbox_config(Path(args.home), config_mod.load(base))


def _session(cfg: SweeperConfig) -> tuple[Any, Any]:
    from sweeper.spark import get_spark
    from sweeper.tables import open_table_store

    # Spark's own progress bar, on a terminal only: a scheduler's log wants the per-stage lines.
    progress = {"spark.ui.showConsoleProgress": "true"} if sys.stderr.isatty() else {}
    print(f"[spark] starting a session ({cfg.spark.master or 'local[*]'}); its own output goes to the log file",
          flush=True)
    spark = get_spark(cfg.spark.app_name, master=cfg.spark.master or None, conf=progress)
    for heartbeat in _heartbeat:
        heartbeat.spark = spark
    store = open_table_store(cfg.tables.root, spark, engine=cfg.tables.engine,
                             s3_endpoint=cfg.tables.s3_endpoint, s3_region=cfg.tables.s3_region)
    return spark, store


def cmd_testbed(args: argparse.Namespace) -> int:
    """The real Apache Pulsar testbed (tests and experiments only; see harness/testbed)."""
    _reach_harness()
    from harness.testbed.server import TestbedError, status, testbed_crash, testbed_down, testbed_up

    home = Path(args.home)
    try:
        if args.action == "up":
            info = testbed_up(home, pulsar_home=args.pulsar_home, metadata=args.metadata)
            print(f"Pulsar {info.pulsar_version} testbed serving: broker {info.service_url}, admin {info.admin_url}, "
                  f"metadata {info.metadata_store_url}, S3 {info.s3_endpoint} (bucket {info.offload_bucket})")
            print(f"superuser token: {info.superuser_token_file}; sweeper config: {info.sweeper_config}; "
                  f"broker log: {info.log_file}")
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
            _print_counts("induced orphans:", kinds)
        elif args.action == "crash":
            testbed_crash(home)
            print("broker killed (-9); the metadata store and the bookie still run; `sweeper testbed up` restarts it")
        elif args.action == "down":
            stopped = testbed_down(home, wipe=args.wipe)
            print("testbed stopped" if stopped else "no testbed was running", "(data wiped)" if args.wipe else "")
        else:
            print(json.dumps(status(home), indent=2))
    except TestbedError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    return EXIT_OK


def cmd_snapshot(args: argparse.Namespace) -> int:
    from sweeper.snapshot import run_snapshot, zk_load

    cfg = _load_config(args)
    spark, store = _session(cfg)
    result = run_snapshot(spark, cfg, store, run_id=args.run_id)
    print(f"snapshot {result.run_id}: layout {result.layout}, {result.units} scan units, "
          f"{result.duration_s:.1f}s ({result.ledgers_per_second:,.0f} ledgers/s scanned), engine {store.engine}")
    print(f"ZooKeeper load: {zk_load(result.counts)}")
    tables = result.counts.tables()
    _print_counts("rows written per table:", tables)
    _print_counts("other counts:", {k: v for k, v in result.counts.as_row().items() if k not in tables})
    if args.json:
        print(json.dumps({"run_id": result.run_id, "counts": result.counts.as_row(), "versions": result.versions}))
    return EXIT_OK


def cmd_reconcile(args: argparse.Namespace) -> int:
    from sweeper import runs
    from sweeper.pipeline import reconcile_stage

    cfg = _load_config(args)
    spark, store = _session(cfg)
    run_id = args.run_id or runs.latest(store, "snapshot")
    if run_id is None:
        print(f"refused: no successful snapshot in {cfg.tables.root}; run `sweeper snapshot` first", file=sys.stderr)
        return EXIT_REFUSED
    result = reconcile_stage(spark, cfg, store, run_id, check_gates=not args.skip_gates)
    print(f"reconcile {run_id}: {result.duration_s:.1f}s (dry run: nothing was deleted)")
    by_status = result.counts.with_counts(by_reason={}).as_row()
    _print_counts("orphans by status:", by_status)
    _print_counts("candidates by reason:", dict(result.counts.by_reason))
    if result.counts.shared_bookkeeper_unverified:
        print(result.sharing)
    if args.json:
        print(json.dumps({"run_id": run_id, "counts": by_status, "by_reason": result.counts.by_reason}))
    return EXIT_OK


def cmd_retention_debt(args: argparse.Namespace) -> int:
    """The retention-debt stage alone, on a reconciled run: what `sweep` reports after reconcile."""
    from sweeper import runs
    from sweeper.pipeline import retention_stage, retention_summary

    cfg = _load_config(args)
    spark, store = _session(cfg)
    run_id = args.run_id or runs.latest(store, "reconcile")
    if run_id is None:
        print(f"refused: no reconciled run in {cfg.tables.root}; run `sweeper reconcile` first", file=sys.stderr)
        return EXIT_REFUSED
    print(f"[retention] started on run {run_id}: retention debt (unloaded topics, idle cursors)", flush=True)
    result = retention_stage(spark, cfg, store, run_id)
    retention_summary(result)
    print("dry run: nothing was loaded or deleted (`sweeper retention` plans the repair, `--execute` acts)")
    if args.json:
        print(json.dumps({"run_id": run_id, "counts": result.counts.as_row()}))
    return EXIT_OK


def cmd_emit(args: argparse.Namespace) -> int:
    from sweeper import runs
    from sweeper.pipeline import emit_stage

    cfg = _load_config(args)
    spark, store = _session(cfg)
    run_id = args.run_id or runs.latest(store, "reconcile")
    if run_id is None:
        print(f"refused: no reconciled run in {cfg.tables.root}; run `sweeper reconcile` first", file=sys.stderr)
        return EXIT_REFUSED
    result = emit_stage(spark, cfg, store, run_id)
    print(f"emit {run_id}: {result.counts.published:,} published to {cfg.system_topic.topic} in "
          f"{result.duration_s:.1f}s ({result.records_per_second:,.0f} records/s)")
    _print_counts("records:", result.counts.as_row())
    if args.json:
        print(json.dumps({"run_id": run_id, "counts": result.counts.as_row()}))
    return EXIT_OK


def cmd_delete(args: argparse.Namespace) -> int:
    from sweeper import runs
    from sweeper.delete.stage import DeleteRefused, describe, read_operator_list
    from sweeper.errors import UsageError
    from sweeper.pipeline import delete_stage, delete_summary, is_partial

    cfg = _load_config(args)
    if args.from_json:
        # The operator's file is checked before Spark starts: a typo in it is a usage error (exit 2), not a run.
        try:
            listed = read_operator_list(args.from_json)
        except DeleteRefused as exc:
            raise UsageError(str(exc)) from None
        if not listed:
            raise UsageError(f"{args.from_json} lists no ledgers: nothing to delete")
    spark, store = _session(cfg)
    if args.from_json:
        run_id = args.run_id or f"manual-{Path(args.from_json).stem}"
    elif args.from_topic:
        run_id = args.run_id or f"topic-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    else:
        run_id = args.run_id or runs.latest(store, "emit")
        if run_id is None:
            print(f"refused: no emitted run in {cfg.tables.root}; run `sweeper emit` first", file=sys.stderr)
            return EXIT_REFUSED
    result = delete_stage(spark, cfg, store, run_id, execute=args.execute, from_json=args.from_json,
                          from_topic=args.from_topic)
    if args.from_json:
        for item in result.results:
            print(describe(item))
    print(f"delete {run_id}: {delete_summary(result)} in {result.duration_s:.1f}s"
          + ("" if args.execute else " (dry run: pass --execute to delete)"))
    _print_counts("guards:", {k: int(v) for k, v in result.guards.items() if isinstance(v, int | float)})
    if result.guards.get("permission_check", "ok") != "ok":
        print(f"ZooKeeper permissions: {result.guards['permission_check']}")
    reclaimed = None
    if args.execute and cfg.reclaim.enabled:
        from sweeper.pipeline import reclaim_report, reclaim_stage

        reclaimed = reclaim_stage(cfg, store, run_id, trigger=cfg.reclaim.trigger_gc)
        reclaim_report(reclaimed)
    if args.json:
        print(json.dumps({"run_id": run_id, "counts": result.counts.as_row(), "guards": result.guards,
                          **({"reclaim": reclaimed.counts.as_row()} if reclaimed else {})}))
    return EXIT_PARTIAL if is_partial(result) else EXIT_OK


def cmd_reclaim(args: argparse.Namespace) -> int:
    """Measure again what a run's deletes gave back; with --execute, first ask each bookie for one GC."""
    from sweeper import runs
    from sweeper.pipeline import reclaim_report, reclaim_stage

    cfg = _load_config(args)
    _, store = _session(cfg)
    run_id = args.run_id or runs.latest(store, "delete")
    if run_id is None or not runs.rows(store, run_id, "delete"):
        print(f"refused: no delete run {'named ' + repr(args.run_id) + ' ' if args.run_id else ''}in "
              f"{cfg.tables.root}; `sweeper runs` lists the runs", file=sys.stderr)
        return EXIT_REFUSED
    result = reclaim_stage(cfg, store, run_id, trigger=args.execute)
    for row in result.rows:
        print(f"{row['target']:<24} {row['verdict']:<18} expected {row['expected_bytes'] or 0:>14,}  freed "
              f"{row['freed_bytes'] or 0:>14,}  pending {row['pending_bytes'] or 0:>14,}  {row['action']}"
              + (f"  ({row['why']})" if row["why"] else ""))
    reclaim_report(result)
    if not args.execute:
        print("measured only: pass --execute to ask each bookie that held deleted data for one GC")
    if args.json:
        print(json.dumps({"run_id": run_id, "counts": result.counts.as_row()}))
    return EXIT_OK


def cmd_retention(args: argparse.Namespace) -> int:
    """Repair retention debt through the broker's admin REST API: a dry run unless --execute."""
    from sweeper import runs
    from sweeper.pipeline import repair_stage

    cfg = _load_config(args)
    _, store = _session(cfg)
    plan = args.run_id or runs.latest(store, "retention_debt")
    if plan is None:
        print(f"refused: no retention debt in {cfg.tables.root}; run `sweeper sweep` (or reconcile) first",
              file=sys.stderr)
        return EXIT_REFUSED
    run_id = f"retention-{runs.new_run_id()}"
    result = repair_stage(cfg, store, plan, run_id, execute=args.execute)
    for row in result.rows:
        what = row["topic_name"] + (f" subscription {row['cursor']!r}" if row["cursor"] else "")
        sizes = f" ({row['bytes_before']:,} -> {row['bytes_after']:,} bytes)" if row["bytes_after"] is not None else ""
        print(f"{row['action']:<20} {row['outcome']:<15} {what}{sizes}: {row['detail']}")
    counts = ", ".join(f"{v:,} {k}" for k, v in sorted(result.counts.as_row().items()) if v and k != "execute")
    counts = counts or "nothing to do"
    print(f"retention repair {run_id} of plan {plan}: {counts} in {result.duration_s:.1f}s"
          + ("" if args.execute else " (dry run: pass --execute to act)"))
    if args.json:
        print(json.dumps({"run_id": run_id, "plan_run_id": plan, "counts": result.counts.as_row()}))
    if result.stopped:
        print(f"refused: {result.stopped}", file=sys.stderr)
        return EXIT_REFUSED
    return EXIT_PARTIAL if result.counts.failed else EXIT_OK


def cmd_dlq(args: argparse.Namespace) -> int:
    from sweeper.console import read_store
    from sweeper.delete.stage import dead_letters, redrive

    cfg = _load_config(args)
    # Refuses a root with no tables (exit 2) instead of reporting "0 dead letters" for a mistyped path.
    reader = read_store(cfg)
    if args.action == "list":
        rows = dead_letters(reader)  # no Spark for a list
        for r in rows:
            print(f"{r['record_key']}  run={r['run_id']} attempts={r['attempts']} last_error={r['last_error']}")
        print(f"{len(rows)} dead letter(s)")
        return EXIT_OK
    _, store = _session(cfg)
    count = redrive(store, args.key or None)
    print(f"re-drove {count} dead letter(s): the next `sweeper delete --execute` retries them")
    return EXIT_OK


def _limit(args: argparse.Namespace) -> int:
    """--limit, or its default: 20 rows for people (a table), every row for scripts (json, csv)."""
    if args.limit is not None:
        return int(args.limit)
    return 20 if args.format == "table" else 0


def cmd_runs(args: argparse.Namespace) -> int:
    """The runs in the tables, newest first: read-only, no Spark."""
    from sweeper.console import read_store, render, run_rows, run_summaries

    args.limit = _limit(args)
    store = read_store(_load_config(args))
    summaries = run_summaries(run_rows(store))  # with the attempts a kill left in the journals, not yet folded in
    if args.status:
        summaries = [r for r in summaries if r["status"] == args.status]
    shown = summaries[:args.limit] if args.limit else summaries
    columns = ["run_id", "started", "duration", "status", "mode", "candidates", "published", "deleted", "stages",
               "message"]
    sys.stdout.write(render(shown, columns, args.format))
    if args.format == "table":
        more = len(summaries) - len(shown)
        print(f"{len(shown)} run{'s' if len(shown) != 1 else ''} of {len(summaries)} in {store.root}"
              + (f" ({more} older: --limit 0 shows all)" if more > 0 else "")
              + "; `sweeper show RUN deletes` lists what a run deleted")
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    """One run's rows of one table (orphans, deletes, ...), filtered: read-only, no Spark."""
    from sweeper.console import read_store, render, show_rows

    args.limit = _limit(args)
    store = read_store(_load_config(args))
    filters = {"reason": args.reason, "status": args.status, "tenant": args.tenant, "namespace": args.namespace}
    rows, view = show_rows(store, args.run, args.what, filters, args.limit)
    sys.stdout.write(render(rows, view.columns, args.format))
    if args.format == "table":
        limited = f" (first {args.limit}: --limit 0 shows all)" if args.limit and len(rows) == args.limit else ""
        print(f"{len(rows)} {args.what} row{'s' if len(rows) != 1 else ''} of run {args.run}{limited}")
    return EXIT_OK


def cmd_audit(args: argparse.Namespace) -> int:
    """Run notebooks/audit.ipynb headless and keep the executed copy, plots included."""
    import os

    import nbformat
    from nbclient import NotebookClient

    repo = Path(__file__).resolve().parents[1]
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
        from sweeper.console import read_store
        from sweeper.errors import UsageError

        store = read_store(_load_config(args))
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
    from sweeper.offload import S3Target, s3_client
    from sweeper.tables.storage import TableStorage

    cfg = _load_config(args)
    storage = TableStorage(cfg.tables.root)
    if not storage.on_s3 or cfg.tables.s3_endpoint:
        return
    args.tables_s3_endpoint = args.s3_endpoint
    client = s3_client(S3Target(storage.bucket), args.s3_endpoint)
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if storage.bucket not in existing:
        client.create_bucket(Bucket=storage.bucket)
    print(f"sandbox: tables on {cfg.tables.root} (the sandbox's S3)")


def cmd_sweep(args: argparse.Namespace) -> int:
    """Run the stages in order with one run id, stopping at the first refusal."""
    from sweeper.pipeline import sweep

    if args.execute and args.until not in (None, "delete"):
        # Refused before anything starts: doing more than the user named (deleting) is never the resolution.
        print(f"usage error: --execute deletes, but --until {args.until} stops before the delete: drop --execute "
              f"to stop after {args.until}, or drop --until to delete", file=sys.stderr)
        return EXIT_USAGE
    if args.sandbox:
        _reach_harness()
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
        try:
            cmd_sandbox(argparse.Namespace(**{**vars(args), "action": "seed", "port": None}))
        except SandboxError as exc:
            print(f"sandbox: {exc}; scanning what is there")
        _sandbox_table_bucket(args)
    cfg = _load_config(args)
    spark, store = _session(cfg)
    until = args.until or ("delete" if args.execute else "retention_debt")
    result = sweep(spark, cfg, store, until=until, run_id=args.run_id, execute=args.execute)
    if args.json:
        print(json.dumps({"run_id": result.run_id, "stages": result.stages}))
    return EXIT_PARTIAL if result.partial else EXIT_OK


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ledger-sweeper")
    except PackageNotFoundError:
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sweeper", description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 done; 1 unexpected error (a bug: see the log file); 2 usage or configuration error "
               "(nothing ran);\n  3 refused (a gate, a safety rule, the lock, an unreachable store: nothing unsafe "
               "done); 4 partial (some deletes\n  or repairs failed and wait for a retry); 130 interrupted (what was "
               "done is on record; run it again)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", help="TOML config (default: $SWEEPER_CONFIG, else the sandbox's "
                                        "var/sandbox/sweeper.toml, else conf/local.toml; the one used is printed)")
        p.add_argument("-v", "--verbose", action="store_true",
                       help="Spark's, the JVM's and the libraries' output on the terminal instead of the log file")

    def sandbox_options(p: argparse.ArgumentParser, when: str = "") -> None:
        p.add_argument("--home", default="var/sandbox", help=f"{when}sandbox state directory (default var/sandbox)")
        p.add_argument("--port", type=int, default=None,
                       help=f"{when}ZooKeeper port for `up` (default {DEFAULT_PORT}); S3 and the Pulsar endpoint take "
                            "the three after it. `seed` uses the running sandbox's")
        p.add_argument("--topics", type=int, default=200,
                       help=f"{when}topics in the seeded sandbox cluster (default 200)")
        p.add_argument("--seed", type=int, default=7,
                       help=f"{when}random seed of the sandbox cluster: the same seed seeds the same cluster "
                            "(default 7)")
        p.add_argument("--max-rollovers", type=int, default=6,
                       help=f"{when}most ledgers a sandbox topic rolled over to (default 6)")
        p.add_argument("--layout", default="hierarchical", choices=["flat", "hierarchical", "long_hierarchical"],
                       help=f"{when}BookKeeper ledger layout of the sandbox (default hierarchical)")

    sandbox = sub.add_parser("sandbox", help="local ZooKeeper with a synthetic Pulsar cluster")
    sandbox.add_argument("action", choices=["up", "seed", "status", "down"],
                         help="status: what runs (ports, pids, data) and the seed's counts; exit 0 up, 3 down")
    sandbox_options(sandbox)
    sandbox.add_argument("--wipe", action="store_true", help="with `down`: delete the sandbox data too")
    common(sandbox)
    sandbox.set_defaults(func=cmd_sandbox)

    testbed = sub.add_parser("testbed", help="a real Apache Pulsar on loopback for tests (never production)")
    testbed.add_argument("action", choices=["up", "seed", "status", "crash", "down"],
                         help="up: start; seed: workload + orphans + manifest; crash: kill -9 the broker")
    testbed.add_argument("--home", default="var/testbed", help="testbed state, data and logs")
    testbed.add_argument("--pulsar-home", help="a Pulsar distribution (default: the one jvm/pom.xml fetches)")
    testbed.add_argument("--metadata", choices=["zookeeper", "oxia"],
                         help="with `up`: where broker and bookie keep their metadata (default zookeeper; a broker "
                              "restarted after `crash` keeps its store). oxia needs the Oxia server binary "
                              "(docs/development.md)")
    testbed.add_argument("--wipe", action="store_true", help="with `down`: delete the testbed data too")
    common(testbed)
    testbed.set_defaults(func=cmd_testbed)

    def stage_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--strict", action="store_true",
                       help="the one-shot cleanup profile (docs/operations.md), each stage taking its part: "
                            "snapshot gates at a 10%% drop, 14-day grace and a 2%% breaker in reconcile, at most "
                            "1,000 deletes per run at 50/s")
        p.add_argument("--tables", help="table root (overrides [tables] root)")
        p.add_argument("--zookeeper", help="ZooKeeper connect string (overrides [bookkeeper] zookeeper)")
        p.add_argument("--run-id", help="the run to act on (default: the latest that is ready for this stage); for "
                                        "snapshot and sweep, an id for the new run, refused if already used")
        p.add_argument("--json", action="store_true", help="also print a JSON summary line")

    snapshot = sub.add_parser("snapshot", help="scan ZooKeeper metadata into Delta tables")
    stage_options(snapshot)
    common(snapshot)
    snapshot.set_defaults(func=cmd_snapshot)

    reconcile = sub.add_parser("reconcile", help="find orphans in a snapshot (default: the latest)")
    stage_options(reconcile)
    common(reconcile)
    reconcile.add_argument("--skip-gates", action="store_true",
                           help="skip the data-quality gates: an audit only, emit and delete refuse the run")
    reconcile.add_argument("--allow-no-brokers", action="store_true",
                           help="pass the liveness gate with no broker registered (a cleanup with brokers stopped)")
    reconcile.set_defaults(func=cmd_reconcile)

    debt = sub.add_parser("retention-debt", help="find retention debt in a reconciled run (default: the latest): "
                          "unloaded topics whose retention never runs, idle cursors pinning ledgers (reads only)")
    stage_options(debt)
    common(debt)
    debt.set_defaults(func=cmd_retention_debt)

    emit = sub.add_parser("emit", help="publish a reconciled run's candidates to the pending-delete topic")
    stage_options(emit)
    common(emit)
    emit.set_defaults(func=cmd_emit)

    delete = sub.add_parser("delete", help="re-verify and delete a run's pending deletes (dry run by default)")
    stage_options(delete)
    common(delete)
    delete.add_argument("--execute", action="store_true", help="really delete (default: dry run)")
    source = delete.add_mutually_exclusive_group()
    source.add_argument("--from-json", help="an operator's list of ledgers instead of a run's emitted records")
    source.add_argument("--from-topic", action="store_true",
                        help="drain the system topic's Shared subscription ([delete] subscription); messages are "
                             "acknowledged only after their outcomes are committed, never in a dry run")
    delete.set_defaults(func=cmd_delete)

    reclaim = sub.add_parser("reclaim", help="measure what a run's deletes gave back on each bookie (and offload "
                             "bucket); --execute first asks each bookie that held deleted data for one GC")
    stage_options(reclaim)
    common(reclaim)
    reclaim.add_argument("--execute", action="store_true",
                         help="trigger a GC (PUT /api/v1/bookie/gc) on each bookie that held the run's deleted data, "
                              "at most once per bookie per run; [reclaim] compaction says which compaction it may run")
    reclaim.set_defaults(func=cmd_reclaim)

    retention = sub.add_parser("retention", help="repair retention debt through the broker's admin REST API: load "
                               "unloaded topics so their retention runs, delete subscriptions idle past [retention] "
                               "cursor_idle_days (dry run by default)")
    stage_options(retention)
    common(retention)
    retention.add_argument("--execute", action="store_true", help="really act (default: dry run)")
    retention.set_defaults(func=cmd_retention)

    dlq = sub.add_parser("dlq", help="list or re-drive dead-lettered deletes")
    dlq.add_argument("action", choices=["list", "redrive"],
                     help="list: dead-lettered deletes; redrive: queue them again for the next delete --execute")
    dlq.add_argument("--key", action="append", help="record key to re-drive (repeatable; default: all)")
    dlq.add_argument("--tables", help="table root (overrides [tables] root)")
    common(dlq)
    dlq.set_defaults(func=cmd_dlq)

    from sweeper.console import FORMATS, VIEWS

    def read_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--tables", help="table root (overrides [tables] root)")
        p.add_argument("--format", choices=FORMATS, default="table",
                       help="table (aligned, for people), json (one object per line) or csv (every column)")
        p.add_argument("--limit", type=int, default=None,
                       help="at most this many rows (0: all; default: 20 in a table, all in json and csv, which a "
                            "script reads as the whole answer)")
        common(p)

    runs_parser = sub.add_parser("runs", help="list the runs in the tables, newest first (read-only, no Spark)")
    read_options(runs_parser)
    runs_parser.add_argument("--status", choices=["succeeded", "partial", "refused", "failed", "interrupted"],
                             help="only runs that ended so (a run's status is its worst stage's)")
    runs_parser.set_defaults(func=cmd_runs)

    show = sub.add_parser("show", help="one run's orphans, deletes, quarantine, retention debt, repair actions or "
                                       "dead letters (read-only, no Spark)")
    show.add_argument("run", help="a run id (`sweeper runs` lists them)")
    show.add_argument("what", choices=sorted(VIEWS), help="which rows of the run")
    read_options(show)
    show.add_argument("--reason", help="only this reason (orphans, retention), outcome (deletes), error kind "
                                       "(quarantine) or action (actions)")
    show.add_argument("--status", help="only this status (orphans, retention), outcome (deletes, actions), error "
                                       "kind (quarantine) or state (dlq)")
    show.add_argument("--tenant", help="only this tenant")
    show.add_argument("--namespace", help="only this namespace (its local name, as in the tables)")
    show.set_defaults(func=cmd_show)

    audit = sub.add_parser("audit", help="run notebooks/audit.ipynb headless and save it with its plots")
    audit.add_argument("--out", default="var/reports/audit.ipynb",
                       help="where to save the executed notebook with its plots (default var/reports/audit.ipynb)")
    audit.add_argument("--tables", help="table root (overrides [tables] root)")
    audit.add_argument("--run-id", help="render this existing run (`sweeper runs` lists them) instead of taking a "
                                        "new snapshot")
    common(audit)
    audit.set_defaults(func=cmd_audit)

    sweep = sub.add_parser("sweep", help="run the pipeline stages in order")
    stage_options(sweep)
    sandbox_options(sweep, when="with --sandbox: ")
    common(sweep)
    sweep.add_argument("--sandbox", action="store_true", help="start and seed the embedded sandbox first")
    sweep.add_argument("--until", default=None, choices=SWEEP_STAGES,
                       help="last stage to run (default: retention_debt, a dry run that reports; emit marks ledgers "
                            "for deletion; delete without --execute only reports)")
    sweep.add_argument("--execute", action="store_true",
                       help="run every stage and really delete (with --until, only --until delete)")
    sweep.add_argument("--allow-no-brokers", action="store_true",
                       help="pass the liveness gate with no broker registered (a cleanup with brokers stopped)")
    sweep.set_defaults(func=cmd_sweep)
    return parser


LOG_FILE_ENV = "SWEEPER_LOG_FILE"
DEFAULT_LOG_FILE = "var/log/sweeper.log"


def _chatter_to_log_file(verbose: bool) -> tuple[Path | None, Any]:
    """Everything written to file descriptor 2 from now on (the JVM's log4j and its stack traces, Python workers,
    py4j's complaints, library warnings) goes to the log file; this process's own lines keep the terminal.

    Only when stderr is the process's real descriptor 2 (a terminal, a scheduler's pipe): inside a test's or a
    notebook's captured stderr nothing is moved. With --verbose nothing is moved either."""
    import os

    try:
        real = not verbose and sys.stderr is sys.__stderr__ and sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):
        real = False
    if not real:
        return None, None
    path = Path(os.environ.get(LOG_FILE_ENV) or DEFAULT_LOG_FILE).resolve()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        return None, None  # an unwritable log location must not stop the command
    terminal_fd = os.dup(2)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    sys.stderr = os.fdopen(terminal_fd, "w", buffering=1)
    return path, terminal_fd


def _restore_stderr(terminal_fd: Any) -> None:
    import os

    if terminal_fd is None:
        return
    sys.stderr.flush()
    os.dup2(terminal_fd, 2)
    sys.stderr = sys.__stderr__


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log_path, terminal_fd = _chatter_to_log_file(args.verbose)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        **({"filename": str(log_path)} if log_path else {}))
    try:
        return _main(args, log_path)
    finally:
        _restore_stderr(terminal_fd)


def _main(args: argparse.Namespace, log_path: Path | None) -> int:
    import signal

    from sweeper.errors import caused_by_interrupt

    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    interrupted = _stop_on_signals()
    try:
        code = _run(args)
    except BaseException as exc:
        if not interrupted and not caused_by_interrupt(exc):
            raise
        logging.getLogger(__name__).warning("interrupted", exc_info=exc)
        interrupted.append("SIGINT")  # PySpark's own SIGINT handler (SparkContext) raised it, not ours
        code = EXIT_INTERRUPTED
    finally:
        for signum, handler in previous.items():  # main() also runs inside other programs (tests, notebooks)
            signal.signal(signum, handler)
    if interrupted:
        # Whatever the interrupt broke on its way out (a py4j call, a Spark job): one line, exit 130.
        print(f"interrupted ({interrupted[0]}) during `sweeper {args.command}`: "
              f"{_ON_RECORD.get(args.command, '`runs` says `interrupted`')}; run the same command again to continue"
              f"{f' (details: {log_path})' if log_path else ''}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return code


# What an interrupted command leaves on record, for its one line (docs/architecture.md, "A run's lifecycle").
_ON_RECORD = {
    "sweep": "each stage that ended is in `runs` (the stopped one `interrupted`), deletes in delete_journal, "
             "folded in by the next delete run",
    "snapshot": "`runs` says `interrupted`; its rows are never reconciled, and the next snapshot is a new run",
    "emit": "what the broker acknowledged is in `emitted`; the next emit of the run sends only the rest",
    "delete": "deletes in delete_journal, folded in by the next delete run",
    "retention": "every admin action taken is in retention_actions, and `runs` says `interrupted`",
}


def _stop_on_signals() -> list[str]:
    """SIGINT and SIGTERM stop the command as Ctrl-C does (KeyboardInterrupt at the next Python instruction);
    the returned list names the signal once one came."""
    import signal

    came: list[str] = []

    def stop(signum: int, _frame: Any) -> None:
        if not came:
            came.append(signal.Signals(signum).name)
            for name in ("py4j", "py4j.clientserver", "py4j.java_gateway"):  # its complaints while stopping
                logging.getLogger(name).setLevel(logging.CRITICAL)
            raise KeyboardInterrupt

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop)
    return came


def _run(args: argparse.Namespace) -> int:
    from sweeper.errors import Refused, UsageError
    from sweeper.progress import Heartbeat
    from sweeper.tables import DeltaSparkUnavailableError, TableStorageUnavailableError

    _said_config.clear()
    _heartbeat.clear()
    try:
        if args.command in _READ_ONLY:
            return int(args.func(args))
        # A stage is silent for tens of seconds at a time: a line at least every 10 s, terminal or not.
        with Heartbeat().running() as heartbeat:
            _heartbeat.append(heartbeat)
            return int(args.func(args))
    except (ConfigError, DeltaSparkUnavailableError, TableStorageUnavailableError) as exc:
        # A missing jar is a setup problem: its message names the jar and how to get it.
        print(f"configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"usage error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Refused as exc:  # every stage's refusal, the lock, an unreachable or unreadable store (sweeper.errors)
        print(f"refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
