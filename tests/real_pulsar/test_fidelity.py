"""The sandbox stays faithful: what `harness.sandbox` writes is compared with what a real Pulsar broker wrote
on the testbed (znode paths, ledger custom metadata per component, cursor property names, offload
object names, object user metadata, offload driver metadata). A drift fails here, not in production.

What the broker wrote is read as the workload left it (the session's `as_built`, before any sweep or consumer
changes it) where a later test changes it: the ledgers' metadata and the delayed subscription's bucket snapshots.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

from harness.sandbox.model import SandboxSpec, Status, build_cluster, encode_name
from harness.sandbox.seed import cluster_znodes, managed_ledger_info_bytes, offload_object_metadata
from harness.testbed.orphans import COMPACT_LEAK, ml_path
from harness.testbed.workload import ODD_NAME, OFFLOADED, SHADOW
from harness.testbed.world import World, s3_client_for, zk_for
from sweeper.codecs import pulsar as codec
from tests.support.real_pulsar import AsBuilt

pytestmark = [pytest.mark.real_pulsar, pytest.mark.slow, pytest.mark.timeout(1800)]

OFFLOAD_KEY = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-ledger-\d+(-index)?$")
BUCKET_PROPERTY = re.compile(r"^#pulsar\.internal\.delayed\.bucket_\d+_\d+$")


@pytest.fixture(scope="module")
def zk(testbed_world: World) -> Iterator[KazooClient]:
    client = zk_for(testbed_world.info)
    yield client
    client.stop()


@pytest.fixture(scope="module")
def sandbox() -> Any:
    return build_cluster(SandboxSpec(seed=3, topics=60))


def _kind(custom: dict[str, bytes]) -> str:
    component = custom.get("component", b"").decode()
    return f"{component}/cursor" if "pulsar/cursor" in custom else component


def test_custom_metadata_keys_per_component(as_built: AsBuilt, sandbox: Any) -> None:
    real: dict[str, set[frozenset[str]]] = {}
    for custom in as_built.ledgers.values():
        real.setdefault(_kind(custom), set()).add(frozenset(custom))
    assert {"managed-ledger", "managed-ledger/cursor", "schema", "compacted-ledger",
            "delayed-index-bucket"} <= set(real), sorted(real)
    modeled: dict[str, Counter[frozenset[str]]] = {}
    for ledger in sandbox.ledgers.values():
        if ledger.status is Status.IN_USE:
            modeled.setdefault(_kind(ledger.custom), Counter())[frozenset(ledger.custom)] += 1
    for kind, key_sets in real.items():
        assert len(key_sets) == 1, f"the broker wrote {kind} ledgers with different keys: {key_sets}"
        (keys,) = key_sets
        assert modeled[kind].most_common(1)[0][0] == keys, kind


def test_custom_metadata_values_name_the_owner_as_the_broker_does(zk: KazooClient, as_built: AsBuilt,
                                                                  sandbox: Any) -> None:
    """managed-ledger: the znode path below /managed-ledgers; cursor: the cursor's znode name (encoded);
    schema: the path below /schemas; compacted and bucket ledgers: the full persistent:// topic name."""
    def check(custom: dict[str, bytes], exists: Any) -> None:
        text = {k: v.decode() for k, v in custom.items() if k != "pulsar/compactedTo"}
        kind = _kind(custom)
        if kind.startswith("managed-ledger"):
            assert exists(f"/managed-ledgers/{text['pulsar/managed-ledger']}"), text
            if kind.endswith("/cursor"):
                assert exists(f"/managed-ledgers/{text['pulsar/managed-ledger']}/{text['pulsar/cursor']}"), text
        elif kind == "schema":
            assert exists(f"/schemas/{text['pulsar/schemaId']}"), text
        elif kind == "compacted-ledger":
            assert text["pulsar/compactedTopic"].startswith("persistent://"), text
        elif kind == "delayed-index-bucket":
            assert text["pulsar/delayedIndexTopic"].startswith("persistent://"), text
            assert BUCKET_PROPERTY.match(text["pulsar/delayedIndexBucketKey"]), text

    # Real: only ledgers whose owner the broker still has (the induced orphans name gone owners).
    for custom in as_built.ledgers.values():
        if _kind(custom) in ("managed-ledger/cursor",) and not zk.exists(
                f"/managed-ledgers/{custom['pulsar/managed-ledger'].decode()}/{custom['pulsar/cursor'].decode()}"):
            continue  # a cursor ledger left behind (an induced orphan)
        if _kind(custom) == "managed-ledger" and not zk.exists(
                f"/managed-ledgers/{custom['pulsar/managed-ledger'].decode()}"):
            continue  # a deleted topic's ledger (an induced orphan)
        check(custom, zk.exists)
    znodes = {path for path, _ in cluster_znodes(sandbox)}
    prefixes = {p.rsplit("/", i)[0] for p in znodes for i in range(1, 8) if p.count("/") > i}

    def sandbox_exists(path: str) -> bool:
        return path in znodes or path in prefixes

    for ledger in sandbox.ledgers.values():
        if ledger.status is Status.IN_USE and ledger.custom.get("application") == b"pulsar":
            check(ledger.custom, sandbox_exists)


