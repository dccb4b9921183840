#!/usr/bin/env bash
# Submit a ledger-sweeper stage to a Spark cluster.
#
#   SPARK_MASTER=yarn ./spark-submit.sh snapshot --config conf/prod.toml
#
# Environment:
#   SPARK_MASTER       --master (default: local[*])
#   SPARK_SUBMIT       spark-submit binary (default: spark-submit on PATH, else the venv's)
#   PYSPARK_PYTHON     Python on the executors (must have the project's dependencies)
#   DELTA_PACKAGES     Maven coordinates for delta-spark (default io.delta:delta-spark_4.2_2.13:4.4.1);
#                      set to "" to rely on jars already on the cluster's classpath
#   SPARK_EXTRA_ARGS   anything else for spark-submit (e.g. "--deploy-mode cluster --num-executors 8")
#   SWEEPER_BUILD_DIR  where the zip of our code is built (default: build/ here)
# Exit codes are the stage's own: 0 ok, 2 configuration error, 3 refused (wrong root,
# unreachable server, failed gate), 4 partial (deletes queued for retry), 1 unexpected error.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
stage="${1:?usage: spark-submit.sh <stage> [stage options]}"; shift
job="$here/jobs/$stage.py"
[ -f "$job" ] || { echo "no such stage: $stage (jobs/: $(ls "$here/jobs" | grep -v __ | tr '\n' ' '))" >&2; exit 2; }

submit="${SPARK_SUBMIT:-$(command -v spark-submit || echo "$here/.venv/bin/spark-submit")}"
build="${SWEEPER_BUILD_DIR:-$here/build}"; mkdir -p "$build"
# Ship our packages (and the Avro schema they read) to the executors as one zip.
python3 "$here/scripts/build_pyfiles.py" "$build/ledger_sweeper.zip" >&2

delta_packages="${DELTA_PACKAGES-io.delta:delta-spark_4.2_2.13:4.4.1}"
args=(--master "${SPARK_MASTER:-local[*]}" --name "ledger-sweeper-$stage" --py-files "$build/ledger_sweeper.zip")
if [ -n "$delta_packages" ]; then
  args+=(--packages "$delta_packages"
         --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension
         --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog)
fi
[ -n "${PYSPARK_PYTHON:-}" ] && args+=(--conf "spark.pyspark.python=$PYSPARK_PYTHON")
# shellcheck disable=SC2086
exec "$submit" "${args[@]}" ${SPARK_EXTRA_ARGS:-} "$job" "$@"
