"""utils/bin/setup's package lists, per Debian release, without installing anything: the names
utils/bin/check-debian-packages looks up in each release's index (network, not here).

Run by utils/bin/test with the package tests:
    .venv/bin/python -m pytest -q test/package/test_setup.py
"""
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETUP = os.path.join(REPO, "utils", "bin", "setup")


def setup(*args, **env):
    return subprocess.run([SETUP, *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **env))


def names(release, **env):
    r = setup("--packages", release, **env)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_each_release_gets_its_own_clang_runtime_and_the_llvm_it_asks_for():
    bookworm, trixie = names("12"), names("13")
    assert "libclang-rt-14-dev" in bookworm and "llvm-14" in bookworm and "llvm-19-dev" in bookworm
    assert "libclang-rt-19-dev" in trixie and "llvm-19-dev" in trixie
    assert trixie.count("llvm-19") == 1   # clang's and the backend's LLVM are one package there
    assert len(bookworm) == len(set(bookworm)) and len(trixie) == len(set(trixie))
    assert names("12", CRUCIBLE_LLVM_VERSION="14").count("llvm-14") == 1
    for lst in (bookworm, trixie):   # the libraries the build finds (cmake/CrucibleDeps.cmake)
        assert {"libabsl-dev", "libgtest-dev", "libtomlplusplus-dev", "libopenblas-pthread-dev",
                "pybind11-dev", "python3-venv"} <= set(lst)


def test_an_unsupported_release_or_argument_is_refused_with_what_is_supported():
    r = setup("--packages", "11")
    assert r.returncode == 2 and "Crucible sets up Debian 12 and 13" in r.stderr, r.stderr
    r = setup("--frobnicate")
    assert r.returncode == 2 and "unknown argument '--frobnicate'" in r.stderr, r.stderr
    r = setup("--packages", "13", CRUCIBLE_LLVM_VERSION="17")
    assert r.returncode == 2 and "LLVM 19 or 14" in r.stderr, r.stderr
