"""make_fixtures_1_13.py — wrote the committed torch 1.13 .pt files beside it, and expected.json.

Run once with torch 1.13.1 (Debian 12's python3-torch 1.13.1+dfsg-4, which reports 1.13.0a0):
    /usr/bin/python3 test/ptload/fixtures-1.13/make_fixtures_1_13.py test/ptload/fixtures-1.13
The files are committed because setup no longer installs torch 1.13; torch 2.x writes other
records (byteorder, .format_version, .storage_alignment, .data/serialization_id), so 2.x files
cannot stand in for them. expected.json holds what this torch saw: per file the archive's
records, every tensor (name, dtype, sizes, strides, storage offset, requires_grad, parameter,
storage index, float32 values, non-finite ones as "inf", "-inf", "nan") and a few plain
values. torch113_test.cpp reads it.
"""
import collections
import json
import math
import os
import sys
import zipfile

import torch

assert torch.__version__.startswith("1.13"), "run with torch 1.13, not " + torch.__version__
OUT = sys.argv[1]
torch.manual_seed(0)


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


def save(name, obj, plain):
    path = os.path.join(OUT, name)
    torch.save(obj, path)
    storages, rows = {}, []
    for tname, t in tensors_of(obj):
        ptr = t.storage().data_ptr()
        rows.append({
            "name": tname, "dtype": str(t.dtype).replace("torch.", ""), "sizes": list(t.shape),
            "strides": list(t.stride()), "offset": t.storage_offset(),
            "requires_grad": bool(t.requires_grad),
            "parameter": isinstance(t, torch.nn.Parameter),
            "storage": storages.setdefault(ptr, len(storages)),
            "values": [v if math.isfinite(v) else str(v)  # "inf", "-inf", "nan"
                       for v in t.detach().to(torch.float32).flatten().tolist()],
        })
    with zipfile.ZipFile(path) as z:
        records = sorted(n.split("/", 1)[1] for n in z.namelist() if "/data/" not in n)
    return {"records": records, "tensors": rows, "plain": plain}


base = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
state_dict = collections.OrderedDict([
    ("f32", torch.tensor([1.5, -2.25, 3.0e38, -1.0e-40, -0.0], dtype=torch.float32)),
    ("f64", torch.tensor([1.0 / 3.0, -1e300, 7.0], dtype=torch.float64)),
    ("f16", torch.tensor([6e-8, -6.1e-5, 65504.0, 0.333], dtype=torch.float16)),
    ("bf16", torch.tensor([1.0e38, -3.14159, 0.5], dtype=torch.bfloat16)),
    ("i64", torch.tensor([-(2**53), 2**53, -7], dtype=torch.int64)),
    ("i32", torch.tensor([-(2**31), 2**31 - 1], dtype=torch.int32)),
    ("i16", torch.tensor([-32768, 32767], dtype=torch.int16)),
    ("i8", torch.tensor([-128, 127], dtype=torch.int8)),
    ("u8", torch.tensor([0, 255], dtype=torch.uint8)),
    ("bool", torch.tensor([True, False, True])),
    ("scalar", torch.tensor(2.75)),
    ("empty", torch.zeros(0, 3)),
    ("base", base),
    ("transposed", base.transpose(0, 2)),  # shares base's storage
    ("sliced", base[1:, 1:, ::2]),         # offset 16, strides (12, 4, 2)
    ("expanded", torch.arange(3.0).reshape(3, 1).expand(3, 2)),
])

torch.manual_seed(1)
net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
adam = torch.optim.Adam(net.parameters(), lr=0.01)
sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
for opt in (adam, sgd):
    opt.zero_grad()
    net(torch.randn(4, 3)).square().sum().backward()
    opt.step()
checkpoint = {"model": net.state_dict(), "adam": adam.state_dict(), "sgd": sgd.state_dict(),
              "epoch": 3, "lr": 0.125, "name": "run-1", "flag": True, "nothing": None,
              "param": torch.nn.Parameter(torch.randn(2, 2)),
              "frozen": torch.nn.Parameter(torch.ones(2), requires_grad=False),
              "dt": torch.float16, "sz": torch.Size([2, 3]), "big": 2**70,
              "hist": [torch.tensor([1, 2], dtype=torch.int32), (torch.ones(1), 5)], 7: torch.ones(1)}

expected = {
    "torch": torch.__version__,
    "files": {
        "state_dict.pt": save("state_dict.pt", state_dict, {}),
        "checkpoint.pt": save("checkpoint.pt", checkpoint, {
            "epoch": 3, "lr": 0.125, "name": "run-1", "flag": True,
            "adam_lr": adam.state_dict()["param_groups"][0]["lr"],
            "adam_params": adam.state_dict()["param_groups"][0]["params"],
            "sgd_momentum": sgd.state_dict()["param_groups"][0]["momentum"]}),
    },
}
with open(os.path.join(OUT, "expected.json"), "w") as f:  # one tensor a line
    f.write('{"torch": %s,\n "files": {\n' % json.dumps(expected["torch"]))
    for i, (name, e) in enumerate(expected["files"].items()):
        f.write('  %s: {"records": %s, "plain": %s,\n   "tensors": [\n' % (
            json.dumps(name), json.dumps(e["records"]), json.dumps(e["plain"])))
        f.write(",\n".join("    " + json.dumps(row, allow_nan=False) for row in e["tensors"]))
        f.write("]}%s\n" % ("," if i + 1 < len(expected["files"]) else ""))
    f.write(" }}\n")
print("wrote", sorted(expected["files"]), "with torch", torch.__version__)
