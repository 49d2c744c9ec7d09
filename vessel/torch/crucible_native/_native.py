"""Loading the native part: _crucible_ext and the libraries beside it.

Where from, in order: CRUCIBLE_BUILD_DIR (a CMake build directory, for development); the
package's own folder (what `pip install .` put there); <repo>/build-release when the package is
used from a source checkout. Each build holds crucible_build.json, written by CMake: the
sanitizer it was built with and the torch it was built against. A sanitizer build cannot be
loaded into a plain Python process, and a library built against one torch cannot load into
another: both are refused here with what to do, instead of crashing or failing with a missing
symbol.
"""
from __future__ import annotations

import json
import os
import sys

_PKG = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(_PKG)))   # vessel/torch/crucible_native -> repo
_SANITIZER_RUNTIMES = {
    "asan-ubsan": ("libasan", "LD_PRELOAD=$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so) "
                              "ASAN_OPTIONS=detect_leaks=0"),
    "tsan": ("libtsan", "LD_PRELOAD=$(gcc -print-file-name=libtsan.so)"),
    "ubsan-strict": ("libubsan", "LD_PRELOAD=$(gcc -print-file-name=libubsan.so)"),
}


def _installed_dir():
    """The folder `pip install .` put the extension in (inside this package; for an editable
    install, the site-packages copy of it), or None."""
    if os.environ.get("CRUCIBLE_BUILD_DIR"):
        return None
    import importlib.util
    try:
        spec = importlib.util.find_spec(__name__.rpartition(".")[0] + "._crucible_ext")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return os.path.dirname(spec.origin)


def build_dir() -> str:
    """Where the native libraries are loaded from: CRUCIBLE_BUILD_DIR (a CMake build
    directory), the installed package's folder, or <repo>/build-release in a source checkout."""
    d = os.environ.get("CRUCIBLE_BUILD_DIR")
    if d:
        return d
    return _installed_dir() or os.path.join(_REPO, "build-release")


def _runtime_loaded(name: str) -> bool:
    try:
        with open("/proc/self/maps") as f:
            return any(name in line for line in f)
    except OSError:
        return False


def _rebuild_hint(d: str) -> str:
    if d == _installed_dir():   # an installed package
        return ("reinstall the package against this torch: pip install --no-build-isolation --force-reinstall "
                "<crucible source>")
    return ("rebuild against this torch: cmake --preset release -DCRUCIBLE_PYTHON=" + sys.executable +
            " && cmake --build --preset release")


def check_build(info: dict, d: str, torch_version: str) -> None:
    """Raises ImportError when the build in `d` (its crucible_build.json is `info`) cannot load
    into this process: a sanitizer build without its runtime, or another torch."""
    san = info.get("sanitizer", "none")
    if san != "none":
        runtime, preload = _SANITIZER_RUNTIMES.get(san, (san, "LD_PRELOAD=<the sanitizer runtime>"))
        if not _runtime_loaded(runtime):
            raise ImportError(
                f"crucible_native: {d} is a '{san}' sanitizer build; its libraries only load after "
                f"the sanitizer runtime. Either rebuild without a sanitizer "
                f"(cmake --preset release && cmake --build --preset release, then unset "
                f"CRUCIBLE_BUILD_DIR or set it to build-release), or preload the runtime: "
                f"{preload} {sys.executable} ...")
    built = info.get("torch", "")
    if not built:
        raise ImportError(f"crucible_native: the build in {d} was made without PyTorch (CMake found no torch "
                          f"from its CRUCIBLE_PYTHON): {_rebuild_hint(d)}")
    if built != torch_version:
        raise ImportError(f"crucible_native: the build in {d} was made against torch {built}, and this "
                          f"Python ({sys.executable}) has torch {torch_version}; the native libraries only "
                          f"load into the torch they were built against: {_rebuild_hint(d)}")


# The loaded build's crucible_build.json (CMakeLists.txt): its torch, sanitizer, and whether
# it has the exec stage ("exec": false where configured with -DCRUCIBLE_LLVM=OFF or built for a torch
# of the old std::string ABI; "exec_off" says which).
build_info = {}


def load(module="_crucible_ext"):
    """Imports and returns the native module (_crucible_ext), after the checks above."""
    installed = _installed_dir()
    d = installed or build_dir()
    lib = d if installed else os.path.join(d, "lib")
    info_path = os.path.join(lib, "crucible_build.json")
    if not os.path.exists(info_path):
        raise ImportError(
            f"crucible_native: no Crucible build in {d} ({info_path} is missing). "
            "Install the package (pip install --no-build-isolation .), or build it with: "
            "cmake --preset release && cmake --build --preset release, "
            "or point CRUCIBLE_BUILD_DIR at a build directory.")
    with open(info_path) as f:
        info = json.load(f)
    build_info.update(info)
    import torch  # loads libtorch first, with the symbols the extension needs
    check_build(info, d, torch.__version__)
    if info.get("exec") is False and module == "_crucible_exec":
        why = info.get("exec_off") or "it was configured with -DCRUCIBLE_LLVM=OFF"
        raise ImportError(f"the build in {d} has no exec stage: {why}")
    import importlib
    try:
        if installed:
            return importlib.import_module(__name__.rpartition(".")[0] + "." + module)
        if lib not in sys.path:
            sys.path.insert(0, lib)
        return importlib.import_module(module)
    except ImportError as e:
        hint = _rebuild_hint(d)
        raise ImportError(f"crucible_native: cannot load the extension from {lib}: {e}. "
                          f"{hint[0].upper()}{hint[1:]}") from e


ext = load()
_exec = None


def load_exec():
    """_crucible_exec (the exec stage and Mimic's CPU backend on recorded steps, ExecExt.cpp),
    imported on first use: it loads LLVM, which the rest of crucible_native does not need."""
    global _exec
    if _exec is None:
        _exec = load("_crucible_exec")
    return _exec
