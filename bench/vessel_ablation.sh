#!/usr/bin/env bash
# bench/vessel_ablation.sh — where the recording's added wall time goes on the MLP training step
# (the step of python/vessel_overhead.py), measured by switching parts of the typed kernels' work
# off, rung by rung (Note [Ablation build], vessel/torch/Capture.h; the rungs are listed in
# python/vessel_ablation.py): from the key alone up to the full recording, each rung in a process
# of its own, against eager in paired short rounds. Prints each rung's added percent of the step
# and what it adds to the rung below, and writes bench/baselines/vessel_ablation.json.
#   bench/vessel_ablation.sh [--passes N] [--rounds N]      (default 3 passes of 300 rounds)
# Builds build-ablation/ (the release preset's flags, with -DCRUCIBLE_VESSEL_ABLATION=ON), only
# the Python extension and its libraries: the switches never reach the release build. Also builds
# the release preset's extension (build-release/), whose full recording is the control rung.
set -euo pipefail
source "$(dirname "$0")/../utils/lib/common.sh"
cd "$CRUCIBLE_ROOT"
PY="$(crucible_python)"
B=build-ablation
mkdir -p "$B"
flags="-O3 -march=native -DNDEBUG -g"
cmake -S . -B "$B" -G Ninja -DCMAKE_CXX_COMPILER=g++ -DCMAKE_C_COMPILER=gcc -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_CXX_FLAGS_RELEASE=$flags" "-DCMAKE_C_FLAGS_RELEASE=$flags" \
  -DCRUCIBLE_SANITIZER=none -DCRUCIBLE_CONTRACTS=observe -DCRUCIBLE_BUILD_TESTS=OFF -DCRUCIBLE_BUILD_BENCH=OFF \
  -DCRUCIBLE_VESSEL_ABLATION=ON >"$B/configure.log" 2>&1 || { tail -20 "$B/configure.log"; exit 1; }
cmake --build "$B" -j "${CRUCIBLE_JOBS:-$(nproc)}" --target _crucible_ext >"$B/build.log" 2>&1 ||
  { tail -30 "$B/build.log"; exit 1; }
# The release build's extension, for the control rung (the full recording without the switches).
R=build-release
if [[ ! -f "$R/build.ninja" ]]; then cmake --preset release >"$B/configure-release.log" 2>&1 ||
  { tail -20 "$B/configure-release.log"; exit 1; }; fi
cmake --build "$R" -j "${CRUCIBLE_JOBS:-$(nproc)}" --target _crucible_ext >"$B/build-release.log" 2>&1 ||
  { tail -30 "$B/build-release.log"; exit 1; }
CRUCIBLE_BUILD_DIR="$B" CRUCIBLE_RELEASE_BUILD_DIR="$R" "$PY" bench/python/vessel_ablation.py "$@"
