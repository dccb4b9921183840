#!/usr/bin/env bash
# Install what ledger-sweeper needs on a fresh Debian machine: a JRE (Spark, ZooKeeper),
# Debian's zookeeper package (the sandbox and the tests run a real server), and the Python
# environment in .venv. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
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
echo "setup: done ($(.venv/bin/python --version), $(java -version 2>&1 | head -1))"
