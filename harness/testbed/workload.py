"""The testbed's workload: topics, subscriptions, schemas, compaction, delayed messages, a transaction,
a shadow topic and an offload, written through the real `pulsar-client` and the broker's admin REST.

Everything lives in the tenant `sweep`. `run_workload` returns what each topic holds, so the tests can
prove after a sweep that every topic still serves every message it held.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulsar
from pulsar.schema import AvroSchema, Integer, Record, String

from harness.testbed.admin import Admin, AdminError
from harness.testbed.processes import LEAN_JVM_ENV
from harness.testbed.server import SUPERUSER, TestbedInfo

TENANT = "sweep"
NAMESPACE = f"{TENANT}/app"
CHURN_NAMESPACE = f"{TENANT}/churn"


def topic(local: str, namespace: str = NAMESPACE) -> str:
    return f"persistent://{namespace}/{local}"


PLAIN = topic("plain")
PARTITIONED = topic("orders")
ODD_NAME = topic("odd:name with space%x")
SCHEMA_EVOLVE = topic("schema-evolve")
COMPACT_TWICE = topic("compact-twice")
COMPACT_STALE = topic("compact-stale-pointer")
DELAYED = topic("delayed")
TXN = topic("txn")
SHADOW_SOURCE = topic("shadow-src")
SHADOW = topic("shadow-copy")
OFFLOADED = topic("offloaded")
DELAY_SECONDS = 300  # delivered late in the test session: bucket snapshots exist while the sweeper scans
DELAYED_SUBSCRIPTION = "delayed-sub"


# Three versions of one Avro record `Reading` (one name: Avro resolves records by name), each adding a field.
SCHEMA_VERSIONS: tuple[type[Record], ...] = (
    type("Reading", (Record,), {"sensor": String()}),
    type("Reading", (Record,), {"sensor": String(), "value": Integer()}),
    type("Reading", (Record,), {"sensor": String(), "value": Integer(), "unit": String()}),
)


@dataclass
class WorkloadResult:
    topics: list[str] = field(default_factory=list)  # every topic the workload wrote (partitions named)
    delayed_count: int = 0
    delayed_due_at: float = 0.0  # wall clock when every delayed message is due
    compacted_topics: list[str] = field(default_factory=list)
    txn_messages: int = 0


def client_for(info: TestbedInfo) -> pulsar.Client:
    # Errors only: the workload may run outside pytest's capture (an xdist controller prepares the testbed), where
    # the C++ client's INFO lines would fill the terminal.
    return pulsar.Client(info.service_url, authentication=pulsar.AuthenticationToken(info.superuser_token()),
                         operation_timeout_seconds=30, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


def admin_for(info: TestbedInfo) -> Admin:
    return Admin(info.admin_url, info.superuser_token())


def produce(client: pulsar.Client, name: str, count: int, prefix: str = "m", key_mod: int = 0,
            schema: Any = None, make: Any = None, **send: Any) -> None:
    kwargs: dict[str, Any] = {"batching_enabled": False}
    if schema is not None:
        kwargs["schema"] = schema
    producer = client.create_producer(name, **kwargs)
    try:
        for i in range(count):
            payload = make(i) if make is not None else f"{prefix}-{i}".encode()
            extra = dict(send)
            if key_mod:
                extra["partition_key"] = f"k{i % key_mod}"
            producer.send(payload, **extra)
    finally:
        producer.close()


def consume_ack(client: pulsar.Client, name: str, subscription: str, count: int) -> None:
    consumer = client.subscribe(name, subscription, initial_position=pulsar.InitialPosition.Earliest)
    try:
        for _ in range(count):
            consumer.acknowledge(consumer.receive(30_000))  # patient: right after a broker restart, under load
    finally:
        consumer.close()


def setup_tenant(admin: Admin, cluster: str) -> None:
    admin.ensure_tenant(TENANT, cluster)
    for namespace in (NAMESPACE, CHURN_NAMESPACE):
        admin.ensure_namespace(namespace)
        # Schema evolution here is about schema ledgers, not compatibility rules.
        admin.namespace_policy(namespace, "schemaCompatibilityStrategy", "ALWAYS_COMPATIBLE", method="PUT")


def run_workload(info: TestbedInfo, client: pulsar.Client, admin: Admin,
                 ledger_exists: Callable[[int], bool]) -> WorkloadResult:
    """The steady part of the world: what a sweep must leave exactly as it is."""
    result = WorkloadResult()
    setup_tenant(admin, info.cluster)

    # Non-partitioned topic, two subscriptions (one with a cursor ledger, one idle).
    admin.create_topic(PLAIN)
    for sub in ("acked", "idle"):
        admin.create_subscription(PLAIN, sub)
    produce(client, PLAIN, 35)
    consume_ack(client, PLAIN, "acked", 17)
    result.topics.append(PLAIN)

    # Partitioned topic, keyed, one subscription on every partition.
    admin.create_partitioned(PARTITIONED, 3)
    admin.create_subscription(PARTITIONED, "workers")
    produce(client, PARTITIONED, 60, key_mod=7)
    consume_ack(client, PARTITIONED, "workers", 25)
    result.topics.extend(f"{PARTITIONED}-partition-{i}" for i in range(3))

    # A name with ':', a space and '%' (the managed ledger name is URL-encoded: odd%3Aname+with+space%25x).
    admin.create_topic(ODD_NAME)
    produce(client, ODD_NAME, 25)  # the client creates the subscription: REST decodes '%' twice
    consume_ack(client, ODD_NAME, "s:1 %", 9)
    result.topics.append(ODD_NAME)

    # Three schema versions, each in its own schema ledger.
    for version, cls in enumerate(SCHEMA_VERSIONS):
        produce(client, SCHEMA_EVOLVE, 4, schema=AvroSchema(cls),
                make=lambda i, cls=cls, v=version: cls(sensor=f"v{v}-{i}"))
    result.topics.append(SCHEMA_EVOLVE)

    # Delayed messages on a Shared subscription: the bucket tracker (PIP-195) seals buckets into
    # bucket-snapshot ledgers named in the cursor's properties.
    consumer = client.subscribe(DELAYED, DELAYED_SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest)
    produce(client, DELAYED, 40, prefix="late", deliver_after=__import__("datetime").timedelta(seconds=DELAY_SECONDS))
    result.delayed_count, result.delayed_due_at = 40, time.time() + DELAY_SECONDS
    consumer.close()
    result.topics.append(DELAYED)

    # Shadow topic (PIP-180): its managed ledger reads the source's ledgers.
    admin.create_topic(SHADOW_SOURCE)
    produce(client, SHADOW_SOURCE, 15, prefix="src")
    admin.create_topic(SHADOW, {"PULSAR.SHADOW_SOURCE": SHADOW_SOURCE})
    admin.set_shadow_topics(SHADOW_SOURCE, [SHADOW])
    produce(client, SHADOW_SOURCE, 10, prefix="src-late")
    result.topics.extend([SHADOW_SOURCE, SHADOW])

    # Offload to S3 (jclouds aws-s3 driver); the broker deletes the BookKeeper copies (deletion lag 0).
    produce(client, OFFLOADED, 45, prefix="off")
    offload_closed_ledgers(admin, OFFLOADED, ledger_exists)
    result.topics.append(OFFLOADED)

    # A transaction: Pulsar's own perf producer (the Python client has no transactions).
    result.txn_messages = transactional_produce(info, TXN, 20, per_txn=5)
    result.topics.append(TXN)
    return result


def offload_closed_ledgers(admin: Admin, name: str, ledger_exists: Callable[[int], bool], keep: int = 2,
                           timeout: float = 90.0) -> list[int]:
    """Offload every ledger but the last `keep` closed ones (the broker offloads the ledgers wholly before
    the given position); wait until BookKeeper's copies are deleted (`ledger_exists` reads /ledgers)."""
    stats = admin.internal_stats(name)
    closed = [ledger for ledger in stats["ledgers"] if ledger["entries"] > 0]
    if len(closed) <= keep:
        raise RuntimeError(f"{name} has too few closed ledgers to offload: {stats['ledgers']}")
    boundary = closed[-keep]
    _offload_with_retries(admin, name, boundary["ledgerId"])
    wanted = {ledger["ledgerId"] for ledger in closed[:-keep]}
    deadline = time.monotonic() + timeout
    while True:
        ledgers = admin.internal_stats(name)["ledgers"]
        offloaded = {ledger["ledgerId"] for ledger in ledgers if ledger.get("offloaded")}
        if wanted <= offloaded and not any(ledger_exists(ledger) for ledger in wanted):
            return sorted(wanted)
        if time.monotonic() > deadline:
            raise RuntimeError(f"offload of {name} not complete after {timeout:.0f}s: {ledgers}")
        time.sleep(1.0)


