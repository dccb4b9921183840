"""What every process the testbed starts shares: its JVM options, its config file, its log, and how its start is
watched. Kept apart from harness.testbed.server so that the bookies' own module (harness.testbed.storage) and the
peer cluster (harness.testbed.peer) use the same without importing the testbed's orchestration.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

# Every Pulsar JVM the testbed starts (broker, bookies, ZooKeeper, the peer, the CLI tools) shares two cores with
# the test suite for the suite's whole run: C1 alone and the serial collector roughly halve what they burn
# starting, building the world and idling (measured on one testbed: 31 s -> 18 s of CPU to a built world,
# 10.4 s -> 5.8 s per idle 90 s). pulsar_env.sh's own default extra options are kept; bkenv.sh passes them on to
# the bookies (BOOKIE_GC defaults to PULSAR_GC, BOOKIE_EXTRA_OPTS adds PULSAR_EXTRA_OPTS) and to the bookie tools.
LEAN_JVM_ENV = {
    "PULSAR_GC": "-XX:+UseSerialGC",
    "PULSAR_GC_LOG": "-Xlog:disable",
    "PULSAR_EXTRA_OPTS": "-XX:TieredStopAtLevel=1 -Dpulsar.allocator.exit_on_oom=true "
                         "-Dio.netty.recycler.maxCapacityPerThread=4096",
}


class TestbedError(RuntimeError):
    __test__ = False  # not a pytest test class


def write_conf(template: Path, target: Path, settings: dict[str, str]) -> None:
    """A Pulsar or BookKeeper config file (`key=value` lines) with `settings` replacing (or appended after) its
    keys; everything else as the template has it (the upstream defaults)."""
    remaining = dict(settings)
    lines = []
    for line in template.read_text().splitlines():
        key = line.split("=", 1)[0].strip() if "=" in line and not line.lstrip().startswith("#") else None
        if key in remaining:
            lines.append(f"{key}={remaining.pop(key)}")
        else:
            lines.append(line)
    lines.append("")
    lines.append("# ledger-sweeper testbed")
    lines.extend(f"{key}={value}" for key, value in remaining.items())
    target.write_text("\n".join(lines) + "\n")


def spawn_logged(command: list[str], env: dict[str, str], log_file: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """Start `command` in a session of its own (harness.lifecycle stops its process group), output appended to
    `log_file`. Pulsar's launch scripts `exec` the JVM, so the process's pid is the JVM's."""
    log = open(log_file, "ab")  # noqa: SIM115 - handed to the child process
    try:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                                env=env, start_new_session=True)
    finally:
        log.close()


def log_tail(log_file: Path, chars: int = 4000) -> str:
    try:
        return log_file.read_text(errors="replace")[-chars:]
    except FileNotFoundError:
        return "(no log)"


def check_starting(proc: subprocess.Popen[bytes] | None, log_file: Path, deadline: float, timeout: float,
                   what: str) -> None:
    """Raise, with the log's tail, when `proc` exited or `deadline` passed before it served. `proc` None: a process
    this one did not start (only the deadline is checked)."""
    if proc is not None and proc.poll() is not None:
        raise TestbedError(f"{what} exited with {proc.returncode} before serving; log {log_file}:\n"
                           f"{log_tail(log_file)}")
    if time.monotonic() > deadline:
        raise TestbedError(f"{what} not serving after {timeout:.0f}s; log {log_file}:\n{log_tail(log_file)}")
