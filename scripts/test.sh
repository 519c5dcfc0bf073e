#!/usr/bin/env bash
# The test command (README and .ci/run): set up if needed, then the default test run
# (-m "not slow and not gpu" from pytest.ini) on 2 pytest-xdist workers, one test module per worker at a time
# (module fixtures are shared). Extra arguments go to pytest: `-n 0` runs serially, `-m slow` the slow tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -n "${PYTEST_WORKERS:-2}" --dist loadfile "$@"
