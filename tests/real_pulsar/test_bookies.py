"""The testbed's three bookies on ZooKeeper (issues 44 and 45): each a process of its own registered with its own
HTTP server, every ledger striped over the three (ensemble 3, write quorum 2, ack quorum 2), and one bookie stopped
or killed coming back by pid on its ports and data (harness.testbed.bookie) while the broker and the other two run.

The restarts run after everything else on this testbed (tests/real_pulsar/conftest.py orders this module last, and
its fixture requests the session's `swept`): a bookie down makes the broker close the ledgers it was writing, and
no other test's view of the world should depend on when that happened. The same checks on Oxia are in
test_oxia_testbed.py (tests/support/bookies.py holds them).
"""

from __future__ import annotations

import pytest

from harness.testbed.world import World
from tests.support.bookies import (
    assert_a_bookie_stopped_or_killed_comes_back_by_pid,
    assert_every_bookie_registers_its_http_server,
    assert_ledgers_are_striped_over_the_three_bookies,
)
from tests.support.real_pulsar import COST, Swept

pytestmark = [pytest.mark.real_pulsar, pytest.mark.slow, pytest.mark.timeout(1200)]


def test_every_bookie_registers_its_own_http_server(testbed_world: World) -> None:
    assert_every_bookie_registers_its_http_server(testbed_world.info)


def test_every_ledger_is_striped_over_the_three_bookies(testbed_world: World) -> None:
    assert_ledgers_are_striped_over_the_three_bookies(testbed_world)


def test_a_bookie_stopped_or_killed_comes_back_by_pid_on_its_ports_and_data(testbed_world: World,
                                                                           swept: Swept) -> None:
    seconds = assert_a_bookie_stopped_or_killed_comes_back_by_pid(
        testbed_world, "persistent://public/default/written-after-a-bookie-restart")
    COST.update({f"bookie_{step}_s": value for step, value in seconds.items()})
