# utils/lib/common.sh — shared by utils/bin/*: the repo root and the torch-capable interpreter.
CRUCIBLE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

# Prints the path of a Python interpreter that imports torch. CRUCIBLE_PYTHON overrides the
# search; otherwise /usr/bin/python3 (Debian's, where python3-torch lives) is tried before the
# first python3 on PATH, which on these machines is often another interpreter without torch.
crucible_python() {
  local cand
  if [[ -n "${CRUCIBLE_PYTHON:-}" ]]; then
    if "$CRUCIBLE_PYTHON" -c "import torch" 2>/dev/null; then echo "$CRUCIBLE_PYTHON"; return 0; fi
    echo "CRUCIBLE_PYTHON=$CRUCIBLE_PYTHON cannot import torch; point it at an interpreter that can" >&2
    return 1
  fi
  for cand in /usr/bin/python3 "$(command -v python3 2>/dev/null)"; do
    [[ -x "$cand" ]] || continue
    if "$cand" -c "import torch" 2>/dev/null; then echo "$cand"; return 0; fi
  done
  echo "no Python interpreter here imports torch: run utils/bin/setup (python3-torch for /usr/bin/python3), or set CRUCIBLE_PYTHON" >&2
  return 1
}

# Builds one preset (configure if needed). Jobs: CRUCIBLE_JOBS, else the machine's core count.
crucible_build() {
  local preset="$1"
  local jobs="${CRUCIBLE_JOBS:-$(nproc)}"
  (cd "$CRUCIBLE_ROOT" && cmake --preset "$preset" >/dev/null && cmake --build --preset "$preset" -j "$jobs")
}
