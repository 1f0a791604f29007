#!/usr/bin/env bash
# The demo in one command, on a fresh clone: install what it needs, then run it.
#
#   examples/spark_pipeline/run-demo.sh [--compare] [--rows N] [--lease S] [--region R] ...
#
# Inside an active virtualenv it installs there; otherwise it creates .venv at the
# repository root and reuses it next time. Every argument goes to the demo
# (python -m examples.spark_pipeline.demo --help lists them).
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ -z "${VIRTUAL_ENV:-}" ]; then
    if [ ! -x .venv/bin/python ]; then
        echo "Creating .venv ..."
        python3 -m venv .venv
    fi
    # shellcheck disable=SC1091
    . .venv/bin/activate
fi

if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
    echo "PySpark needs Java 17 or later: install a JDK (e.g. apt install openjdk-17-jre-headless)" >&2
    exit 2
fi

echo "Installing celery-sqs-heartbeat with the spark, demo and testing extras into $(dirname "$(dirname "$(command -v python)")") ..."
pip_log="$(mktemp)"
if ! python -m pip install --disable-pip-version-check -e '.[spark,demo,testing]' >"$pip_log" 2>&1; then
    cat "$pip_log" >&2
    exit 1
fi
rm -f "$pip_log"

exec python -m examples.spark_pipeline.demo "$@"
