#!/usr/bin/env bash
# The test command (README and .ci/run): set up if needed, then the default test run
# (-m "not slow and not gpu" from pytest.ini). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
