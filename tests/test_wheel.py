"""The wheel is the whole product (issue 36): built from pyproject.toml, installed into a fresh virtual environment
outside the checkout (no PYTHONPATH, another working directory), it runs a whole sweep with --execute against a
running sandbox and lists what it deleted; spark-submit.sh ships that installed package to a standalone cluster's
executors and runs a sweep from it. The wheel carries the `sweeper` package only: no harness, no top-level `jobs`.

The fresh environment gets the third-party dependencies without a network: a .pth file names a directory of links
to the dev venv's installed distributions, every one but ledger-sweeper's own (its editable install would put the
checkout on the path).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.sandbox import PORT_SPAN, sandbox_down
from harness.spark_standalone import start_cluster, stop_cluster
from harness.zkserver import free_port_block
from tests.support.config import SHORT_LIVED_JVM

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
# Ours, never linked into the fresh environment: the editable install's metadata and path hooks.
OURS = ("sweeper", "jobs", "harness", "tests", "__editable__", "ledger_sweeper", "__pycache__")

pytestmark = pytest.mark.slow  # a wheel build, a venv, two sandboxes, two sweeps (one on a standalone cluster)


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    work: Path  # the working directory of every command: not the checkout

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a user's shell: nothing that points at the checkout or the dev venv's Python."""
        drop = ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SWEEPER_CONFIG", "SWEEPER_JARS_DIR",
                "VIRTUAL_ENV", "SPARK_HOME")
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return {**env, **extra}

    def run(self, *args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.venv / "bin" / "sweeper"), *args], cwd=self.work, env=self.env(**env),
                              capture_output=True, text=True, timeout=timeout)


def _build_wheel(out: Path) -> Path:
    """From a copy of the sources, as pip would from an sdist: the checkout gets no build/ or egg-info."""
    source = out / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for top in ("sweeper", "jobs", "harness", "schemas", "conf"):
        shutil.copytree(REPO / top, source / top, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(out / "dist"), str(source)], check=True, capture_output=True)
    (wheel,) = (out / "dist").glob("ledger_sweeper-*.whl")
    return wheel


