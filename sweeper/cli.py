"""`sweeper` command line: the pipeline stages and the commands that read their tables.

Exit codes (for schedulers): 0 success, 1 unexpected error, 2 usage or configuration error,
3 a stage refused to run (wrong root, unreachable server or broker, a ZooKeeper certificate, login or
permission refused, failed gate, circuit breaker, a system topic that is not as configured, another
delete run holding the lock), 4 partial: some
deletes failed and wait in the retry queue (or were dead-lettered); rerun later.

Development commands (the sandbox, the testbed, `sweep --sandbox`, `audit`) are not part of the product: they come
from plugins registered under the `ledger_sweeper.cli` entry-point group (a checkout installed for development
registers `harness.cli_plugin`). A plugin whose module is not installed (the wheel carries no harness) is skipped.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sweeper import config as config_mod
from sweeper.config import SweeperConfig
from sweeper.errors import (  # the exit codes, with the errors they map from (one place: sweeper.errors)
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_REFUSED,
    EXIT_USAGE,
    ConfigError,
)
from sweeper.report.chatter import chatter_to_log_file, restore_stderr

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_PARTIAL", "EXIT_REFUSED", "EXIT_USAGE"]  # a `Refused`
# gives exit 3, not a return here: EXIT_REFUSED is for the scripts and tests that read the codes from the CLI

# The stages `sweep --until` names, in order (sweeper.pipeline.STAGES; spelled here so parsing imports no Spark).
SWEEP_STAGES = ("snapshot", "reconcile", "retention_debt", "emit", "delete", "reclaim")
PLUGIN_GROUP = "ledger_sweeper.cli"  # entry points: `register(cli: CliPlugins)` adds commands, flags, pre-hooks


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
_NO_HEARTBEAT = _READ_ONLY | {"init-config"}
_said_config: list[str] = []  # once per command, however many times its parts load the config
_heartbeat: list[Any] = []  # the running command's (sweeper.report.progress.Heartbeat), told of the Spark session


def _config_choice(args: argparse.Namespace) -> config_mod.ConfigChoice:
    # A plugin's command whose --home holds a config (the sandbox's sweeper.toml) says so with `home_holds_config`.
    home = getattr(args, "home", None) if getattr(args, "home_holds_config", False) else None
    sandbox_config = Path(home) / "sweeper.toml" if home else config_mod.SANDBOX_CONFIG
    return config_mod.find_config(args.config, sandbox_config=sandbox_config)


def load_config(args: argparse.Namespace) -> SweeperConfig:
    choice = _config_choice(args)
    if choice.path is None and not (args.command in _READ_ONLY and getattr(args, "tables", None)):
        raise ConfigError(f"no config found (searched {config_mod.search_order()}): pass --config PATH "
                          "(`sweeper init-config` prints a template), or in a development checkout run `sweeper "
                          "sandbox up` for the sandbox")
    if choice.path is None:
        # A read of named tables: only the root matters, none of the cluster settings a stage would check.
        import dataclasses

        return SweeperConfig(tables=dataclasses.replace(SweeperConfig().tables, root=args.tables))
    if not _said_config and args.command not in _READ_ONLY:
        print(choice.describe(), flush=True)  # which cluster a command acts on is never a guess
        _said_config.append(str(choice.path))
    cfg = config_mod.load(choice.path)
    if args.command not in _READ_ONLY and getattr(args, "check_credentials", True):
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


def print_counts(title: str, counts: dict[str, int]) -> None:
    """A titled table of counts, as every stage's summary prints its own (sweeper.report.summaries)."""
    from sweeper.report.summaries import counts_lines

    print("\n".join(counts_lines(title, counts)))


def _check_credentials(cfg: SweeperConfig) -> None:
    """Every secret the config names is read now, before Spark starts: an unset variable or an unreadable file is
    the operator's configuration (exit 2, in a second), not a refusal 20 seconds into a run."""
    from sweeper.broker.errors import SystemTopicError
    from sweeper.broker.system_topic import read_token
    from sweeper.connections import Connections

    Connections.from_config(cfg)  # ZooKeeper's TLS/SASL/digest secrets, for every store
    try:
        read_token(cfg.system_topic)
    except SystemTopicError as exc:
        raise ConfigError(str(exc)) from None


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


