#!/usr/bin/env bash
# Install everything (into .venv) and run the test suite: the graded tests on the
# reference, the grader both ways, the stub check, and every notebook through nbval, in
# parallel (pytest-xdist, one worker a core; tests/conftest.py says what runs together).
# The tests marked `slow` (whole-course gradings on a busy machine, the release, regrade,
# the attacks, the longer training runs) are left to CI (.ci/run runs them after this):
# `bash scripts/test.sh -m slow` runs them, `-m ""` everything.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -x -k ch01`, `-n 0` (serial).
# In a student release (no solutions/, no course tests) it grades the exercises instead;
# extra arguments go to the grader, e.g. `bash scripts/test.sh --chapter 1`.
source "$(dirname "$0")/env.sh"
if [ ! -d solutions ]; then
  exec python -m annotated_transformer grade "$@"
fi
# Threads of PyTorch's OpenMP pool that wait for work sleep instead of spinning: pytest-xdist
# runs one process a core, and spinning threads of one steal the cores of the others (a
# training cell of chapter 6 took three times as long). Results are the same either way.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
python -m pytest --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
  --numprocesses auto --dist loadgroup -m "not slow" chapters tests "$@"
