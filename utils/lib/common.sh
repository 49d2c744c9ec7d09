# utils/lib/common.sh — shared by utils/bin/*: the repo root and the torch-capable interpreter.
CRUCIBLE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

# The project's own virtual environment (made by utils/bin/setup).
crucible_venv() { echo "${CRUCIBLE_VENV:-$CRUCIBLE_ROOT/.venv}"; }

# Prints the path of the Python interpreter that imports torch: CRUCIBLE_PYTHON when set (any
# torch from 2.4 on), else the project's venv.
crucible_python() {
  local py
  if [[ -n "${CRUCIBLE_PYTHON:-}" ]]; then
    py="$CRUCIBLE_PYTHON"
  else
    py="$(crucible_venv)/bin/python"
    if [[ ! -x "$py" ]]; then
      echo "no project venv at $(crucible_venv): run utils/bin/setup, or set CRUCIBLE_PYTHON" >&2
      return 1
    fi
  fi
  if ! "$py" -c "import torch" 2>/dev/null; then
    echo "$py cannot import torch: run utils/bin/setup, or point CRUCIBLE_PYTHON at an interpreter that can" >&2
    return 1
  fi
  echo "$py"
}

# Builds one preset (configure if needed) against crucible_python's torch. Jobs: CRUCIBLE_JOBS,
# else the machine's core count. Further arguments go to the configure step.
crucible_build() {
  local preset="$1"; shift
  local jobs="${CRUCIBLE_JOBS:-$(nproc)}"
  local py; py="$(crucible_python)"
  (cd "$CRUCIBLE_ROOT" && cmake --preset "$preset" -DCRUCIBLE_PYTHON="$py" "$@" >/dev/null \
     && cmake --build --preset "$preset" -j "$jobs")
}
