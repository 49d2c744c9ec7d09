"""The crucible_native package: its error types, and its refusal of a build it cannot load."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

import crucible_native as crucible


def test_bad_arguments_are_type_and_value_errors_and_crucible_errors():
    with pytest.raises(TypeError, match="ring_entries must be an int, got str") as e:
        crucible.configure(ring_entries="many")
    assert isinstance(e.value, crucible.CrucibleError)
    with pytest.raises(ValueError, match="ring_entries 3 is not a power of two") as e:
        crucible.configure(ring_entries=3)
    assert isinstance(e.value, crucible.CrucibleError)
    with pytest.raises(TypeError, match="drop_when_full must be True or False"):
        crucible.enable(drop_when_full=1)
    with pytest.raises(TypeError, match="needs a callable"):
        crucible.compile(42)
    with pytest.raises(ValueError, match="thread -2 is no recording thread"):
        crucible.iteration(thread=-2)
    with pytest.raises(TypeError, match="expected tensors"):
        crucible.mark_inputs("x")


def test_the_native_side_reports_by_type():
    # The recorder exists once anything recorded: a valid setting that is too late is a state
    # error, raised as that type by the native side (no message parsing).
    crucible.flush()
    with pytest.raises(crucible.CrucibleStateError, match="configure it before recording starts"):
        crucible.configure(ring_entries=1 << 12)
    # A value the native side refuses (an alignment that is no power of two) is a ValueError.
    with pytest.raises(crucible.CrucibleValueError, match="alignment"):
        crucible._ext.configure_plan(0, 3, check_only=True)


def _import_with(build_info_patch):
    """Imports crucible_native in a child process against a copy of this build whose
    crucible_build.json is patched; returns (returncode, stderr)."""
    src = os.path.join(crucible.build_dir(), "lib")
    with tempfile.TemporaryDirectory() as d:
        lib = os.path.join(d, "lib")
        shutil.copytree(src, lib, symlinks=True, ignore=shutil.ignore_patterns("*.a"))
        with open(os.path.join(lib, "crucible_build.json")) as f:
            info = json.load(f)
        info.update(build_info_patch)
        with open(os.path.join(lib, "crucible_build.json"), "w") as f:
            json.dump(info, f)
        env = dict(os.environ, CRUCIBLE_BUILD_DIR=d,
                   PYTHONPATH=os.path.dirname(os.path.dirname(crucible.__file__)))
        r = subprocess.run([sys.executable, "-c", "import crucible_native"], env=env,
                           capture_output=True, text=True, timeout=120)
        return r.returncode, r.stderr


def test_a_build_made_against_another_torch_is_refused_at_import_with_how_to_rebuild():
    rc, err = _import_with({"torch": "2.4.0+cu121"})
    assert rc != 0
    assert "ImportError" in err and "made against torch 2.4.0+cu121" in err
    assert f"has torch {torch.__version__}" in err and "rebuild against this torch" in err


def test_a_build_made_without_torch_is_refused_at_import():
    rc, err = _import_with({"torch": ""})
    assert rc != 0 and "made without PyTorch" in err


def test_the_build_records_the_torch_it_was_built_against():
    with open(os.path.join(crucible.build_dir(), "lib", "crucible_build.json")) as f:
        info = json.load(f)
    assert info["torch"] == torch.__version__
    assert info["torch_cuda"] == (torch.version.cuda or "")
    assert info["cxx11_abi"] == str(int(torch._C._GLIBCXX_USE_CXX11_ABI))   # Note [Old std::string ABI]
    assert bool(info["exec_off"]) != info["exec"], info   # a build without the exec stage says why


def test_an_installation_without_the_crucible_binary_says_how_to_install(tmp_path, monkeypatch):
    # Every build has the binary (without LLVM, `plan` lacks its CPU backend section): one that
    # lacks it is a broken installation.
    import crucible_cli
    (tmp_path / "crucible_native").mkdir()
    monkeypatch.setattr(sys, "path", [str(tmp_path)])   # no other installation is looked at
    with pytest.raises(SystemExit, match="not installed with crucible_native"):
        crucible_cli.binary()
