#!/usr/bin/env bash
# Regenerate sweeper/_proto from schemas/proto (needs the dev extra: grpcio-tools).
# grpcio-tools 1.85.1 emits gencode 7.35.1, which any protobuf runtime 7.35.1 <= v < 8 accepts; its gRPC stubs
# (oxia_client_pb2_grpc.py, Oxia's read path) need grpcio >= 1.85.1 at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
"$PYTHON" -m grpc_tools.protoc -Ischemas/proto --python_out=sweeper/_proto --pyi_out=sweeper/_proto \
  schemas/proto/bookkeeper_metadata.proto schemas/proto/pulsar_metadata.proto schemas/proto/oxia_client.proto
"$PYTHON" -m grpc_tools.protoc -Ischemas/proto --grpc_python_out=sweeper/_proto schemas/proto/oxia_client.proto
# protoc writes `import foo_pb2` for a .proto importing another (and in every gRPC stub); inside a package it
# must be relative.
sed -i -E 's/^import ([A-Za-z0-9_]+_pb2)( as .*)?$/from . import \1\2/' \
  sweeper/_proto/*_pb2.py sweeper/_proto/*_pb2.pyi sweeper/_proto/*_pb2_grpc.py
"$PYTHON" -c 'import sweeper._proto.bookkeeper_metadata_pb2, sweeper._proto.pulsar_metadata_pb2'
"$PYTHON" -c 'import sweeper._proto.oxia_client_pb2, sweeper._proto.oxia_client_pb2_grpc'
echo "generated: $(ls sweeper/_proto/*_pb2.py sweeper/_proto/*_pb2_grpc.py | tr '\n' ' ')($(grep -h '^# Protobuf Python Version' sweeper/_proto/*_pb2.py | sort -u | tr -d '#'))"
