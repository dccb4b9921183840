#!/usr/bin/env bash
# Regenerate sweeper/_proto from schemas/proto (needs the dev extra: grpcio-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m grpc_tools.protoc -Ischemas/proto --python_out=sweeper/_proto --pyi_out=sweeper/_proto \
  schemas/proto/bookkeeper_metadata.proto schemas/proto/pulsar_metadata.proto
echo "generated: $(ls sweeper/_proto/*_pb2.py | tr '\n' ' ')"
