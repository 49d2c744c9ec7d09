"""`crucible pt` on decompression and memory bombs: refused with the limit in the message.

Each decompression bomb is a 1 MB archive made here (never committed) whose record inflates to
1 GiB of zeros; each memory bomb a 16 MiB stored data.pkl of one-byte opcodes (4 to 9 GB of RSS
for an unpickler without a memory budget). An archive without checksums (every CRC-32 0) is
refused saying so, and loads with --allow-zero-crc.
Where the build has no sanitizer the tool runs under `ulimit -v 524288` (512 MiB of address
space): it must exit 1 with the refusal, not abort on std::bad_alloc. ASan reserves terabytes
of address space and cannot start under such a limit, so sanitizer builds run without it; both
check the child's peak RSS (os.wait4). CTest sets CRUCIBLE_CLI and CRUCIBLE_SANITIZER.
"""
import os
import struct
import subprocess
import zlib

import pytest

CLI = os.environ.get("CRUCIBLE_CLI", "")
SANITIZED = os.environ.get("CRUCIBLE_SANITIZER", "none") not in ("", "none")
if not os.path.isfile(CLI):
    raise RuntimeError("run through CTest (ctest -R ptload_cli_limits), which sets CRUCIBLE_CLI "
                       "to the crucible binary; got CRUCIBLE_CLI=%r" % CLI)

GIB = 1 << 30
ULIMIT_KIB = 524288
MIB = 1 << 20


