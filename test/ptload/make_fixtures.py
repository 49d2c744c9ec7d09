"""make_fixtures.py — writes the .pt fixtures of the ptload tests, and PyTorch's own values.

Usage: make_fixtures.py OUT_DIR   (run with the interpreter that imports torch: CRUCIBLE_PYTHON)

OUT_DIR/<name>.pt            valid files (torch.save, plus rewrites: big-endian, deflate, ZIP64)
                             (zero_crc.pt is saved without checksums: it loads only with
                             LoadOptions::allow_zero_crc)
OUT_DIR/<name>.json          what PyTorch sees in them: per tensor name, dtype, sizes, strides,
                             storage offset, requires_grad, and a .f32 file of its float32 values
OUT_DIR/bad/<name>.pt        one malicious or broken file per refusal class (hand-crafted
                             pickles and zips; TorchScript and legacy files from torch itself)
Nothing here is committed: CTest runs this before the C++ tests (FIXTURES_SETUP).
"""
import collections
import io
import json
import os
import struct
import sys
import zipfile
import zlib

import torch

OUT = sys.argv[1]
BAD = os.path.join(OUT, "bad")
os.makedirs(BAD, exist_ok=True)
torch.manual_seed(0)


# ---------------------------------------------------------------- expected values
def tensors_of(obj, path=""):
    """Same order and names as StateDict: depth-first, keys joined by '.'."""
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


def save_valid(name, obj, **kw):
    path = os.path.join(OUT, name + ".pt")
    torch.save(obj, path, **kw)
    write_expected(name, obj)
    return path


def write_expected(name, obj):
    os.makedirs(os.path.join(OUT, name), exist_ok=True)
    rows = []
    for i, (tname, t) in enumerate(tensors_of(obj)):
        f32 = t.detach().to(torch.float32).contiguous()
        binpath = os.path.join(name, "%d.f32" % i)
        with open(os.path.join(OUT, binpath), "wb") as f:
            f.write(f32.numpy().astype("<f4").tobytes())
        rows.append({
            "name": tname, "dtype": str(t.dtype).replace("torch.", ""),
            "sizes": list(t.shape), "strides": list(t.stride()),
            "offset": t.storage_offset(), "requires_grad": bool(t.requires_grad),
            "parameter": isinstance(t, torch.nn.Parameter), "f32": binpath,
            "storage": t.untyped_storage().data_ptr(),
        })
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump({"tensors": rows}, f, indent=1)


# ---------------------------------------------------------------- a small zip writer
def zip_bytes(entries, zip64=False, align=64):
    """entries: list of (name, data, method, flags). Writes local headers, data (stored entries
    aligned like torch's writer), central directory and end record; ZIP64 records everything
    through the extra field and the ZIP64 end record when zip64 is set."""
    out = bytearray()
    central = bytearray()
    for name, data, method, flags in entries:
        nb = name.encode()
        payload = data
        if method == 8:
            c = zlib.compressobj(9, zlib.DEFLATED, -15)
            payload = c.compress(data) + c.flush()
        crc = zlib.crc32(data) & 0xFFFFFFFF
        off = len(out)
        extra = b""
        if method == 0 and align:
            pad = (-(off + 30 + len(nb) + 4)) % align
            extra = struct.pack("<HH", 0x4650, pad) + b"\0" * pad  # 'FB' padding like torch
        csz = 0xFFFFFFFF if zip64 else len(payload)
        usz = 0xFFFFFFFF if zip64 else len(data)
        lextra = extra + (struct.pack("<HHQQ", 1, 16, len(data), len(payload)) if zip64 else b"")
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 45 if zip64 else 20, flags, method, 0, 0x21,
                           crc, csz, usz, len(nb), len(lextra)) + nb + lextra + payload
        cextra = struct.pack("<HHQQQ", 1, 24, len(data), len(payload), off) if zip64 else b""
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45 if zip64 else 20,
                               45 if zip64 else 20, flags, method, 0, 0x21, crc, csz, usz,
                               len(nb), len(cextra), 0, 0, 0, 0,
                               0xFFFFFFFF if zip64 else off) + nb + cextra
    cd_off = len(out)
    out += central
    n = len(entries)
    if zip64:
        rec = len(out)
        out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, len(central), cd_off)
        out += struct.pack("<IIQI", 0x07064B50, 0, rec, 1)
        out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    else:
        out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n, n, len(central), cd_off, 0)
    return bytes(out)


