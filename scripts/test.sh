#!/usr/bin/env bash
# The project's test command (README): creates .venv if missing, installs the package with its
# test extras, runs the linter and the test suite (two pytest-xdist workers, one per core;
# a test file stays on one worker). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]"
.venv/bin/ruff check specdec_t5x benchmarks scripts tests
.venv/bin/ruff format --check specdec_t5x benchmarks scripts tests
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile "$@" tests