def open_stage(args: argparse.Namespace) -> tuple[SweeperConfig, Any, Any]:
    """Every stage command's opening: a plugin's preparation (`cli.before`), the config, then Spark and the table
    store. Returns (config, spark session, table store)."""
    for hook in getattr(args, "before", None) or ():  # e.g. `sweep --sandbox` starts and seeds the sandbox
        hook(args)
    cfg = load_config(args)
    spark, store = _session(cfg)
    return cfg, spark, store


def _say(summary: Any, args: argparse.Namespace, *notes: str, **payload: Any) -> None:
    """A single-stage command's output: its result's one summary (sweeper.report.summaries), the command's own
    notes, and with --json the result's payload (plus what the command adds) as the last line."""
    for line in [*summary.command_lines(), *notes]:
        print(line)
    if args.json:
        print(json.dumps({**summary.payload, **payload}))


def _run_step(name: str, args: argparse.Namespace, cfg: SweeperConfig, spark: Any, store: Any, run_id: str | None,
              *notes: str, **options: Any) -> Any:
    """A single-stage command's stage, through the sweep's own step (`pipeline.STEPS`): the same stage, the same
    `runs` bookkeeping, the same one summary of its result, then the command's notes."""
    from sweeper.pipeline import STEPS, StageCall

    step = STEPS[name]
    result = step.run(StageCall(spark, cfg, store, run_id, bool(getattr(args, "execute", False)), print, options))
    _say(step.summarize(result), args, *notes)
    return result


def cmd_snapshot(args: argparse.Namespace) -> int:
    cfg, spark, store = open_stage(args)
    _run_step("snapshot", args, cfg, spark, store, args.run_id)
    return EXIT_OK


def cmd_reconcile(args: argparse.Namespace) -> int:
    from sweeper.runs import resolve_run

    cfg, spark, store = open_stage(args)
    run_id = resolve_run(store, args.run_id, "snapshot", "run `sweeper snapshot` first")
    _run_step("reconcile", args, cfg, spark, store, run_id, "dry run: nothing was deleted", skip_gates=args.skip_gates)
    return EXIT_OK


def cmd_retention_debt(args: argparse.Namespace) -> int:
    """The retention-debt stage alone, on a reconciled run: what `sweep` reports after reconcile."""
    from sweeper.runs import resolve_run

    cfg, spark, store = open_stage(args)
    run_id = resolve_run(store, args.run_id, "reconcile", "run `sweeper reconcile` first")
    print(f"[retention] started on run {run_id}: retention debt (unloaded topics, idle cursors)", flush=True)
    _run_step("retention_debt", args, cfg, spark, store, run_id,
              "dry run: nothing was loaded or deleted (`sweeper retention` plans the repair, `--execute` acts)")
    return EXIT_OK


def cmd_emit(args: argparse.Namespace) -> int:
    from sweeper.runs import resolve_run

    cfg, spark, store = open_stage(args)
    run_id = resolve_run(store, args.run_id, "reconcile", "run `sweeper reconcile` first")
    _run_step("emit", args, cfg, spark, store, run_id)
    return EXIT_OK


def cmd_delete(args: argparse.Namespace) -> int:
    from sweeper.delete.errors import DeleteRefused
    from sweeper.delete.inputs import read_operator_list
    from sweeper.delete.stage import describe
    from sweeper.errors import UsageError
    from sweeper.pipeline import STEPS, StageCall, riding_after
    from sweeper.report.summaries import is_partial
    from sweeper.runs import resolve_run

    if args.from_json:
        # The operator's file is checked before Spark starts: a typo in it is a usage error (exit 2), not a run.
        try:
            listed = read_operator_list(args.from_json)
        except DeleteRefused as exc:
            raise UsageError(str(exc)) from None
        if not listed:
            raise UsageError(f"{args.from_json} lists no ledgers: nothing to delete")
    cfg, spark, store = open_stage(args)
    if args.from_json:
        run_id = args.run_id or f"manual-{Path(args.from_json).stem}"
    elif args.from_topic:
        run_id = args.run_id or f"topic-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    else:
        run_id = resolve_run(store, args.run_id, "emit", "run `sweeper emit` first")
    call = StageCall(spark, cfg, store, run_id, args.execute, print,
                     {"from_json": args.from_json, "from_topic": args.from_topic})
    # What `sweep` runs after an executed delete (reclaim, when enabled), through the same step: its `before`
    # (the bookies' baseline) precedes the delete, its report follows it.
    follower = riding_after("delete", cfg, args.execute)
    if follower is not None and follower.before is not None:
        follower.before(call)
    step = STEPS["delete"]
    result = step.run(call)
    if args.from_json:
        for item in result.results:
            print(describe(item))
    summary = step.summarize(result)
    print("\n".join(summary.command_lines()))
    more: dict[str, Any] = {}
    if follower is not None:
        done = follower.run(StageCall(spark, cfg, store, run_id, args.execute, print))
        print("\n".join(follower.summarize(done).sweep_lines()))  # as `sweep` says it: a step that rode along
        more[follower.name] = done.counts.as_row()
    if args.json:
        print(json.dumps({**summary.payload, **more}))
    return EXIT_PARTIAL if is_partial(result) else EXIT_OK


