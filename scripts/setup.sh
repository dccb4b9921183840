#!/usr/bin/env bash
# Install what ledger-sweeper needs on a fresh Debian machine: a JRE (Spark, ZooKeeper),
# Debian's zookeeper package (the sandbox and the tests run a real server), libfaketime (the
# sandbox server's settable clock), Maven and the JVM parts of jvm/pom.xml, and the Python
# environment in .venv. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
# The sandbox's ZooKeeper runs under libfaketime so seeded ledger znodes get past creation times.
[ -f /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ] || need_apt+=(libfaketime)
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
echo "setup: done ($(.venv/bin/python --version), $(java -version 2>&1 | head -1))"