def read_entries(path):
    with zipfile.ZipFile(path) as z:
        return [(i.filename, z.read(i.filename)) for i in z.infolist()]


def rewrite(src, dst, method=0, zip64=False, byteorder=None, swap=None):
    """Copies a torch.save file through zip_bytes; optionally byte-swaps storages (swap maps
    record key -> itemsize) and sets the byteorder record (replacing the one torch >= 1.13
    writes)."""
    entries = []
    prefix = None
    for name, data in read_entries(src):
        prefix = prefix or name.split("/")[0]
        if byteorder is not None and name == prefix + "/byteorder":
            continue
        key = name.split("/data/")[-1] if "/data/" in name else None
        if swap is not None and key is not None and swap.get(key, 1) > 1:
            w = swap[key]
            data = b"".join(data[i:i + w][::-1] for i in range(0, len(data), w))
        entries.append((name, data, method, 0))
    if byteorder is not None:
        entries.append((prefix + "/byteorder", byteorder.encode(), 0, 0))
    with open(dst, "wb") as f:
        f.write(zip_bytes(entries, zip64=zip64))


# ---------------------------------------------------------------- valid fixtures
def dtype_tensors():
    return collections.OrderedDict([
        ("f32", torch.tensor([1.5, -2.25, 3.0e38, -1.0e-40, 0.0, float("inf")], dtype=torch.float32)),
        ("f64", torch.tensor([1.0 / 3.0, -1e300, 2.5e-310, 7.0], dtype=torch.float64)),
        ("f16", torch.tensor([6e-8, -6.1e-5, 65504.0, float("-inf"), -0.0, 0.333], dtype=torch.float16)),
        ("bf16", torch.tensor([1.0e38, -3.14159, 1e-39, 0.5], dtype=torch.bfloat16)),
        ("i64", torch.tensor([-(2**63), 2**63 - 1, 2**40 + 1, -7], dtype=torch.int64)),
        ("i32", torch.tensor([-(2**31), 2**31 - 1, 123456789], dtype=torch.int32)),
        ("i16", torch.tensor([-32768, 32767, -1], dtype=torch.int16)),
        ("i8", torch.tensor([-128, 127, 0, -3], dtype=torch.int8)),
        ("u8", torch.tensor([0, 255, 17], dtype=torch.uint8)),
        ("bool", torch.tensor([True, False, True, True])),
        ("f32_2d", torch.randn(3, 5)),
        ("scalar", torch.tensor(2.75)),
        ("empty", torch.zeros(0, 3)),
    ])


dtypes_path = save_valid("dtypes", dtype_tensors())

base = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
h = torch.randn(4, 6).to(torch.float16)
views = collections.OrderedDict([
    ("base", base),
    ("transposed", base.transpose(0, 2)),          # non-contiguous, same storage
    ("sliced", base[1:, 1:3, ::2]),                # offset 25, strides (20, 5, 2)
    ("row", base[2, 3]),                           # offset 55
    ("expanded", torch.arange(3.0).reshape(3, 1).expand(3, 4)),  # stride 0
    ("half_t", h.t()),
    ("half_tail", h[2:]),
    ("long_step", torch.arange(20, dtype=torch.int64)[3::4]),
    ("empty_slice", base[3:]),                     # numel 0, offset 60 (== storage numel)
])
views_path = save_valid("views", views)

lin = torch.nn.Linear(3, 2)
model_sd = lin.state_dict()
nested = {
    "model": model_sd,
    "param": torch.nn.Parameter(torch.randn(2, 2)),
    "frozen": torch.nn.Parameter(torch.ones(3), requires_grad=False),
    "step": 3, "lr": 0.125, "name": "run-1", "flag": True, "nothing": None, "neg": -5,
    "big": 2**70, "dt": torch.float16, "sz": torch.Size([2, 3]),
    "hist": [torch.tensor([1, 2, 3], dtype=torch.int32), (torch.ones(2, dtype=torch.bool), 5)],
    7: torch.tensor([7.0]),
}
nested_path = save_valid("nested", nested)