def _baseline_rss():
    """Peak RSS of the binary doing nothing (`crucible --help`): its own libraries (LLVM, for
    `plan`'s CPU backend, is most of it). The limits below are what a command may add to it."""
    p = subprocess.Popen([CLI, "--help"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _, usage = os.wait4(p.pid, 0)
    return usage.ru_maxrss * 1024


BASELINE_RSS = _baseline_rss()
# A refusal reads the zip directory and nothing it inflates: a few MB (plain), ASan's own
# shadow and allocator add tens of MB.
PEAK_RSS_LIMIT = BASELINE_RSS + ((224 if SANITIZED else 32) << 20)


def deflated_zeros(n):
    """Raw deflate of n zero bytes, 1 MiB at a time, and their CRC-32."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk, parts, crc = bytes(1 << 20), [], 0
    for _ in range(n // len(chunk)):
        parts.append(c.compress(chunk))
        crc = zlib.crc32(chunk, crc)
    parts.append(c.flush())
    return b"".join(parts), crc & 0xFFFFFFFF


def zip_bytes(entries):
    """entries: (name, payload, method, crc, uncompressed size); no alignment, no ZIP64."""
    out, central = bytearray(), bytearray()
    for name, payload, method, crc, size in entries:
        nb = name.encode()
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0x21, crc,
                               len(payload), size, len(nb), 0, 0, 0, 0, 0, len(out)) + nb
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, crc, len(payload),
                           size, len(nb), 0) + nb + payload
    cd_off = len(out)
    n = len(entries)
    return bytes(out + central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n, n, len(central),
                                             cd_off, 0))


def stored(name, data):
    return (name, data, 0, zlib.crc32(data) & 0xFFFFFFFF, len(data))


def zeros(name, n):
    payload, crc = deflated_zeros(n)
    return (name, payload, 8, crc, n)


def uni(s):
    return b"X" + struct.pack("<I", len(s)) + s.encode()


def glob(module, name):
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def float_tensor_pickle(numel):
    """{'w': float32 tensor over storage '0' of numel elements}, as torch.save writes it."""
    i4 = lambda v: b"J" + struct.pack("<i", v)
    return (b"\x80\x02}(" + uni("w") + glob("torch._utils", "_rebuild_tensor_v2") + b"((" +
            uni("storage") + glob("torch", "FloatStorage") + uni("0") + uni("cpu") + i4(numel) +
            b"tQ" + i4(0) + i4(numel) + b"\x85" + i4(1) + b"\x85\x89" +
            glob("collections", "OrderedDict") + b")RtRu.")


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    d = tmp_path_factory.mktemp("bombs")
    files = {
        # data.pkl inflates to 1 GiB of zeros: over the 64 MiB pickle limit.
        "pickle": [zeros("a/data.pkl", GIB), stored("a/version", b"3\n")],
        # A well-formed pickle whose storage record inflates 1 GiB from 1 MB: over 100:1.
        "storage": [stored("a/data.pkl", float_tensor_pickle(GIB // 4)), zeros("a/data/0", GIB),
                    stored("a/version", b"3\n")],
        # 2 MiB of zeros (about 1000:1): refused by default, loads with the ratio raised.
        "zeros": [stored("a/data.pkl", float_tensor_pickle(1 << 19)), zeros("a/data/0", 2 << 20),
                  stored("a/version", b"3\n")],
    }
    paths = {}
    for name, entries in files.items():
        paths[name] = d / (name + ".pt")
        paths[name].write_bytes(zip_bytes(entries))
    assert paths["pickle"].stat().st_size < 1100000
    return paths


def run(*args, ulimit=not SANITIZED):
    """Runs the CLI (under ulimit -v when asked); returns (rc, stdout, stderr, peak RSS bytes)."""
    cmd = [CLI, *map(str, args)]
    if ulimit:
        cmd = ["bash", "-c", 'ulimit -v %d && exec "$@"' % ULIMIT_KIB, "bash", *cmd]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.stdout.read(), p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, out, err, usage.ru_maxrss * 1024


def assert_clean_refusal(rc, out, err, rss, phrases, cls="decompression-bomb",
                         rss_limit=PEAK_RSS_LIMIT):
    assert rc == 1, "exit %d, stdout %r, stderr %r" % (rc, out, err)
    assert "terminate called" not in err and "bad_alloc" not in err and "Sanitizer" not in err
    first = out.splitlines()[0]
    assert first.startswith("REFUSED: ")
    for phrase in phrases:
        assert phrase in first, first
    assert "What this means [%s: " % cls in out
    assert rss < rss_limit, "peak RSS %d MiB" % (rss >> 20)


@pytest.mark.parametrize("command", ["check", "ls"])
def test_a_pickle_bomb_is_refused_before_it_is_inflated(bombs, command):
    rc, out, err, rss = run("pt", command, bombs["pickle"])
    if command == "ls":  # ls puts the refusal on stderr
        out, err = err, ""
    assert_clean_refusal(rc, out, err, rss, [
        "pt zip: entry 'a/data.pkl' is 1073741824 bytes uncompressed, over the limit of "
        "67108864 bytes (from ",
        "raise LoadOptions::max_pickle_bytes (crucible pt: --max-pickle-bytes N)"])


def test_a_storage_bomb_is_refused_by_its_compression_ratio(bombs):
    rc, out, err, rss = run("pt", "check", bombs["storage"])
    assert_clean_refusal(rc, out, err, rss, [
        "pt zip: entry 'a/data/0' inflates ", " bytes to 1073741824 (",
        ":1), over the limit of 100:1 on the compression ratio",
        "raise LoadOptions::max_inflate_ratio (crucible pt: --max-inflate-ratio N)"])


def test_the_pickle_limit_gives_way_to_the_ratio_limit(bombs):
    rc, out, err, rss = run("pt", "check", "--max-pickle-bytes", 4 * GIB, bombs["pickle"])
    assert_clean_refusal(rc, out, err, rss, ["over the limit of 100:1"])


def test_raising_the_ratio_loads_a_zero_filled_storage(bombs):
    rc, out, err, _ = run("pt", "check", bombs["zeros"])
    assert rc == 1 and "over the limit of 100:1" in out
    rc, out, err, _ = run("pt", "check", "--max-inflate-ratio", 5000, bombs["zeros"])
    assert rc == 0, out + err
    assert out.startswith("OK ") and "1 tensors, 524,288 elements, 2.0 MiB" in out


@pytest.mark.skipif(SANITIZED, reason="ASan cannot run under ulimit -v, and aborts on a failed "
                                      "allocation instead of throwing std::bad_alloc")
def test_running_out_of_memory_is_an_error_not_an_abort(bombs):
    # With both limits raised the 1 GiB pickle is inflated, and 512 MiB cannot hold it.
    rc, out, err, _ = run("pt", "check", "--max-pickle-bytes", 4 * GIB, "--max-inflate-ratio",
                          5000, bombs["pickle"], ulimit=True)
    assert rc == 3, "exit %d, stdout %r, stderr %r" % (rc, out, err)
    assert err.startswith("crucible: out of memory (std::bad_alloc)") and "ulimit -v" in err
    assert "terminate called" not in err


# ---------------------------------------------------------------- memory bombs
# 16 MiB of pickle: the file's pages, data.pkl's copy, and what the budget lets the VM hold
# (plain build: 200 MiB measured at the default 256 MiB budget, 48 MiB at 16 MiB). ASan keeps
# the buffers a growing vector frees in its quarantine (up to 256 MiB): 438 MiB measured.
MEMORY_RSS_LIMIT = {"default": BASELINE_RSS + (528 if SANITIZED else 224) * MIB,
                    "16 MiB": BASELINE_RSS + (144 if SANITIZED else 48) * MIB}


def write_repeated_pickle(path, head, op, n, tail):
    """A torch.save-shaped archive whose stored data.pkl is head + op * n + tail, written 1 MiB at
    a time: this process never holds the pickle (a child forked from a large parent would start
    with the parent's RSS, and os.wait4 would report it)."""
    chunk = op * (1 << 20)
    crc, left = zlib.crc32(head), n
    while left:
        crc = zlib.crc32(chunk[:min(left, len(chunk))], crc)
        left -= min(left, len(chunk))
    crc = zlib.crc32(tail, crc) & 0xFFFFFFFF
    size = len(head) + n + len(tail)
    entries = [(b"a/data.pkl", crc, size), (b"a/version", zlib.crc32(b"3\n") & 0xFFFFFFFF, 2)]
    with open(path, "wb") as f:
        central, offsets = bytearray(), []
        for name, c, sz in entries:
            offsets.append(f.tell())
            f.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0x21, c, sz, sz,
                                len(name), 0) + name)
            if name == b"a/version":
                f.write(b"3\n")
                continue
            f.write(head)
            left = n
            while left:
                f.write(chunk[:min(left, len(chunk))])
                left -= min(left, len(chunk))
            f.write(tail)
        cd_off = f.tell()
        for (name, c, sz), off in zip(entries, offsets):
            central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, 0x21, c, sz,
                                   sz, len(name), 0, 0, 0, 0, 0, off) + name
        f.write(central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 2, 2, len(central), cd_off,
                                      0))


