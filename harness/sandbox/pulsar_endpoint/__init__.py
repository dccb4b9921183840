"""Minimal Pulsar binary-protocol endpoint for tests and the local sandbox (never production).

Producers, consumers and readers of the real ``pulsar-client`` work against it; durable
subscription cursors persist in the data dir next to the message logs.

Regenerate the protobuf module after editing PulsarApi.proto::

    .venv/bin/python -m grpc_tools.protoc -Isweeper/sandbox/pulsar_endpoint \
        --python_out=harness/sandbox/pulsar_endpoint harness/sandbox/pulsar_endpoint/PulsarApi.proto
"""

from .server import PulsarEndpoint, normalize_topic
from .store import CursorState, StoredEntry, StoredMessage

__all__ = ["CursorState", "PulsarEndpoint", "StoredEntry", "StoredMessage", "normalize_topic"]