# resnet18's state dict (torchvision's names, shapes and order: 122 tensors, 44.6 MiB) from
# plain torch.nn layers, so the fixtures need no torchvision. One training-mode forward gives
# the batch norms' running statistics and counters values other than their initial 0 and 1.
class BasicBlock(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.relu = torch.nn.ReLU(inplace=True)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                                  torch.nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet18(torch.nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(64)
        self.relu = torch.nn.ReLU(inplace=True)
        self.maxpool = torch.nn.MaxPool2d(3, 2, 1)
        widths = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
        for i, (cin, cout, stride) in enumerate(widths, 1):
            setattr(self, "layer%d" % i, torch.nn.Sequential(BasicBlock(cin, cout, stride),
                                                             BasicBlock(cout, cout, 1)))
        self.avgpool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


rn = ResNet18()
with torch.no_grad():
    rn.train()(torch.randn(2, 3, 64, 64))
rn_sd = rn.state_dict()
assert len(rn_sd) == 122 and sum(v.numel() * v.element_size() for v in rn_sd.values()) == 46796608
torch.save(rn_sd, os.path.join(OUT, "resnet18.pt"))
spot = ["conv1.weight", "layer3.1.bn2.running_var", "fc.weight", "fc.bias", "bn1.num_batches_tracked"]
write_expected("resnet18_spot", collections.OrderedDict((k, rn_sd[k]) for k in spot))
with open(os.path.join(OUT, "resnet18_all.json"), "w") as f:
    json.dump({"tensors": [{"name": k, "dtype": str(v.dtype).replace("torch.", ""),
                            "sizes": list(v.shape), "sum": float(v.double().sum())}
                           for k, v in rn_sd.items()]}, f)

# A training checkpoint as torch 2.x writes it: a model's state dict, Adam's (a 0-d float32
# tensor `step` per parameter, exp_avg, exp_avg_sq; param_groups of floats, a tuple, bools, None
# and the parameters' indices), SGD-with-momentum's, and plain values. The archive's records
# besides data/ (.format_version, .storage_alignment, byteorder, .data/serialization_id in 2.x)
# are listed for the test.
torch.manual_seed(1)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                          torch.nn.Linear(36, 2))
adam = torch.optim.Adam(net.parameters(), lr=0.01)
sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
for opt in (adam, sgd):
    opt.zero_grad()
    net(torch.randn(2, 3, 5, 5)).square().sum().backward()
    opt.step()
checkpoint_path = save_valid("checkpoint", {"model": net.state_dict(), "adam": adam.state_dict(),
                                            "sgd": sgd.state_dict(), "epoch": 3})
with zipfile.ZipFile(checkpoint_path) as z:
    records = sorted(n.split("/", 1)[1] for n in z.namelist() if "/data/" not in n)
with open(os.path.join(OUT, "checkpoint_records.json"), "w") as f:
    json.dump({"torch": torch.__version__, "records": records}, f)

# A 1000-parameter model (500 Linear(4, 4) layers: 1000 tensors, 40 KB of weights): what it
# takes to unpickle must fit the loader's default memory budget many times over. Names and
# order are all the test needs, so no expected values are written.
wide = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(500)])
assert len(wide.state_dict()) == 1000
torch.save(wide.state_dict(), os.path.join(OUT, "wide1000.pt"))

# torch 2.x can skip checksums: after torch.serialization.set_crc32_options(False) every CRC-32
# field of the archive is 0. The loader refuses that (saying why) unless
# LoadOptions::allow_zero_crc, and then loads it unverified.
crc32_before = torch.serialization.get_crc32_options()
torch.serialization.set_crc32_options(False)
try:
    zero_crc_path = save_valid("zero_crc", views, _use_new_zipfile_serialization=True)
finally:
    torch.serialization.set_crc32_options(crc32_before)
