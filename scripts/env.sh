# Sourced by the other scripts: create (or reuse) the virtual environment and install the
# course into it, editable, with the exact pins of requirements.txt.
# VENV chooses the environment's folder (default: .venv in the repository).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "error: Python 3.10 or newer is needed (tried '$PYTHON'); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "Creating the virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
# Reinstall only when the requirements or the package metadata changed.
stamp="$VENV/.installed-$(cat requirements.txt pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "Installing the course and its pinned dependencies into $VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements.txt -e .
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
VENV="$(cd "$VENV" && pwd)"
export PATH="$VENV/bin:$PATH"
export PYTHONHASHSEED=0
