#!/usr/bin/env bash
# Install everything (into .venv) and run the whole test suite: the graded tests on the
# reference, the grader both ways, the stub check, and every notebook through nbval.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -x -k ch01`.
source "$(dirname "$0")/env.sh"
python -m pytest --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
  tests chapters "$@"