def _outside_env() -> dict[str, str]:
    """This process's environment without PYTHONPATH: a Spark session started earlier in the worker puts the
    checkout on it (sweeper.spark), and pip would then find the checkout's egg-info and install nothing."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _fresh_venv(venv: Path, deps: Path, wheel: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True,
                   env=_outside_env(), cwd=venv.parent)
    deps.mkdir()
    site_dirs = {Path(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")}
    for site in site_dirs:
        for entry in site.iterdir():
            if entry.name.startswith(OURS) or entry.suffix == ".pth" or (deps / entry.name).exists():
                continue
            (deps / entry.name).symlink_to(entry)
    (new_site,) = {Path(p) for p in subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, env=_outside_env(), cwd=venv.parent).stdout.split()}
    (new_site / "_dev_venv_dependencies.pth").write_text(f"{deps}\n")
    # The dev venv's pip installs into the fresh one; --no-index: nothing comes from the network.
    # --ignore-installed: whatever the new environment may see of the checkout, the wheel is what gets installed.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", "--ignore-installed", str(wheel)], check=True, capture_output=True,
                   env=_outside_env(), cwd=venv.parent)
    assert (new_site / "sweeper" / "__init__.py").is_file(), f"the wheel was not installed into {new_site}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(root / "build")
    _fresh_venv(root / "venv", root / "deps", wheel)
    work = root / "work"
    work.mkdir()
    return Installed(wheel, root / "venv", work)


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Path]:
    """A seeded sandbox started with the dev install's harness; its config (with its ports) is home/sweeper.toml."""
    home, port = tmp_path / "sandbox", free_port_block(PORT_SPAN)
    dev = [str(VENV_BIN / "sweeper"), "sandbox"]
    common = ["--home", str(home), "--config", str(REPO / "conf" / "local.toml")]
    try:
        for action in (["up", "--port", str(port)], ["seed", "--topics", "40"]):
            done = subprocess.run([*dev, *action, *common], cwd=REPO, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stdout + done.stderr
        yield home
    finally:
        sandbox_down(home, wipe=True)


def _orphans(home: Path) -> int:
    manifest = json.loads((home / "manifest.json").read_text())
    return sum(1 for v in manifest["not_in_use"].values() if v["status"] == "orphan")


def test_the_wheel_holds_the_sweeper_package_alone_with_its_data(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"sweeper"}
    assert not [n for n in names if "harness" in n.split("/")[:-1] or "/sandbox/" in n or "/testbed/" in n]
    assert {"sweeper/jobs/sweep.py", "sweeper/resources/pending_delete_ledger_info.avsc",
            "sweeper/resources/cluster.example.toml"} <= set(names)


def test_the_packaged_data_agrees_with_the_repository_copies() -> None:
    """The design card keeps schemas/ and conf/ at the top of the repository; the package ships copies."""
    assert (REPO / "sweeper" / "resources" / "pending_delete_ledger_info.avsc").read_text() == (
        REPO / "schemas" / "avro" / "pending_delete_ledger_info.avsc").read_text()
    assert (REPO / "sweeper" / "resources" / "cluster.example.toml").read_text() == (
        REPO / "conf" / "cluster.example.toml").read_text()


def test_the_installed_package_sweeps_a_sandbox_with_execute(installed: Installed, sandbox: Path,
                                                             tmp_path: Path) -> None:
    where = subprocess.run([str(installed.python), "-c", "import sweeper, sys; print(sweeper.__file__); "
                            "print(any(p.startswith(sys.argv[1]) for p in sys.path))", str(REPO)],
                           cwd=installed.work, env=installed.env(), capture_output=True, text=True, check=True)
    module_file, checkout_on_path = where.stdout.split()
    assert Path(module_file).is_relative_to(installed.venv) and checkout_on_path == "False", where.stdout

    version = installed.run("--version")
    assert version.returncode == 0 and version.stdout.strip() == "sweeper 0.1.0", version.stderr
    helped = installed.run("--help")
    assert "init-config" in helped.stdout and not {"sandbox", "testbed", "audit"} & set(
        helped.stdout.split("{")[1].split("}")[0].split(",")), helped.stdout
    assert "--sandbox" not in installed.run("sweep", "--help").stdout
    example = installed.run("init-config")
    assert example.stdout == (REPO / "conf" / "cluster.example.toml").read_text()

    tables = tmp_path / "tables"
    swept = installed.run("sweep", "--config", str(sandbox / "sweeper.toml"), "--tables", str(tables), "--execute",
                          "--json")
    assert swept.returncode == 0, swept.stdout[-2000:] + swept.stderr[-4000:]
    assert "Traceback" not in swept.stderr
    summary = json.loads(swept.stdout.strip().splitlines()[-1])
    stages = summary["stages"]
    assert stages["reconcile"]["candidate.ledger"] == _orphans(sandbox) > 0
    assert stages["emit"]["published"] == stages["reconcile"]["candidate"]
    assert stages["delete"]["deleted"] == stages["reconcile"]["candidate"]

    shown = installed.run("show", summary["run_id"], "deletes", "--tables", str(tables), "--format", "json")
    assert shown.returncode == 0, shown.stderr
    rows = [json.loads(line) for line in shown.stdout.splitlines() if line.strip()]
    assert sum(1 for r in rows if r["outcome"] == "deleted") == stages["delete"]["deleted"]


def test_spark_submit_ships_the_installed_package_to_a_standalone_cluster(installed: Installed, sandbox: Path,
                                                                          tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path / "spark-standalone", workers=1, cores=1, memory="1g", env={"PYTHONPATH": ""})
    try:
        env = installed.env(
            SWEEPER_PYTHON=str(installed.python), PYSPARK_PYTHON=str(installed.python),
            SPARK_SUBMIT=str(VENV_BIN / "spark-submit"), SPARK_MASTER=cluster.master_url,
            SWEEPER_BUILD_DIR=str(tmp_path / "build"), DELTA_JARS="", S3A_JARS="",
            SPARK_EXTRA_ARGS="--conf spark.executor.memory=768m --conf spark.driver.memory=1g "
                             "--conf spark.ui.enabled=false --conf spark.executor.cores=1 "
                             f"--conf spark.driver.extraJavaOptions={SHORT_LIVED_JVM} "
                             f"--conf spark.executor.extraJavaOptions={SHORT_LIVED_JVM}")
        done = subprocess.run(
            [str(REPO / "spark-submit.sh"), "sweep", "--config", str(sandbox / "sweeper.toml"), "--tables",
             str(tmp_path / "tables"), "--execute", "--json"],
            cwd=installed.work, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        # The zip was built from the installed package, not from the checkout.
        site = next(installed.venv.glob("lib/python*/site-packages"))
        assert f"files of {site / 'sweeper'}" in done.stderr, done.stderr[-2000:]
        shipped = zipfile.ZipFile(tmp_path / "build" / "ledger_sweeper.zip").namelist()
        assert {n.split("/")[0] for n in shipped} == {"sweeper"}
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        stages = summary["stages"]
        assert stages["reconcile"]["candidate.ledger"] == _orphans(sandbox) > 0
        assert stages["delete"]["deleted"] == stages["reconcile"]["candidate"]
    finally:
        stop_cluster(cluster)
