"""The `crucible` tool: `pt ls --json` against torch.load of the same files, `pt check` verdicts,
usage errors and help.

CTest sets CRUCIBLE_CLI (the binary) and CRUCIBLE_PTLOAD_FIXTURES (what
test/ptload/make_fixtures.py wrote: valid files and one malicious or broken file per refusal
class in bad/). The reference is always PyTorch itself, never the loader under test.
"""
import json
import os
import re
import subprocess

import pytest
import torch

CLI = os.environ.get("CRUCIBLE_CLI", "")
FIXTURES = os.environ.get("CRUCIBLE_PTLOAD_FIXTURES", "")
if not (os.path.isfile(CLI) and os.path.isdir(FIXTURES)):
    raise RuntimeError("run through CTest (ctest -R cli_test), which sets CRUCIBLE_CLI to the "
                       "crucible binary and CRUCIBLE_PTLOAD_FIXTURES to the generated fixtures; "
                       "got CRUCIBLE_CLI=%r CRUCIBLE_PTLOAD_FIXTURES=%r" % (CLI, FIXTURES))


def crucible(*args):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=120)


def fixture(name):
    return os.path.join(FIXTURES, name)


# ---------------------------------------------------------------- the reference: torch.load
def tensors_of(obj, path=""):
    """Depth-first, keys joined by '.', list/tuple items numbered: the loader's naming."""
    def child(p):
        return p if not path else path + "." + p
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from tensors_of(v, child(str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from tensors_of(v, child(str(i)))


def reference(path):
    obj = torch.load(path, map_location="cpu")
    rows, storages = [], {}
    for name, t in tensors_of(obj):
        rows.append({"name": name, "dtype": str(t.dtype).replace("torch.", ""),
                     "shape": list(t.shape), "strides": list(t.stride()),
                     "storage_offset": t.storage_offset(), "numel": t.numel(),
                     "bytes": t.numel() * t.element_size(), "requires_grad": t.requires_grad,
                     "contiguous": t.is_contiguous()})
        s = t.storage()
        storages[s.data_ptr()] = s.nbytes()
    totals = {"tensors": len(rows), "numel": sum(r["numel"] for r in rows),
              "bytes": sum(r["bytes"] for r in rows), "storages": len(storages),
              "storage_bytes": sum(storages.values())}
    return rows, totals


def ls_json(path):
    r = crucible("pt", "ls", "--json", path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr == ""
    return json.loads(r.stdout)


def assert_matches_torch(path, big_endian=False):
    got = ls_json(path)
    rows, totals = reference(path)
    assert got["ok"] is True and got["file"] == str(path)
    assert got["big_endian"] is big_endian
    keys = ("name", "dtype", "shape", "strides", "storage_offset", "numel", "bytes",
            "requires_grad", "contiguous")
    assert [{k: t[k] for k in keys} for t in got["tensors"]] == rows
    assert got["totals"] == totals
    return got


# ---------------------------------------------------------------- pt ls against torch.load
VALID = [
    ("dtypes.pt", False),         # every supported dtype, 0-d and empty tensors
    ("views.pt", False),          # shared storages: transposed, sliced, offset, expanded views
    ("nested.pt", False),         # nested dicts, lists, tuples, parameters, int keys, non-tensors
    ("resnet18.pt", False),       # a real state dict: 122 tensors, 44.6 MiB
    ("handmade.pt", False),       # a hand-written pickle torch also loads
    ("dtypes_big.pt", True),      # byteorder 'big': storages swapped on load
    ("views_big.pt", True),
    ("dtypes_deflate.pt", False), # deflated records
    ("views_zip64.pt", False),    # ZIP64 records
]


@pytest.mark.parametrize("name,big", VALID, ids=[v[0] for v in VALID])
def test_ls_json_matches_torch_load(name, big):
    assert_matches_torch(fixture(name), big_endian=big)


def test_ls_reports_shared_storages():
    got = ls_json(fixture("views.pt"))
    t = got["totals"]
    assert t["storages"] < t["tensors"]
    assert t["storage_bytes"] < t["bytes"]  # the views overlap
    r = crucible("pt", "ls", fixture("views.pt"))
    assert r.returncode == 0
    assert "tensors share storages" in r.stdout


def test_ls_table_lists_every_tensor_and_the_totals():
    path = fixture("resnet18.pt")
    rows, totals = reference(path)
    r = crucible("pt", "ls", path)
    assert r.returncode == 0 and r.stderr == ""
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["name", "dtype", "shape", "numel", "bytes"]
    body = {ln.split()[0]: ln for ln in lines[1:len(rows) + 1]}
    assert list(body) == [row["name"] for row in rows]
    fc = body["fc.weight"]
    assert "float32" in fc and "[1000, 512]" in fc and "512,000" in fc and "2,048,000" in fc
    assert "%d tensors, %s elements, %s bytes" % (
        totals["tensors"], format(totals["numel"], ","), format(totals["bytes"], ",")) in r.stdout
    assert "byte order: little-endian" in r.stdout
    big = crucible("pt", "ls", fixture("dtypes_big.pt"))
    assert "byte order: big-endian" in big.stdout


def test_ls_file_saved_here_resnet18(tmp_path):
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "utils", "python"))
    import crucible_zoo  # torchvision's resnet18 without torchvision
    torch.manual_seed(1)
    path = tmp_path / "resnet18.pt"
    torch.save(crucible_zoo.resnet18().state_dict(), path)  # random weights
    got = assert_matches_torch(path)
    assert got["totals"]["tensors"] == 122
    r = crucible("pt", "check", path)
    assert r.returncode == 0, r.stdout
    assert r.stdout.startswith("OK ") and "122 tensors" in r.stdout


def test_ls_file_saved_here_views_parameters_and_a_top_level_tensor(tmp_path):
    x = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    obj = {"x": x, "xt": x.t(), "tail": x[2:, 1::2], "p": torch.nn.Parameter(torch.ones(3)),
           "layers": [torch.zeros(2, dtype=torch.int16), (torch.eye(2).to(torch.bfloat16),)]}
    path = tmp_path / "views.pt"
    torch.save(obj, path)
    got = assert_matches_torch(path)
    assert got["totals"]["storages"] == 4  # x and its two views share one
    top = tmp_path / "top.pt"
    torch.save(torch.randn(5, 5).half(), top)
    got = assert_matches_torch(top)
    assert [t["name"] for t in got["tensors"]] == [""]
    assert "<top-level tensor>" in crucible("pt", "ls", top).stdout


# ---------------------------------------------------------------- pt check
@pytest.mark.parametrize("name", [v[0] for v in VALID])
def test_check_accepts_valid_files(name):
    r = crucible("pt", "check", fixture(name))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("OK ") and "CRC-32 of every record verified" in r.stdout
    assert r.stderr == ""


# Each malicious or broken fixture: (the refusal class `pt check` names, a phrase of the loader's
# own message, as in test/ptload/refusal_test.cpp).
BAD = {
    "global_os_system": ("code-import", "GLOBAL os.system is not on the allowlist"),
    "global_near_miss": ("code-import",
                         "GLOBAL torch._utils._rebuild_tensor is not on the allowlist"),
    "reduce_storage_class": ("code-call", "REDUCE on global torch.FloatStorage"),
    "newobj_rebuild": ("code-call", "NEWOBJ on global torch._utils._rebuild_tensor_v2"),
    "build_on_list": ("code-call", "BUILD on a list"),
    "tensor_hooks": ("code-hooks", "with backward hooks"),
    "setitem_on_list": ("pickle-refused", "SETITEM(S) on a list"),
    "append_on_dict": ("pickle-refused", "APPEND to a dict"),
    "persid_short": ("storage-reference", "persistent id a tuple of 4 items"),
    "persid_tag": ("storage-reference", "persistent id tag is a str, not 'storage'"),
    "persid_key": ("storage-reference", "key '../0' is not a plain record name"),
    "persid_missing": ("storage-reference",
                       "storage record 'a/data/9' named by the pickle is missing"),
    "persid_not_tuple": ("storage-reference", "persistent id a str"),
    "storage_type_clash": ("storage-reference", "referenced twice with different types or sizes"),
    "numel_vs_record": ("storage-reference",
                        "holds 16 bytes but the pickle says 100 elements of float32"),
    "view_outside": ("tensor-extent", "reaches element 19 but the storage has 4 elements"),
    "view_offset_outside": ("tensor-extent", "reaches element 4 but the storage has 4 elements"),
    "stride_overflow": ("tensor-extent", "overflows 64 bits"),
    "negative_stride": ("tensor-extent", "negative stride -1"),
    "torchscript": ("torchscript", "a TorchScript archive (torch.jit.save"),
    "opcode_stack_global": ("pickle-opcode", "opcode STACK_GLOBAL is not allowed"),
    "opcode_inst": ("pickle-opcode", "opcode INST is not allowed"),
    "opcode_obj": ("pickle-opcode", "opcode OBJ is not allowed"),
    "opcode_ext1": ("pickle-opcode", "opcode EXT1 is not allowed"),
    "protocol4": ("pickle-protocol", "pickle protocol 4"),
    "memo_out_of_range": ("pickle-corrupt", "memo index 7 was never stored"),
    "stack_underflow": ("pickle-corrupt", "stack underflow"),
    "mark_open_at_stop": ("pickle-corrupt", "MARK(s) still open at STOP"),
    "tuple_without_mark": ("pickle-corrupt", "no MARK to pop to"),
    "length_past_end": ("pickle-corrupt", "needs 1000 bytes but only 3 are left"),
    "cycle": ("reference-cycle", "contains itself"),
    "dag_bomb": ("object-graph-bomb", "revisits shared containers too often"),
    "key_repr_bomb": ("object-graph-bomb", "revisits shared containers too often"),
    "setitem_bomb": ("repeated-work", "dict keys set again and again"),
    "expanded_view": ("expanded-view", "expanded or overlapping view"),
    "truncated": ("truncated", "no zip end-of-central-directory record"),
    "zip_traversal": ("zip-structure", "path traversal ('..') in entry name 'a/../../etc/passwd'"),
    "zip_absolute": ("zip-structure", "absolute entry name '/etc/passwd'"),
    "zip_duplicate": ("zip-structure", "duplicate entry name 'a/data.pkl'"),
    "zip_overlap": ("zip-structure", "entries 'a/data.pkl' and 'a/data/0' overlap"),
    "zip_outside": ("zip-structure", "has no local header at its offset"),
    "zip_encrypted": ("zip-structure", "is encrypted"),
    "zip_crc": ("checksum", "fails its checksum"),
    "zip_bomb": ("zip-structure", "more than deflate can produce"),
    "byteorder_middle": ("byteorder", "byteorder record says 'middle'"),
    "legacy": ("legacy-format", "a legacy (PyTorch < 1.6, non-zip) torch.save file"),
}
CODE_CLASSES = {"code-import", "code-call", "code-hooks", "pickle-opcode"}


def test_every_bad_fixture_has_an_expected_class():
    on_disk = {f[:-3] for f in os.listdir(fixture("bad")) if f.endswith(".pt")}
    assert on_disk == set(BAD), "make_fixtures.py and this table disagree"


@pytest.mark.parametrize("name", sorted(BAD))
def test_check_refuses_and_explains(name):
    cls, phrase = BAD[name]
    path = fixture("bad/%s.pt" % name)
    r = crucible("pt", "check", path)
    assert r.returncode == 1, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("REFUSED: " + path + ": ")  # the loader's own message, verbatim
    assert phrase in first
    assert "What this means [%s: " % cls in r.stdout
    explanation = " ".join(r.stdout.split("What this means", 1)[1].split())  # unwrapped
    assert len(explanation.split()) > 15  # a plain-words paragraph, not a label
    if cls in CODE_CLASSES:
        assert "Do not open it with torch.load" in explanation
        assert "torch.save(model.state_dict(), path)" in explanation
    if cls == "code-import":
        assert "import %s," % phrase.split()[1] in explanation
        assert "execute code" in explanation


@pytest.mark.parametrize("name", ["global_os_system", "zip_crc", "torchscript"])
def test_ls_refuses_with_exit_1(name):
    path = fixture("bad/%s.pt" % name)
    r = crucible("pt", "ls", path)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("REFUSED: ") and "What this means [%s: " % BAD[name][0] in r.stderr
    j = crucible("pt", "ls", "--json", path)
    assert j.returncode == 1
    got = json.loads(j.stdout)
    assert got["ok"] is False and got["refusal_class"] == BAD[name][0]
    assert BAD[name][1] in got["error"] and got["explanation"]


def test_check_catches_a_flipped_byte_in_a_file_saved_here(tmp_path):
    path = tmp_path / "w.pt"
    torch.save({"w": torch.arange(4096, dtype=torch.float32)}, path)
    data = bytearray(path.read_bytes())
    at = data.index(torch.arange(4096, dtype=torch.float32).numpy().tobytes()[4000:4016])
    data[at] ^= 0x40
    path.write_bytes(bytes(data))
    r = crucible("pt", "check", path)
    assert r.returncode == 1
    assert "fails its checksum" in r.stdout and "What this means [checksum: " in r.stdout


def test_check_names_a_file_that_is_not_a_pt_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not a checkpoint\n")
    r = crucible("pt", "check", path)
    assert r.returncode == 1
    assert "What this means [not-pt: " in r.stdout


def test_check_repeat_prints_timings():
    path = fixture("resnet18.pt")
    r = crucible("pt", "check", "--repeat", 3, path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(re.findall(r"^open \d/3: [0-9.]+ ms$", r.stdout, re.M)) == 3
    m = re.search(r"^timing: opens=(\d+) file_bytes=(\d+) median_s=([0-9.]+) min_s=([0-9.]+) "
                  r"seconds=([0-9.,]+) ", r.stdout, re.M)
    assert m, r.stdout
    assert int(m.group(1)) == 3 and int(m.group(2)) == os.path.getsize(path)
    secs = [float(s) for s in m.group(5).split(",")]
    assert len(secs) == 3 and min(secs) == pytest.approx(float(m.group(4)))
    assert sorted(secs)[1] == pytest.approx(float(m.group(3)))
    assert "every byte is read" in r.stdout
    assert r.stdout.splitlines()[-1].startswith("OK ")


# ---------------------------------------------------------------- usage errors and help
USAGE_ERRORS = [
    ([], "missing command"),
    (["frobnicate"], "unknown command 'frobnicate'"),
    (["pt"], "missing command"),
    (["pt", "cat", "x.pt"], "unknown command 'cat'"),
    (["pt", "ls"], "missing FILE"),
    (["pt", "check"], "missing FILE"),
    (["pt", "ls", "/nonexistent/model.pt"], "cannot open '/nonexistent/model.pt'"),
    (["pt", "check", "/nonexistent/model.pt"], "cannot open '/nonexistent/model.pt'"),
    (["pt", "ls", "/"], "is not a regular file"),
    (["pt", "ls", "--bogus", "x.pt"], "unknown option '--bogus'"),
    (["pt", "check", "--json", "x.pt"], "unknown option '--json'"),
    (["pt", "ls", "--repeat", "2", "x.pt"], "unknown option '--repeat'"),
    (["pt", "check", "--repeat"], "--repeat needs a count"),
    (["pt", "check", "--repeat", "0", "x.pt"], "--repeat takes a positive integer"),
    (["pt", "check", "--repeat", "3x", "x.pt"], "--repeat takes a positive integer"),
    (["pt", "ls", "a.pt", "b.pt"], "one FILE at a time"),
]


@pytest.mark.parametrize("args,message", USAGE_ERRORS,
                         ids=[" ".join(a) or "<none>" for a, _ in USAGE_ERRORS])
def test_usage_errors_exit_2(args, message):
    r = crucible(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == ""
    assert r.stderr.startswith("crucible: ") and message in r.stderr
    assert "--help' for usage" in r.stderr


def test_help():
    for args in (["--help"], ["-h"]):
        r = crucible(*args)
        assert r.returncode == 0 and r.stderr == ""
        assert "usage: crucible COMMAND" in r.stdout and "\n  pt " in r.stdout
    r = crucible("pt", "--help")
    assert r.returncode == 0
    assert "usage: crucible pt COMMAND" in r.stdout
    assert "\n  ls [--json] FILE" in r.stdout and "\n  check FILE" in r.stdout
    assert "--repeat" not in r.stdout  # a benchmark option: documented by `check --help` only
    r = crucible("pt", "check", "--help")
    assert r.returncode == 0 and "usage: crucible pt check FILE" in r.stdout
    assert "--repeat N" in r.stdout
    r = crucible("pt", "ls", "--help")
    assert r.returncode == 0 and "--json" in r.stdout
