"""`pip install --no-build-isolation .` of this checkout, used as a user would: from outside the
source tree, with no PYTHONPATH to the sources and no CRUCIBLE_BUILD_DIR.

Run by utils/bin/test after the presets (it builds the package once more, in build-pip/):
    .venv/bin/python -m pytest -q test/package
"""
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    target = str(tmp_path_factory.mktemp("site"))
    # --no-deps: torch is already in this environment; --target would otherwise put a second
    # copy of it there.
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                        "--target", target, REPO], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return target


def run_py(installed, code, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("CRUCIBLE_BUILD_DIR", "PYTHONPATH")}
    env["PYTHONPATH"] = installed
    env["CRUCIBLE_CACHE_DIR"] = os.path.join(cwd, "kernel-cache")  # not the user's cache
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def test_the_installed_package_records_and_compiles(installed, tmp_path):
    r = run_py(installed, f"""
        import torch, torch.nn as nn, torch.nn.functional as F
        import crucible_native as crucible
        assert crucible.__file__.startswith({installed!r}), crucible.__file__
        assert crucible.build_dir().startswith({installed!r}), crucible.build_dir()
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
        with crucible.recording():
            F.cross_entropy(m(x), y).backward()
        names = [o["name"] for o in crucible.trace().ops()]
        assert "aten::addmm" in names and "aten::mm" in names, names

        def step(x, y):
            opt.zero_grad(); loss = F.cross_entropy(m(x), y); loss.backward(); opt.step(); return loss
        torch.manual_seed(0)
        m2 = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        opt2 = torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9)
        def step2(x, y):
            opt2.zero_grad(); loss = F.cross_entropy(m2(x), y); loss.backward(); opt2.step(); return loss
        m2.load_state_dict(m.state_dict())
        compiled = crucible.compile(step2)
        for _ in range(6):
            assert torch.equal(step(x, y), compiled(x, y))
        assert compiled.stats()["plan_runs"] == 3, compiled.stats()
        # the plan ran through the exec stage: the package carries Forge's rules and LLVM's module
        plan = compiled.plans()[0]
        assert plan["exec"] == "cpu" and plan["exec_generated_calls"] > 0, plan["exec_note"]
        print("ok")
        """, cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_the_crucible_command_runs_without_torch_and_reads_a_pt_file(installed, tmp_path):
    # The console script's module finds the native binary without importing torch.
    r = run_py(installed, """
        import sys, crucible_cli
        exe = crucible_cli.binary()
        assert "torch" not in sys.modules and "crucible_native" not in sys.modules
        print(exe)
        """, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    exe = r.stdout.strip()
    assert exe.startswith(installed) and os.access(exe, os.X_OK)
    pt = tmp_path / "w.pt"
    r = run_py(installed, f"import torch; torch.save({{'w': torch.arange(6.).reshape(2, 3)}}, {str(pt)!r})",
               cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    r = subprocess.run([exe, "pt", "ls", str(pt)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "w" in r.stdout and "float32" in r.stdout, r.stdout + r.stderr
    # pip's launcher for `crucible` (in <target>/bin) runs the same binary
    launcher = os.path.join(installed, "bin", "crucible")
    env = dict(os.environ, PYTHONPATH=installed)
    r = subprocess.run([sys.executable, launcher, "pt", "check", str(pt)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
