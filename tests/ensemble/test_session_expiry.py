"""Issue 45 on the three-node ensemble: a delete frozen past its session while another run takes the lock.

The scenario of tests/test_lock_expiry.py (the issue's reproduction: SIGSTOP of the delete's whole process group,
another delete takes the lock and finishes, SIGCONT) with the sessions held by a production-shaped ensemble, whose
leader expires them and whose members all serve the sweeper. The resumed run deletes nothing more, writes no status
of its own and exits 3; every deletion has one `deleted` row of the run that made it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from tests.support.broker import Broker
from tests.support.zk_ensemble import EnsembleTarget
from tests.test_lock_expiry import frozen_past_its_session

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_a_delete_frozen_past_its_session_on_the_ensemble_stops_and_the_next_holder_settles_it(
        ensemble_target: EnsembleTarget, ensemble_zk: KazooClient, spark: SparkSession, tmp_path: Path,
        broker: Broker) -> None:
    frozen_past_its_session(ensemble_zk, ensemble_target.hosts, spark, tmp_path, broker)