with zipfile.ZipFile(zero_crc_path) as z:
    assert all(i.CRC == 0 for i in z.infolist()) and len(z.infolist()) > 3
torch.load(zero_crc_path)  # torch itself reads it

# Storages aligned to 4096 bytes instead of 64 (torch.utils.serialization.config, torch >= 2.5).
try:
    from torch.utils.serialization import config as serialization_config
except ImportError:
    serialization_config = None
if serialization_config is not None and hasattr(serialization_config.save, "storage_alignment"):
    serialization_config.save.storage_alignment = 4096
    try:
        save_valid("aligned4096", views)
    finally:
        serialization_config.save.storage_alignment = 64

# Big-endian: the same tensors with every storage byte-swapped and a byteorder record "big".
def itemsizes(path):
    import pickletools
    with zipfile.ZipFile(path) as z:
        pkl = z.read([n for n in z.namelist() if n.endswith("data.pkl")][0])
    sizes, last_cls = {}, None
    width = {"FloatStorage": 4, "DoubleStorage": 8, "HalfStorage": 2, "BFloat16Storage": 2,
             "LongStorage": 8, "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1,
             "ByteStorage": 1, "BoolStorage": 1}
    memo, stack = {}, []
    # The storage key follows its class in every persistent id: track the last class seen.
    for op, arg, _ in pickletools.genops(pkl):
        if op.name == "GLOBAL" and arg.startswith("torch ") and arg.endswith("Storage"):
            last_cls = arg.split()[1]
            stack.append(("cls", last_cls))
        elif op.name in ("BINPUT", "LONG_BINPUT") and stack:
            memo[arg] = stack[-1]
        elif op.name in ("BINGET", "LONG_BINGET"):
            stack.append(memo.get(arg, ("?", None)))
        elif op.name == "BINUNICODE":
            if stack and stack[-1][0] == "cls":
                sizes[arg] = width[stack[-1][1]]
            stack.append(("str", arg))
        else:
            stack.append(("?", None))
    return sizes

for src, name in ((dtypes_path, "dtypes"), (views_path, "views")):
    rewrite(src, os.path.join(OUT, name + "_big.pt"), byteorder="big", swap=itemsizes(src))
rewrite(dtypes_path, os.path.join(OUT, "dtypes_deflate.pt"), method=8)
rewrite(views_path, os.path.join(OUT, "views_zip64.pt"), zip64=True, byteorder="little")
for p in ("dtypes_deflate", "views_zip64"):  # torch itself must read our rewrites
    torch.load(os.path.join(OUT, p + ".pt"))


# ---------------------------------------------------------------- hand-made pickles
def uni(s):
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def glob(m, n):
    return b"c" + m.encode() + b"\n" + n.encode() + b"\n"


def integer(n):
    if 0 <= n < 256:
        return b"K" + bytes([n])
    if -(2**31) <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    return b"\x8a\x08" + struct.pack("<q", n)


def tup(xs):
    return b"(" + b"".join(integer(x) for x in xs) + b"t"


def persid(key="0", cls="FloatStorage", numel=4, tag="storage", extra=b""):
    return b"(" + uni(tag) + glob("torch", cls) + uni(key) + uni("cpu") + integer(numel) + extra + b"tQ"


def tensor(pid=None, offset=0, size=(4,), stride=(1,), hooks=b")R"):
    return (glob("torch._utils", "_rebuild_tensor_v2") + b"(" + (pid or persid()) + integer(offset) +
            tup(size) + tup(stride) + b"\x89" + glob("collections", "OrderedDict") + hooks + b"tR")


def dict_of(*pairs):
    return b"}(" + b"".join(uni(k) + v for k, v in pairs) + b"u"


def pt(pickle_body, storages=None, proto=True, extra_entries=()):
    storages = {"0": struct.pack("<4f", 1, 2, 3, 4)} if storages is None else storages
    pkl = (b"\x80\x02" if proto else b"") + pickle_body + b"."
    entries = [("a/data.pkl", pkl, 0, 0)]
    entries += [("a/data/" + k, v, 0, 0) for k, v in storages.items()]
    entries += [("a/version", b"3\n", 0, 0)] + list(extra_entries)
    return zip_bytes(entries)