@pytest.fixture(scope="module")
def memory_bombs(tmp_path_factory):
    d = tmp_path_factory.mktemp("memory_bombs")
    n = 16 * MIB - 6
    paths = {"lists": d / "lists.pt", "nones": d / "nones.pt"}
    # A list of 16 Mi empty lists: a valid pickle (9 GB of RSS to load without the budget).
    write_repeated_pickle(paths["lists"], b"\x80\x02](", b"]", n, b"e.")
    # 16 Mi NONEs left on the stack: corrupt at STOP (4.3 GB of RSS to find without the budget).
    write_repeated_pickle(paths["nones"], b"\x80\x02", b"N", n, b".")
    return paths


def test_a_pickle_of_empty_lists_is_refused_at_the_default_memory_budget(memory_bombs):
    rc, out, err, rss = run("pt", "check", memory_bombs["lists"])
    assert_clean_refusal(rc, out, err, rss, [
        "pt pickle: unpickling memory would reach ", " bytes, over the limit of 268435456 bytes (",
        " objects, ", "raise LoadOptions::max_pickle_memory (crucible pt: --max-pickle-memory N)"],
        cls="memory-bomb", rss_limit=MEMORY_RSS_LIMIT["default"])


def test_nones_stay_within_the_memory_budget(memory_bombs):
    # 16 Mi stack slots of 4 bytes fit the default budget: refused at STOP, as corrupt.
    rc, out, err, rss = run("pt", "check", memory_bombs["nones"])
    assert_clean_refusal(rc, out, err, rss, ["STOP with 16777210 objects on the stack"],
                         cls="pickle-corrupt", rss_limit=MEMORY_RSS_LIMIT["default"])
    # A smaller budget refuses them as they are pushed.
    rc, out, err, rss = run("pt", "check", "--max-pickle-memory", 16 * MIB, memory_bombs["nones"])
    assert_clean_refusal(rc, out, err, rss, [
        "over the limit of 16777216 bytes (", " on the stack, ", "--max-pickle-memory N"],
        cls="memory-bomb", rss_limit=MEMORY_RSS_LIMIT["16 MiB"])


# ---------------------------------------------------------------- archives without checksums
def test_an_archive_without_checksums_is_refused_saying_so_and_loads_when_allowed(tmp_path):
    pkl = float_tensor_pickle(4)
    data = struct.pack("<4f", 1, 2, 3, 4)
    path = tmp_path / "zero_crc.pt"
    path.write_bytes(zip_bytes([("a/data.pkl", pkl, 0, 0, len(pkl)), ("a/data/0", data, 0, 0, 16),
                                ("a/version", b"3\n", 0, 0, 2)]))
    rc, out, err, _ = run("pt", "check", path)
    assert rc == 1, out + err
    first = out.splitlines()[0]
    assert "cannot be verified: every CRC-32 field of this archive is 0" in first
    assert ("load it unverified with LoadOptions::allow_zero_crc (crucible pt: --allow-zero-crc)"
            in first)
    assert "What this means [no-checksums: " in out and "fails its checksum" not in out
    rc, out, err, _ = run("pt", "check", "--allow-zero-crc", path)
    assert rc == 0, out + err
    assert out.startswith("OK ") and "NOT verified: every CRC-32 field of the archive is 0" in out
    rc, out, err, _ = run("pt", "ls", "--allow-zero-crc", path)
    assert rc == 0 and "1 tensors, 4 elements" in out


@pytest.mark.parametrize("args,message", [
    (["--max-pickle-bytes"], "--max-pickle-bytes needs a count"),
    (["--max-pickle-bytes", "0", "x.pt"], "--max-pickle-bytes takes a positive integer, not '0'"),
    (["--max-inflate-ratio", "1e3", "x.pt"],
     "--max-inflate-ratio takes a positive integer, not '1e3'"),
    (["--max-pickle-memory", "-1", "x.pt"],
     "--max-pickle-memory takes a positive integer, not '-1'"),
])
@pytest.mark.parametrize("command", ["check", "ls"])
def test_limit_options_are_checked(command, args, message):
    rc, out, err, _ = run("pt", command, *args, ulimit=False)
    assert rc == 2 and out == "" and message in err