def _offload_with_retries(admin: Admin, name: str, before_ledger: int, attempts: int = 3) -> None:
    """Trigger the offload again when an attempt fails: moto's server has answered a CreateMultipartUpload with
    500 on a loaded machine (CI, stop 32). The broker offloads only ledgers not yet offloaded and cleans up a
    failed attempt's objects (ManagedLedgerImpl.offloadLoop); an object left over anyway would show as an extra
    candidate in the testbed's exact-orphans test, never pass silently."""
    failures: list[str] = []
    for _ in range(attempts):
        try:
            admin.offload(name, before_ledger, 0)
            return
        except AdminError as exc:
            if "offload failed" not in str(exc):
                raise
            failures.append(str(exc)[:300])
            time.sleep(2.0)
    raise RuntimeError(f"offload of {name} failed {attempts} times: " + " | ".join(failures))


def transactional_produce(info: TestbedInfo, name: str, messages: int, per_txn: int, attempts: int = 3) -> int:
    """Committed messages written in transactions by Pulsar's perf producer.

    A first transaction on a busy machine can fail (a send inside it times out while the topic's
    transaction buffer recovers, and the client then refuses the commit). The tests need only some
    committed transaction, so a failed run is retried on the now-loaded topic; aborted messages stay
    invisible to readers, so a retry cannot change what the topic serves."""
    admin_for(info).create_topic(name)
    failures: list[str] = []
    for _ in range(attempts):
        committed, output = _perf_produce_transactions(info, name, messages, per_txn)
        if committed:
            return committed * per_txn
        failures.append(_first_error(output))
    raise RuntimeError(f"pulsar-perf produce -txn committed nothing in {attempts} runs: " + " | ".join(failures))