def bad(name, data):
    with open(os.path.join(BAD, name + ".pt"), "wb") as f:
        f.write(data)


# The well-formed version of what the bad files break: torch must load it, and so must we.
ok = pt(dict_of(("w", tensor())))
with open(os.path.join(OUT, "handmade.pt"), "wb") as f:
    f.write(ok)
assert torch.equal(torch.load(os.path.join(OUT, "handmade.pt"))["w"], torch.tensor([1.0, 2, 3, 4]))
write_expected("handmade", {"w": torch.tensor([1.0, 2, 3, 4])})

# 1. GLOBAL not on the allowlist
bad("global_os_system", pt(glob("os", "system") + b"(" + uni("echo pwned") + b"tR"))
bad("global_near_miss", pt(glob("torch._utils", "_rebuild_tensor") + b")R"))
# 2. REDUCE / NEWOBJ / BUILD on what is not an allowed callable
bad("reduce_storage_class", pt(glob("torch", "FloatStorage") + b")R"))
bad("newobj_rebuild", pt(glob("torch._utils", "_rebuild_tensor_v2") + b")\x81"))
bad("build_on_list", pt(b"]}b"))
bad("tensor_hooks", pt(dict_of(("w", tensor(hooks=b")R(" + uni("h") + b"K\x01u")))))
# 3. SETITEM on a non-dict, APPEND on a non-list
bad("setitem_on_list", pt(b"]K\x01K\x02s"))
bad("append_on_dict", pt(b"}K\x01a"))
# 4. persistent ids that are not ('storage', torch.<T>Storage, key, location, numel)
bad("persid_short", pt(dict_of(("w", tensor(pid=b"(" + uni("storage") + glob("torch", "FloatStorage") +
                                             uni("0") + uni("cpu") + b"tQ")))))
bad("persid_tag", pt(dict_of(("w", tensor(pid=persid(tag="evil"))))))
bad("persid_key", pt(dict_of(("w", tensor(pid=persid(key="../0"))))))
bad("persid_missing", pt(dict_of(("w", tensor(pid=persid(key="9"))))))
bad("persid_not_tuple", pt(uni("storage") + b"Q"))
# 5. sizes: numel * itemsize != record, views outside the storage, overflow
bad("numel_vs_record", pt(dict_of(("w", tensor(pid=persid(numel=100))))))
bad("view_outside", pt(dict_of(("w", tensor(size=(20,))))))
bad("view_offset_outside", pt(dict_of(("w", tensor(offset=3, size=(2,))))))
bad("stride_overflow", pt(dict_of(("w", tensor(size=(3, 3), stride=(2**62, 2**62))))))
bad("negative_stride", pt(dict_of(("w", tensor(size=(2,), stride=(-1,))))))
bad("storage_type_clash", pt(b"(" + tensor() + tensor(pid=persid(cls="IntStorage")) + b"t"))
# 6. TorchScript
torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), os.path.join(BAD, "torchscript.pt"))
# 7. opcodes outside the set
bad("opcode_stack_global", pt(uni("os") + uni("system") + b"\x93"))
bad("opcode_inst", pt(b"(ios\nsystem\n"))
bad("opcode_obj", pt(b"(" + glob("collections", "OrderedDict") + b"o"))
bad("opcode_ext1", pt(b"\x82\x01"))
torch.save({"w": torch.ones(2)}, os.path.join(BAD, "protocol4.pt"), pickle_protocol=4)
# 8. memo, stack, MARK, lengths
bad("memo_out_of_range", pt(b"h\x07"))
bad("stack_underflow", pt(b"K\x01\x86"))
bad("mark_open_at_stop", pt(b"(K\x01"))
bad("tuple_without_mark", pt(b"K\x01t"))
bad("length_past_end", zip_bytes([("a/data.pkl", b"\x80\x02X\xe8\x03\x00\x00abc", 0, 0)]))
bad("cycle", pt(b"]q\x00h\x00a"))
# A 60-level DAG: each level is a tuple holding the previous level twice (2^60 paths to a tensor).
bad("dag_bomb", pt(b"]" + tensor() + b"q\x00a" + b"h\x00h\x00\x86q\x00a" * 60))
# One dict with a 60 KB key, listed 2000 times (2 bytes each): the key's text is made at each
# visit, 120 MB of it from a 64 KB pickle.
bad("key_repr_bomb", pt(b"](}" + uni("k" * 60000) + b"Nsq\x00" + b"h\x00" * 2000 + b"e"))
# One 60 KB key set 20000 times, 4 bytes each: 1.2 GB of key text.
bad("setitem_bomb", pt(b"}" + uni("k" * 60000) + b"q\x00Ns" + b"h\x00Ns" * 20000))
# 2^27 elements, each the storage's first: 512 MB from a few bytes.
bad("expanded_view", pt(tensor(size=(1 << 27,), stride=(0,))))
with open(dtypes_path, "rb") as f:
    whole = f.read()
