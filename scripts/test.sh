#!/usr/bin/env bash
# Install everything (into .venv) and run the whole test suite: the graded tests on the
# reference, the grader both ways, the stub check, and every notebook through nbval.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -x -k ch01`.
# In a student release (no solutions/, no course tests) it grades the exercises instead;
# extra arguments go to the grader, e.g. `bash scripts/test.sh --chapter 1`.
source "$(dirname "$0")/env.sh"
if [ ! -d solutions ]; then
  exec python -m annotated_transformer grade "$@"
fi
python -m pytest --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
  tests chapters "$@"
