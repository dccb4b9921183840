"""Test helpers that are not fixtures (the fixtures are in tests/conftest.py, tests/real_pulsar/conftest.py and
tests/ensemble/conftest.py).

- `config`: BASE_CONFIG, the JVM options of short-lived Spark processes, ZkTarget (a test's chroot).
- `seeded`: a sandbox seeded into a chroot and snapshotted (`seed_and_snapshot`, the `seeded_snapshot` fixture's
  body), the config it snapshots with (`sandbox_config`), and `planned_delete` (seeded, reconciled, emitted).
- `broker`: the sandbox's Pulsar endpoint and admin API as one restartable broker; the deletion topic's name.
- `ledgers`: ledger znodes as BookKeeper writes them, for tests that make their own.
- `tables`: rows of every column type and an order-free form to compare them, for the table-store tests.
- `secure_zk`, `tls_certs`: a ZooKeeper with TLS and SASL users; a throwaway certificate authority.
- `s3_faults`: a fault-injecting proxy in front of moto; `admin_server`: a stand-in for a broker's admin REST API.
- `zk_faults`: a TCP proxy in front of ZooKeeper that drops a multi's answer (or any request's); `peers`: a peer
  cluster's metadata.
- `zk_ensemble`: the three-node ZooKeeper ensemble (harness.zkensemble) as the leader-loss tests use it: a chroot on
  it, the leader killed and its election timed, the leader killed at the instant a chosen request is answered
  (`AimedElection`), requests counted on the members, the CLI run and its exit judged.
- `real_pulsar`: what the real-Pulsar tests share besides their fixtures (grace period, costs, records).
- `testbed_session`: the real-Pulsar testbed's life in a session, serial or served by an xdist controller.

Test modules import from here, never from one another or from a conftest.

Running the tests: `pytest -q -n 2 --dist loadgroup` (README's command) runs everything on two xdist workers, the
real Apache Pulsar testbed included (`SWEEPER_SKIP_REAL_PULSAR=1` skips that part; `testbed_session` serves it to
the workers); `pytest -q` runs the same serially. `pytest -m "not integration" -q` runs the unit tests
alone in under a minute: classification, safety rules, retry policy, codecs, config parsing and the like, with no
ZooKeeper, Spark, S3, broker or other process started. tests/conftest.py marks `integration` every test that
uses a server or Spark fixture, is `slow` or runs against the testbed; a test that starts a server or a process
in its own body carries `@pytest.mark.integration`. `-m "not slow"` leaves out only the end-to-end cases.
"""