bad("truncated", whole[: len(whole) // 2])
# 9. zip structure
def stored(name, data, flags=0):
    return (name, data, 0, flags)
bad("zip_traversal", zip_bytes([stored("a/data.pkl", b"\x80\x02N."), stored("a/../../etc/passwd", b"x")]))
bad("zip_absolute", zip_bytes([stored("/etc/passwd", b"x"), stored("a/data.pkl", b"\x80\x02N.")]))
bad("zip_duplicate", zip_bytes([stored("a/data.pkl", b"\x80\x02N."), stored("a/data.pkl", b"\x80\x02N.")]))
bad("zip_encrypted", zip_bytes([stored("a/data.pkl", b"\x80\x02N.", flags=1)]))

def overlapping():
    inner = zip_bytes([stored("a/data/0", b"\0" * 16)], align=0)
    inner_local = inner[: 30 + len("a/data/0") + 16]
    outer_data = b"\x80\x02N." + inner_local       # data.pkl's bytes contain a whole entry
    z = bytearray(zip_bytes([stored("a/data.pkl", outer_data)], align=0))
    # Add a second central record pointing inside the first entry's data.
    cd_off = struct.unpack("<I", z[-6:-2])[0]
    eocd = len(z) - 22
    cd = bytes(z[cd_off:eocd])
    inner_off = 30 + len("a/data.pkl") + 4
    nb = b"a/data/0"
    rec = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, 0x21,
                      zlib.crc32(b"\0" * 16), 16, 16, len(nb), 0, 0, 0, 0, 0, inner_off) + nb
    return bytes(z[:cd_off]) + cd + rec + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 2, 2,
                                                      len(cd) + len(rec), cd_off, 0)
bad("zip_overlap", overlapping())

def outside():
    z = bytearray(zip_bytes([stored("a/data.pkl", b"\x80\x02N.")], align=0))
    cd_off = struct.unpack("<I", z[-6:-2])[0]
    struct.pack_into("<I", z, cd_off + 42, 10**6)  # local header offset past the end
    return bytes(z)
bad("zip_outside", outside())

def crc_mismatch():
    z = bytearray(ok)
    i = z.index(struct.pack("<4f", 1, 2, 3, 4))
    z[i] ^= 1
    return bytes(z)
bad("zip_crc", crc_mismatch())

def bomb():
    z = bytearray(zip_bytes([("a/data.pkl", b"\x80\x02N.", 8, 0)], align=0))
    cd_off = struct.unpack("<I", z[-6:-2])[0]
    struct.pack_into("<I", z, cd_off + 24, 0xFFFFFFF0)  # claims ~4 GiB from a few bytes
    return bytes(z)
bad("zip_bomb", bomb())
# 10. byteorder other than little/big
bad("byteorder_middle", pt(dict_of(("w", tensor())), extra_entries=[("a/byteorder", b"middle", 0, 0)]))
# 11. legacy non-zip stream
torch.save({"w": torch.ones(2)}, os.path.join(BAD, "legacy.pt"), _use_new_zipfile_serialization=False)

print("make_fixtures: wrote %d valid and %d malicious files to %s" % (
    len([n for n in os.listdir(OUT) if n.endswith(".pt")]), len(os.listdir(BAD)), OUT))
