"""Minimal Pulsar binary-protocol endpoint for tests and the local sandbox (never production).

Regenerate the protobuf module after editing PulsarApi.proto::

    .venv/bin/python -m grpc_tools.protoc -Isweeper/pulsar_endpoint \
        --python_out=sweeper/pulsar_endpoint sweeper/pulsar_endpoint/PulsarApi.proto
"""

from .server import PulsarEndpoint, normalize_topic
from .store import StoredEntry, StoredMessage

__all__ = ["PulsarEndpoint", "StoredEntry", "StoredMessage", "normalize_topic"]
