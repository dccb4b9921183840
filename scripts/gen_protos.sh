#!/usr/bin/env bash
# Regenerate sweeper/_proto from schemas/proto (needs the dev extra: grpcio-tools).
# grpcio-tools 1.85.1 emits gencode 7.35.1, which any protobuf runtime 7.35.1 <= v < 8 accepts.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
"$PYTHON" -m grpc_tools.protoc -Ischemas/proto --python_out=sweeper/_proto --pyi_out=sweeper/_proto \
  schemas/proto/bookkeeper_metadata.proto schemas/proto/pulsar_metadata.proto
# protoc writes `import foo_pb2` for a .proto importing another; inside a package it must be relative.
sed -i -E 's/^import ([A-Za-z0-9_]+_pb2)( as .*)?$/from . import \1\2/' sweeper/_proto/*_pb2.py sweeper/_proto/*_pb2.pyi
"$PYTHON" -c 'import sweeper._proto.bookkeeper_metadata_pb2, sweeper._proto.pulsar_metadata_pb2'
echo "generated: $(ls sweeper/_proto/*_pb2.py | tr '\n' ' ')($(grep -h '^# Protobuf Python Version' sweeper/_proto/*_pb2.py | sort -u | tr -d '#'))"
