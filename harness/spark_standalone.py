"""A throwaway Spark standalone cluster on loopback: one master and N workers, each its own JVM.

For the tests and the benchmarks only (production submits to its own YARN, Kubernetes or
standalone cluster). The daemons are pyspark's own launch classes (`org.apache.spark.deploy.master.
Master`, `...worker.Worker`) started with `java -cp <pyspark>/jars/*`, so executors are separate
JVMs with their own Python workers, as on a real cluster: a task that writes to a local path the
driver later reads, or state kept in the driver's Python process, no longer works by accident.
Every port is a free loopback port; everything is stopped by process group, never by name.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from harness.lifecycle import kill_process, terminate, wait_gone
from harness.zkserver import free_port

SPARK_HOME = str(Path(pyspark.__file__).resolve().parent)
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class SparkClusterError(RuntimeError):
    pass


@dataclass(frozen=True)
class Daemon:
    name: str
    pid: int
    log: str
    work_dir: str = ""


@dataclass(frozen=True)
class StandaloneCluster:
    master_url: str  # spark://127.0.0.1:<port>
    web_url: str  # the master's JSON status: f"{web_url}/json/"
    master: Daemon
    workers: tuple[Daemon, ...] = field(default_factory=tuple)

    def status(self) -> dict:
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as reply:
            return json.loads(reply.read())

    def processes(self) -> dict[str, list[tuple[int, str]]]:
        """Per worker: (pid, command line) of every process it started (executor JVMs and their
        Python workers), found by process group: each worker leads its own group."""
        groups = {w.pid: w.name for w in self.workers}
        found: dict[str, list[tuple[int, str]]] = {name: [] for name in groups.values()}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                pgid = int(stat.rsplit(")", 1)[1].split()[2])
                if pgid in groups and int(entry.name) != pgid:
                    cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    found[groups[pgid]].append((int(entry.name), cmdline))
            except (OSError, IndexError, ValueError):
                continue
        return found


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise SparkClusterError("java not found: install a JRE (apt-get install default-jre-headless)")
    return java


def _daemon_env(extra: Mapping[str, str]) -> dict[str, str]:
    # SPARK_SCALA_VERSION: bin/load-spark-env.sh sets it for spark-submit; a worker started without
    # the scripts needs it to build executor command lines (spark-launcher's getScalaVersion).
    env = {**os.environ, "SPARK_HOME": SPARK_HOME, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_SCALA_VERSION": "2.13",
           **extra}
    # The daemons must not pick up a gateway meant for some pyspark driver.
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("PYSPARK_GATEWAY_SECRET", None)
    return env


def _spawn(name: str, args: list[str], log_path: Path, env: dict[str, str], heap: str) -> Daemon:
    classpath = os.pathsep.join([str(Path(SPARK_HOME) / "conf"), str(Path(SPARK_HOME) / "jars" / "*")])
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([_java(), f"-Xmx{heap}", "-cp", classpath, *args], stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return Daemon(name, proc.pid, str(log_path))


def start_cluster(base_dir: str | os.PathLike[str], workers: int = 2, cores: int = 1, memory: str = "1g",
                  env: Mapping[str, str] | None = None, timeout: float = 90.0) -> StandaloneCluster:
    """Start a master and `workers` workers (each `cores` cores, `memory` for its executors).

    `env` goes to every daemon and so to the executors they launch (e.g. AWS credentials: the
    executors' own credential chain, as on a cluster's nodes).
    """
    base = Path(base_dir)
    daemon_env = _daemon_env(env or {})
    port, web_port = free_port(), free_port()
    master = _spawn("master", [MASTER_CLASS, "--host", "127.0.0.1", "--port", str(port), "--webui-port",
                               str(web_port)], base / "master.log", daemon_env, "512m")
    cluster = StandaloneCluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web_port}", master)
    started: list[Daemon] = []
    try:
        _wait(cluster, 0, timeout)
        for i in range(workers):
            work_dir = base / f"worker-{i}"
            work_dir.mkdir(parents=True, exist_ok=True)
            # Each worker's executors get their own temporary and scratch space, apart from the driver's.
            worker_env = {**daemon_env, "SPARK_WORKER_DIR": str(work_dir), "SPARK_LOCAL_DIRS": str(work_dir / "local"),
                          "TMPDIR": str(work_dir / "tmp")}
            (work_dir / "tmp").mkdir(exist_ok=True)
            daemon = _spawn(f"worker-{i}", [WORKER_CLASS, "--host", "127.0.0.1", "--port", str(free_port()),
                                            "--webui-port", str(free_port()), "--cores", str(cores), "--memory",
                                            memory, "--work-dir", str(work_dir), cluster.master_url],
                            base / f"worker-{i}.log", worker_env, "512m")
            started.append(Daemon(daemon.name, daemon.pid, daemon.log, str(work_dir)))
        cluster = StandaloneCluster(cluster.master_url, cluster.web_url, master, tuple(started))
        _wait(cluster, workers, timeout)
        return cluster
    except BaseException:
        stop_cluster(StandaloneCluster(cluster.master_url, cluster.web_url, master, tuple(started)))
        raise


def _wait(cluster: StandaloneCluster, workers: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        for daemon in (cluster.master, *cluster.workers):
            try:
                os.kill(daemon.pid, 0)
                with open(f"/proc/{daemon.pid}/stat") as stat:
                    if stat.read().split()[2] == "Z":
                        raise ProcessLookupError
            except (ProcessLookupError, FileNotFoundError):
                raise SparkClusterError(f"Spark {daemon.name} exited; log {daemon.log}:\n"
                                        + Path(daemon.log).read_text(errors="replace")[-2000:]) from None
        try:
            status = cluster.status()
            alive = int(status.get("aliveworkers", len([w for w in status.get("workers", [])
                                                         if w.get("state") == "ALIVE"])))
            if status.get("status") == "ALIVE" and alive >= workers:
                return
            last = f"{alive} of {workers} workers alive"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.5)
    raise SparkClusterError(f"Spark standalone cluster at {cluster.master_url} not ready after {timeout:.0f}s "
                            f"({last}); logs in {Path(cluster.master.log).parent}")


def stop_cluster(cluster: StandaloneCluster, timeout: float = 20.0) -> None:
    """Stop the workers (and their executors), then the master; by process group, then SIGKILL."""
    daemons = [*cluster.workers, cluster.master]
    for daemon in daemons:
        terminate(daemon.pid)
    deadline = time.monotonic() + timeout
    for daemon in daemons:
        if not wait_gone(daemon.pid, max(0.0, deadline - time.monotonic())):
            kill_process(daemon.pid)