def _pulsar_perf(info: TestbedInfo, *args: str) -> subprocess.CompletedProcess[str]:
    """Pulsar's perf tool (`produce` or `consume`) against the testbed, as the superuser, in a small JVM."""
    perf = Path(info.pulsar_home) / "bin" / "pulsar-perf"
    token_file = Path(info.home) / "tokens" / f"{SUPERUSER}.jwt"
    command = [str(perf), args[0], "-u", info.service_url,
               "--auth-plugin", "org.apache.pulsar.client.impl.auth.AuthenticationToken",
               "--auth-params", f"file://{token_file.resolve()}", *args[1:]]
    env = {"PULSAR_MEM": "-Xms64m -Xmx256m", **LEAN_JVM_ENV, "PULSAR_LOG_DIR": str(Path(info.home) / "logs"),
           "PATH": "/usr/bin:/bin"}
    return subprocess.run(command, capture_output=True, text=True, timeout=180, env=env, check=False)


def _perf_produce_transactions(info: TestbedInfo, name: str, messages: int, per_txn: int) -> tuple[int, str]:
    done = _pulsar_perf(info, "produce", "-au", info.admin_url, "-txn", "-nmt", str(per_txn), "-m", str(messages),
                        "-r", "200", "-s", "64", "-time", "60", "-db", name)
    output = done.stdout + done.stderr
    committed = re.search(r"Transaction : (\d+) transaction end successfully", output)
    # The perf tool stops on its message count with later transactions still open (they time out and are
    # aborted by the coordinator): at least one committed transaction is what the tests need.
    if done.returncode != 0 or committed is None:
        return 0, f"exit {done.returncode}: {output}"
    return int(committed.group(1)), output