def cmd_reclaim(args: argparse.Namespace) -> int:
    """Measure again what a run's deletes gave back; with --execute, first ask each bookie for one GC."""
    from sweeper.runs import resolve_run

    cfg, _, store = open_stage(args)
    run_id = resolve_run(store, args.run_id, "delete", "`sweeper runs` lists the runs", recorded=True)
    # Not the sweep's choice: here --execute itself asks for the GC, whatever [reclaim] trigger_gc says.
    _run_step("reclaim", args, cfg, None, store, run_id, *(() if args.execute else (
        "measured only: pass --execute to ask each bookie that held deleted data for one GC",)), trigger=args.execute)
    return EXIT_OK


def cmd_retention(args: argparse.Namespace) -> int:
    """Repair retention debt through the broker's admin REST API: a dry run unless --execute."""
    from sweeper import runs
    from sweeper.errors import Refused

    cfg, _, store = open_stage(args)
    plan = runs.resolve_run(store, args.run_id, "retention_debt", "run `sweeper sweep` (or reconcile) first")
    result = _run_step("retention_repair", args, cfg, None, store, f"retention-{runs.new_run_id()}",
                       plan_run_id=plan)
    if result.stopped:
        raise Refused(result.stopped)
    return EXIT_PARTIAL if result.counts.failed else EXIT_OK


def cmd_dlq(args: argparse.Namespace) -> int:
    from sweeper.delete.inputs import dead_letters, redrive
    from sweeper.report.console import read_store

    cfg = load_config(args)
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
    from sweeper.report.console import read_store, render, run_rows, run_summaries

    args.limit = _limit(args)
    store = read_store(load_config(args))
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
    from sweeper.report.console import read_store, render, show_rows

    args.limit = _limit(args)
    store = read_store(load_config(args))
    filters = {"reason": args.reason, "status": args.status, "tenant": args.tenant, "namespace": args.namespace}
    rows, view = show_rows(store, args.run, args.what, filters, args.limit)
    sys.stdout.write(render(rows, view.columns, args.format))
    if args.format == "table":
        limited = f" (first {args.limit}: --limit 0 shows all)" if args.limit and len(rows) == args.limit else ""
        print(f"{len(rows)} {args.what} row{'s' if len(rows) != 1 else ''} of run {args.run}{limited}")
    return EXIT_OK


def cmd_sweep(args: argparse.Namespace) -> int:
    """Run the stages in order with one run id, stopping at the first refusal."""
    from sweeper.pipeline import sweep

    if args.execute and args.until not in (None, "delete", "reclaim"):
        # Refused before anything starts: doing more than the user named (deleting) is never the resolution.
        print(f"usage error: --execute deletes, but --until {args.until} stops before the delete: drop --execute "
              f"to stop after {args.until}, or drop --until to delete", file=sys.stderr)
        return EXIT_USAGE
    cfg, spark, store = open_stage(args)
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

    from sweeper.report.console import FORMATS, VIEWS

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

    sweep = sub.add_parser("sweep", help="run the pipeline stages in order")
    stage_options(sweep)
    common(sweep)
    sweep.add_argument("--until", default=None, choices=SWEEP_STAGES,
                       help="last stage to run (default: retention_debt, a dry run that reports; emit marks ledgers "
                            "for deletion; delete without --execute only reports; reclaim measures what the bookies "
                            "gave back, which an executed delete also does when [reclaim] is enabled)")
    sweep.add_argument("--execute", action="store_true",
                       help="run every stage and really delete (with --until, only --until delete or reclaim)")
    sweep.add_argument("--allow-no-brokers", action="store_true",
                       help="pass the liveness gate with no broker registered (a cleanup with brokers stopped)")
    sweep.set_defaults(func=cmd_sweep)

    init = sub.add_parser("init-config", help="print (or write) an example config for a real cluster to edit")
    init.add_argument("--out", help="write it to this file (refused if it exists) instead of printing it")
    init.set_defaults(func=cmd_init_config)

    _load_plugins(CliPlugins(sub, dict(sub.choices), common, stage_options))
    return parser


