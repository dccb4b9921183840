#!/usr/bin/env bash
# Submit a ledger-sweeper stage to a Spark cluster.
#
#   SPARK_MASTER=yarn ./spark-submit.sh snapshot --config conf/prod.toml
#
# The code is the `sweeper` package SWEEPER_PYTHON imports (an installed wheel, or this checkout in a development
# install): zipped by scripts/build_pyfiles.py, shipped to the executors with --py-files, and run through this
# checkout's jobs/<stage>.py wrapper (which only calls sweeper.jobs.<stage>.main).
#
# The JVM parts come from jvm/target/, where scripts/setup.sh (`mvn -f jvm/pom.xml package`) put
# them: delta-spark + delta-storage (the delta-spark table engine, which `[tables] engine = "auto"`
# picks in a session this script starts) and hadoop-aws + the AWS SDK bundle (tables on s3://).
#
# Environment:
#   SPARK_MASTER       --master (default: local[*])
#   SWEEPER_PYTHON     the Python whose `sweeper` package is submitted (default: .venv/bin/python here, else
#                      python3 on PATH); a wheel installed elsewhere: that environment's python
#   SPARK_SUBMIT       spark-submit binary (default: spark-submit on PATH, else the one beside SWEEPER_PYTHON)
#   PYSPARK_PYTHON     Python on the executors (must have the project's dependencies)
#   DELTA_JARS         comma-separated Delta jars (default: jvm/target/delta/*.jar); "provided": the
#                      cluster has them on its class path (only Delta's extension is set); "": no Delta
#   S3A_JARS           comma-separated hadoop-aws + AWS SDK jars (default: jvm/target/s3a/*.jar);
#                      "" or "provided": the cluster has s3a already (EMR, Dataproc) or needs none
#   DELTA_PACKAGES     fallback when the Delta jars were never fetched: Maven coordinates resolved
#                      at submit time, which needs Maven Central (default io.delta:delta-spark_2.13:4.4.0)
#   SWEEPER_JARS_MODE  "local": every node has the jars at these paths, nothing is copied (default
#                      for local[*] and a standalone master on loopback); "ship": Spark copies them
#                      to the executors (default otherwise; the SDK bundle alone is ~650 MiB)
#   SPARK_EXTRA_ARGS   anything else for spark-submit (e.g. "--deploy-mode cluster --num-executors 8")
#   SWEEPER_BUILD_DIR  where the zip of our code is built (default: build/ here)
# Exit codes are the stage's own: 0 ok, 2 configuration error, 3 refused (wrong root,
# unreachable server, failed gate), 4 partial (deletes queued for retry), 1 unexpected error.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
stage="${1:?usage: spark-submit.sh <stage> [stage options]}"; shift
job="$here/jobs/$stage.py"
[ -f "$job" ] || { echo "no such stage: $stage (jobs/: $(ls "$here/jobs" | grep -v __ | tr '\n' ' '))" >&2; exit 2; }

python="${SWEEPER_PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x "$here/.venv/bin/python" ]; then python="$here/.venv/bin/python"; else python="$(command -v python3)"; fi
fi
# The package to ship: where that Python imports `sweeper` from (never this checkout by assumption).
package="$(cd / && "$python" -c 'import os, sweeper; print(os.path.dirname(sweeper.__file__))' 2>/dev/null)" || {
  echo "spark-submit.sh: $python cannot import sweeper: pip install ledger-sweeper there, or set SWEEPER_PYTHON" >&2
  exit 2; }
[ -f "$package/jobs/$stage.py" ] || {
  echo "spark-submit.sh: the sweeper package in $package has no job $stage (an older version?)" >&2; exit 2; }

# The driver runs that Python too (spark-submit's default is PYSPARK_PYTHON, else python3).
export PYSPARK_DRIVER_PYTHON="${PYSPARK_DRIVER_PYTHON:-$python}"
submit="${SPARK_SUBMIT:-$(command -v spark-submit || echo "$(dirname "$python")/spark-submit")}"
build="${SWEEPER_BUILD_DIR:-$here/build}"; mkdir -p "$build"
# Ship the package (its code and the data it reads, sweeper/resources) to the executors as one zip.
"$python" "$here/scripts/build_pyfiles.py" "$build/ledger_sweeper.zip" "$package" >&2

master="${SPARK_MASTER:-local[*]}"
jars_dir="${SWEEPER_JARS_DIR:-$here/jvm/target}"
fetched() { ls "$jars_dir/$1"/*.jar 2>/dev/null | paste -sd, - || true; }
delta_jars="${DELTA_JARS-$(fetched delta)}"
s3a_jars="${S3A_JARS-$(fetched s3a)}"
case "$master" in
  local*|spark://127.*|spark://localhost*) default_mode=local ;;
  *) default_mode=ship ;;
esac
mode="${SWEEPER_JARS_MODE:-$default_mode}"

jars=()
add_jars() {  # comma-separated list -> jars[], as local: URIs in local mode
  local list="$1" jar
  [ -n "$list" ] && [ "$list" != provided ] || return 0
  IFS=, read -r -a items <<< "$list"
  for jar in "${items[@]}"; do
    [ -f "$jar" ] || { echo "spark-submit.sh: jar not found: $jar" >&2; exit 2; }
    if [ "$mode" = local ]; then jars+=("local:$(cd "$(dirname "$jar")" && pwd)/$(basename "$jar")"); else jars+=("$jar"); fi
  done
}
add_jars "$delta_jars"
add_jars "$s3a_jars"

args=(--master "$master" --name "ledger-sweeper-$stage" --py-files "$build/ledger_sweeper.zip")
with_delta=1
if [ -z "$delta_jars" ]; then
  if [ -z "${DELTA_JARS+set}" ] && [ -n "${DELTA_PACKAGES-io.delta:delta-spark_2.13:4.4.0}" ]; then
    echo "spark-submit.sh: no Delta jars in $jars_dir/delta (run scripts/setup.sh); resolving" \
         "${DELTA_PACKAGES-io.delta:delta-spark_2.13:4.4.0} from Maven at submit time" >&2
    args+=(--packages "${DELTA_PACKAGES-io.delta:delta-spark_2.13:4.4.0}")
  else
    with_delta=0  # DELTA_JARS="" (or no jars and DELTA_PACKAGES=""): delta-rs only
  fi
fi
if [ ${#jars[@]} -gt 0 ]; then
  args+=(--jars "$(IFS=,; echo "${jars[*]}")")
fi
if [ "$mode" = local ] && [ ${#jars[@]} -gt 0 ]; then
  # local: URIs are not put on the driver's class path by spark-submit in client mode; this is.
  driver_cp="$(IFS=:; echo "${jars[*]//local:/}")"
  args+=(--driver-class-path "$driver_cp")
fi
if [ "$with_delta" = 1 ]; then
  args+=(--conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension
         --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog)
fi
[ -n "${PYSPARK_PYTHON:-}" ] && args+=(--conf "spark.pyspark.python=$PYSPARK_PYTHON")
# shellcheck disable=SC2086
exec "$submit" "${args[@]}" ${SPARK_EXTRA_ARGS:-} "$job" "$@"
