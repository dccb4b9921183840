"""Fixtures of the tests on a three-node ZooKeeper ensemble (issue 45): one ensemble per test module, started once and
always stopped; each test gets its own chroot on it, with every member serving when it starts and after it ends.

The modules here run whole on one xdist worker each (their tests share the module's ensemble): tests/conftest.py's
scheduler keeps a module's tests together, and each module's `xdist_group` mark names the same unit.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from harness import zkensemble as ens
from harness.zkensemble import EnsembleInfo
from sweeper.zk import client as zkutil
from tests.support.zk_ensemble import EnsembleTarget, new_chroot, running_ensemble


@pytest.fixture(scope="module")
def zk_ensemble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnsembleInfo]:
    with running_ensemble(tmp_path_factory.mktemp("zk-ensemble")) as info:
        yield info


@pytest.fixture
def ensemble_target(zk_ensemble: EnsembleInfo) -> Iterator[EnsembleTarget]:
    """A fresh chroot on the ensemble, every member serving; after the test, killed members restarted and frozen
    ones thawed, so the next test starts from a whole ensemble whatever this one did."""
    ens.heal(zk_ensemble)
    chroot = new_chroot()
    admin = zkutil.connect(zk_ensemble.connect_string)
    admin.ensure_path(chroot)
    zkutil.close(admin)
    try:
        yield EnsembleTarget(zk_ensemble, chroot)
    finally:
        ens.heal(zk_ensemble)


@pytest.fixture
def ensemble_zk(ensemble_target: EnsembleTarget) -> Iterator[KazooClient]:
    """A kazoo client on the test's chroot, over every member (it rides out the elections the test causes)."""
    client = zkutil.connect(ensemble_target.hosts)
    yield client
    zkutil.close(client)