def test_znode_names_are_url_encoded_like_the_broker(zk: KazooClient) -> None:
    real = ml_path(ODD_NAME)
    assert zk.exists(real), real
    local = ODD_NAME.split("/", 4)[-1]
    assert real.endswith("/persistent/" + encode_name(local))
    assert zk.exists(f"{real}/{encode_name('s:1 %')}")


def test_cursor_property_names(zk: KazooClient, as_built: AsBuilt, sandbox: Any) -> None:
    compaction = codec.decode_managed_cursor_info(zk.get(f"{ml_path(COMPACT_LEAK)}/__compaction")[0])
    real_long = {p.name for p in compaction.properties}
    assert real_long == {"CompactedTopicLedger"}
    delayed = codec.decode_managed_cursor_info(as_built.delayed_cursor)
    real_string = {p.name for p in delayed.cursorProperties}
    assert real_string and all(BUCKET_PROPERTY.match(name) for name in real_string), real_string
    modeled_long = {name for ml in sandbox.managed_ledgers for c in ml.cursors for name in c.long_properties}
    modeled_string = {name for ml in sandbox.managed_ledgers for c in ml.cursors for name in c.string_properties}
    assert modeled_long == real_long
    assert modeled_string and all(BUCKET_PROPERTY.match(name) for name in modeled_string), modeled_string


def test_offload_objects_and_metadata(testbed_world: World, zk: KazooClient, sandbox: Any) -> None:
    info = testbed_world.info
    s3 = s3_client_for(info)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=info.offload_bucket).get("Contents", [])]
    assert keys and all(OFFLOAD_KEY.match(k) for k in keys), keys
    real_meta = {frozenset(s3.head_object(Bucket=info.offload_bucket, Key=k)["Metadata"]) for k in keys}
    assert len(real_meta) == 1, real_meta
    assert all(OFFLOAD_KEY.match(o.key) for o in sandbox.offload_objects)
    # S3 returns user-metadata keys lower-cased; compare the well-formed modeled objects (owner and cluster set).
    modeled = {frozenset(k.lower() for k in offload_object_metadata(o)) for o in sandbox.offload_objects
               if o.managed_ledger is not None and o.cluster_name is not None}
    assert modeled == real_meta
    sample = s3.head_object(Bucket=info.offload_bucket, Key=keys[0])["Metadata"]
    assert sample["pulsarclustername"] == info.cluster
    assert sample["managedledgername"].startswith("sweep/app/persistent/")

    # The offload context's driver metadata: same property keys (the driver name is the operator's choice).
    real_ml = codec.decode_managed_ledger_info(zk.get(ml_path(OFFLOADED))[0])
    real_props = {frozenset(p.key for p in x.offloadContext.driverMetadata.properties)
                  for x in real_ml.ledgerInfo if x.HasField("offloadContext")}
    offloaded_ml = next(ml for ml in sandbox.managed_ledgers if any(x.offload for x in ml.ledgers))
    modeled_ml = codec.decode_managed_ledger_info(managed_ledger_info_bytes(offloaded_ml))
    modeled_props = {frozenset(p.key for p in x.offloadContext.driverMetadata.properties)
                     for x in modeled_ml.ledgerInfo if x.HasField("offloadContext")}
    assert modeled_props == real_props


def test_shadow_topic_property(zk: KazooClient, sandbox: Any) -> None:
    real = codec.decode_managed_ledger_info(zk.get(ml_path(SHADOW))[0])
    real_props = {p.key: p.value for p in real.properties}
    assert set(real_props) == {"PULSAR.SHADOW_SOURCE"} and real_props["PULSAR.SHADOW_SOURCE"].startswith(
        "persistent://")
    shadows = [ml for ml in sandbox.managed_ledgers if ml.properties]
    assert shadows and all(set(ml.properties) == set(real_props) for ml in shadows)
    assert all(ml.properties["PULSAR.SHADOW_SOURCE"].startswith("persistent://") for ml in shadows)
