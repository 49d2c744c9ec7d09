"""The `crucible` command that `pip install .` puts on PATH: runs the native command-line tool
installed inside the crucible_native package (crucible pt ls|check, plan, venn; misc/CLI.md).
A package of its own, so that the command starts without importing torch."""
import importlib.util
import os
import sys


def binary() -> str:
    """Path of the installed `crucible` executable (found without importing crucible_native)."""
    spec = importlib.util.find_spec("crucible_native")
    places = list(spec.submodule_search_locations or []) if spec is not None else []
    places += [os.path.join(p, "crucible_native") for p in sys.path if p]
    for place in places:
        exe = os.path.join(place, "bin", "crucible")
        if os.access(exe, os.X_OK):
            return exe
    raise SystemExit("crucible: the native command is not installed with crucible_native; install the "
                     "package with: pip install --no-build-isolation <crucible source>")


def main() -> None:
    exe = binary()
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