def transactional_acknowledge(info: TestbedInfo, name: str, subscription: str, messages: int,
                              timeout_s: int = 900) -> str:
    """`messages` acknowledged from the earliest position inside one transaction left open (it times out after
    `timeout_s` and the coordinator aborts it), by Pulsar's perf consumer (the Python client has no transactions).

    The first transactional acknowledgement makes the broker create the subscription's pending-ack store
    (MLPendingAckStoreProvider: `<topic>-<sub>__transaction_pending_ack`, cursor `__pending_ack_state`) and append
    the acknowledgements to it; while the transaction is open they are all that hold them. The tool's summary
    of its transactions is not always printed, so the caller checks for the store itself; returns the output."""
    done = _pulsar_perf(info, "consume", "-txn", "-nmt", str(messages + 1), "-m", str(messages), "-ss", subscription,
                        "-sp", "Earliest", "-time", "60", "-tto", str(timeout_s), "-i", "0", name)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"pulsar-perf consume -txn failed (exit {done.returncode}): {_first_error(output)}")
    return output


def _first_error(output: str) -> str:
    """The first line naming an exception or an error: the cause, where the tail is only the aftermath."""
    for line in output.splitlines():
        if "Exception" in line or " ERROR " in line:
            return line.strip()[:400]
    return output[-400:].strip()


def compact_twice(client: pulsar.Client, admin: Admin, name: str = COMPACT_TWICE) -> None:
    """Compact, write more, compact again, and keep the topic loaded: the newest compacted-ledger pointer
    is then only in the `__compaction` cursor's ledger, not in its ZooKeeper znode."""
    produce(client, name, 30, prefix="c1", key_mod=5)
    admin.compact(name)
    produce(client, name, 20, prefix="c2", key_mod=7)
    admin.compact(name)


def compact_behind_a_stale_pointer(client: pulsar.Client, admin: Admin, name: str = COMPACT_STALE) -> None:
    """Compact and unload (the pointer reaches ZooKeeper), then compact twice while loaded: the second of
    these opens the `__compaction` cursor's ledger and writes that compacted ledger's id to ZooKeeper with
    it; the third writes only to the cursor ledger, and the broker deletes the second compacted ledger.
    ZooKeeper then names a deleted compacted ledger and an active cursor ledger; the live one is newer.
    (A broker restart or a topic moving between brokers after a compaction leads to the same state.)"""
    produce(client, name, 20, prefix="s0", key_mod=5)
    admin.compact(name)
    admin.unload(name)
    produce(client, name, 12, prefix="s1", key_mod=6)
    admin.compact(name)
    produce(client, name, 12, prefix="s2", key_mod=7)
    admin.compact(name)


def read_all(client: pulsar.Client, name: str, compacted: bool = False, timeout_ms: int = 60_000,
             limit: int = 100_000) -> list[tuple[str, bytes]]:
    """Every message a reader from the earliest position gets: (message id, payload), in order.

    The broker says a message is there before each read, so a read that then times out is a failure, never
    the end of the topic: the first read of an offloaded ledger opens its S3 object and can take seconds on a
    busy machine, and a baseline cut short there once made a topic look empty before the sweep."""
    reader = client.create_reader(name, pulsar.MessageId.earliest, is_read_compacted=compacted)
    out: list[tuple[str, bytes]] = []
    try:
        while len(out) < limit and reader.has_message_available():
            try:
                message = reader.read_next(timeout_ms)
            except pulsar.Timeout as timeout:
                raise RuntimeError(f"{name}: the broker has a message after {len(out)} read but none came in "
                                   f"{timeout_ms} ms") from timeout
            out.append((str(message.message_id()), message.data()))
    finally:
        reader.close()
    return out