@dataclass
class CliPlugins:
    """What a plugin's `register(cli)` gets: add commands, add flags to a product command, and run a hook before it
    (`cli.before("sweep", hook)`: the command calls `hook(args)` after checking its own flags, in `open_stage` before
    loading the config, so the hook may set the connection overrides `load_config` reads: zookeeper, s3_endpoint,
    pulsar_urls, tables_s3_endpoint)."""

    subcommands: Any  # argparse's _SubParsersAction
    commands: dict[str, argparse.ArgumentParser]
    common: Callable[[argparse.ArgumentParser], None]  # --config and -v
    stage_options: Callable[[argparse.ArgumentParser], None]
    loaded: list[str] = field(default_factory=list)

    def add_command(self, name: str, func: Callable[[argparse.Namespace], int], **kwargs: Any
                    ) -> argparse.ArgumentParser:
        parser = self.subcommands.add_parser(name, **kwargs)
        parser.set_defaults(func=func)
        self.commands[name] = parser
        return parser

    def command(self, name: str) -> argparse.ArgumentParser:
        return self.commands[name]

    def before(self, name: str, hook: Callable[[argparse.Namespace], None]) -> None:
        parser = self.commands[name]
        parser.set_defaults(before=[*(parser.get_default("before") or ()), hook])


def plugin_entry_points() -> list[Any]:
    """The entry points of PLUGIN_GROUP in every installed distribution, once each. Not `entry_points(group=...)`,
    which reads one distribution per name: a stale `ledger_sweeper.egg-info` left in a checkout that is first on
    sys.path (pytest puts it there) would hide the dev install's own metadata, and with it the plugin."""
    from importlib.metadata import distributions

    found: dict[tuple[str, str], Any] = {}
    for dist in distributions():
        for point in dist.entry_points:
            if point.group == PLUGIN_GROUP:
                found.setdefault((point.name, point.value), point)
    return list(found.values())


def _load_plugins(cli: CliPlugins) -> None:
    """Every plugin of the entry-point group; one whose module is not installed is skipped without a word, one that
    fails otherwise is named on stderr and skipped: the product's commands never depend on a plugin."""
    for point in plugin_entry_points():
        try:
            register = point.load()
        except ModuleNotFoundError as exc:
            if exc.name and (point.module == exc.name or point.module.startswith(exc.name + ".")):
                continue  # e.g. harness.cli_plugin from a wheel, which carries no harness
            print(f"warning: CLI plugin {point.name} ({point.value}) not loaded: {exc}", file=sys.stderr)
            continue
        except Exception as exc:
            print(f"warning: CLI plugin {point.name} ({point.value}) not loaded: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            continue
        register(cli)
        cli.loaded.append(point.name)


def cmd_init_config(args: argparse.Namespace) -> int:
    """The example config for a real cluster, shipped in the package: printed, or written to --out."""
    from sweeper import resources
    from sweeper.errors import UsageError

    text = resources.read_text(resources.EXAMPLE_CONFIG)
    if not args.out:
        sys.stdout.write(text)
        return EXIT_OK
    out = Path(args.out)
    if out.exists():
        raise UsageError(f"{out} exists: not overwritten (remove it, or pass another --out)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"example config written to {out}: edit it, then `sweeper sweep --config {out}` (a dry run)")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log_path, terminal_fd = chatter_to_log_file(getattr(args, "verbose", False))
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        **({"filename": str(log_path)} if log_path else {}))
    try:
        return _main(args, log_path)
    finally:
        restore_stderr(terminal_fd)


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
    from sweeper.errors import SweeperError, terminal_line
    from sweeper.report.progress import Heartbeat

    _said_config.clear()
    _heartbeat.clear()
    try:
        if args.command in _NO_HEARTBEAT:
            return int(args.func(args))
        # A stage is silent for tens of seconds at a time: a line at least every 10 s, terminal or not.
        with Heartbeat().running() as heartbeat:
            _heartbeat.append(heartbeat)
            return int(args.func(args))
    except SweeperError as exc:
        # A usage or configuration error (2: a missing jar names the jar and how to get it) or a refusal (3: every
        # stage's, the lock, an unreachable or unreadable store): one line, the code sweeper.errors gives it.
        if exc.exit_code == EXIT_ERROR:
            raise  # an error nobody classified: the trace goes to the log file
        print(terminal_line(exc), file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
