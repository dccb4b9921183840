#!/usr/bin/env bash
# Install what ledger-sweeper needs on a fresh Debian machine: a JRE (Spark, ZooKeeper),
# Debian's zookeeper package (the sandbox and the tests run a real server), libfaketime (the
# sandbox server's settable clock), Maven and the JVM parts of jvm/pom.xml, the Python
# environment in .venv, and the offload stores' test servers in .tools/ (Azurite from npm,
# fake-gcs-server built from the Go module proxy). Safe to run again; a re-run that finds
# everything in place fetches nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
# The sandbox's ZooKeeper runs under libfaketime so seeded ledger znodes get past creation times.
[ -f /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ] || need_apt+=(libfaketime)
# Node for Azurite and Go for fake-gcs-server, the offload-store tests' servers (SWEEPER_SKIP_OBJECT_SERVERS=1: neither).
if [ "${SWEEPER_SKIP_OBJECT_SERVERS:-0}" != "1" ]; then
  command -v npm >/dev/null 2>&1 || need_apt+=(nodejs npm)
  command -v go >/dev/null 2>&1 || need_apt+=(golang-go)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} with apt-get"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[dev]"
# JVM parts (Pulsar for the real-cluster testbed, delta-spark, s3a), pinned in jvm/pom.xml and
# fetched from Maven Central into the ignored jvm/target/; the local Maven cache makes re-runs offline.
if [ "${SWEEPER_SKIP_JVM:-0}" != "1" ]; then
  stamp="jvm/target/.fetched-$(sha256sum jvm/pom.xml | cut -c1-16)"
  if [ ! -f "$stamp" ]; then
    echo "setup: fetching JVM parts (jvm/pom.xml) with Maven"
    mvn -B -q -f jvm/pom.xml package
    touch "$stamp"
  fi
fi
# The offload stores' test servers (harness/objectservers.py), into the ignored .tools/: Azurite 3.35.0 (the newest
# that runs on Node 20) from npm, fake-gcs-server built with `go install` from the Go module proxy. Each is fetched
# only when its pinned version is missing, so re-runs are fast and work offline.
AZURITE_VERSION=3.35.0
FAKE_GCS_VERSION=v1.56.1
if [ "${SWEEPER_SKIP_OBJECT_SERVERS:-0}" != "1" ]; then
  azurite_pkg=.tools/azurite/node_modules/azurite/package.json
  if ! grep -q "\"version\": \"$AZURITE_VERSION\"" "$azurite_pkg" 2>/dev/null; then
    echo "setup: installing azurite $AZURITE_VERSION (npm) into .tools/azurite"
    npm install --prefix .tools/azurite --no-audit --no-fund --silent "azurite@$AZURITE_VERSION"
  fi
  gcs_stamp=.tools/bin/.fake-gcs-server-$FAKE_GCS_VERSION
  if [ ! -x .tools/bin/fake-gcs-server ] || [ ! -f "$gcs_stamp" ]; then
    echo "setup: building fake-gcs-server $FAKE_GCS_VERSION (Go module proxy) into .tools/bin"
    GOBIN="$PWD/.tools/bin" go install "github.com/fsouza/fake-gcs-server@$FAKE_GCS_VERSION"
    touch "$gcs_stamp"
  fi
fi
echo "setup: done ($(.venv/bin/python --version), $(java -version 2>&1 | head -1))"
