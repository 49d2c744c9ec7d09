"""The PyTorch Vessel against eager PyTorch: what it records, at which level, with no loss."""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import crucible_native as crucible
import models

ITERS = 3

# Three tests that each start fresh Python processes importing torch (about 10 s of test time in
# release, four to five times that under a sanitizer) to check a benchmark's install (the key
# floor) and two refusals (an ablation switch, a sanitizer build): no recording thread and no
# replay runs there. Under ASan and TSan they are left to verify, which runs them.
left_to_verify = pytest.mark.skipif(
    models.SANITIZER in ("asan-ubsan", "tsan"),
    reason="a benchmark's install and two refusals in fresh processes: the verify preset runs them")


def record_iterations(s, iters=ITERS):
    """Records `iters` steps; returns the trace and the op count of each iteration."""
    counts = models.record(s, iters)
    return crucible.trace(), counts


class Reference(TorchDispatchMode):
    """Independent reference: PyTorch's own Python dispatch mode, below Autograd."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        s = func._schema
        name = s.name + ("." + s.overload_name if s.overload_name else "")
        outs = [(tuple(o.shape), str(o.dtype).replace("torch.", ""))
                for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        self.ops.append((name, outs))
        return out


def _functional(name):
    base, _, overload = name.partition(".")
    return (base[:-1] if base.endswith("_") else base) + ("." + overload if overload else "")


def comparable(seq):
    # detach: autograd bookkeeping that differs between the two levels; to*: no-op composites
    # that return their input (no kernel runs, so the Python mode never sees them). In-place
    # names are compared as functional ones: under a Python mode, aten::linear takes its
    # "tensor subclass" path and uses add where eager uses add_.
    # _reshape_alias as view: reshape takes _reshape_alias unless a Python mode is active,
    # where it takes view (torch 2.x); both return the same view of their input.
    return [(_functional("aten::view" if op[0] == "aten::_reshape_alias" else op[0]), op[1]) for op in seq
            if op[0] != "aten::detach" and not op[0].startswith("aten::to.")
            and not op[0].startswith("profiler::")]


@pytest.mark.parametrize("name", models.large_skipped_under_tsan(models.VESSEL_MODELS))
def test_all_three_phases_and_stable_counts(name):
    s = models.make(name)
    trace, counts = record_iterations(s)
    st = crucible.stats()
    for phase in ("forward", "backward", "optimizer"):
        assert st["ops"][phase] > 0, (phase, st)
    assert st["dropped"] == 0
    assert counts[1] == counts[2], f"iterations after the first must record the same ops: {counts}"
    assert counts[0] >= counts[1] // 2
    assert len(trace) == sum(counts)
    # The optimizer's record_function scopes dispatch profiler ops: they reach the key, are
    # counted as skipped, and none is in the trace.
    assert st["skipped"]["profiler"] > 0, st["skipped"]
    assert not [o["name"] for o in trace.ops() if o["name"].startswith("profiler::")]
    # Per thread: this one recorded every op, phase by phase, and the bytes cover their entries.
    (th,) = [t for t in st["threads"] if t["forward"] + t["backward"] + t["optimizer"] > 0]
    assert [th[p] for p in ("forward", "backward", "optimizer")] == [st["ops"][p] for p in ("forward", "backward", "optimizer")]
    assert th["bytes"] == st["bytes"] >= 64 * st["total"]


@pytest.mark.parametrize("name", models.large_skipped_under_tsan(models.VESSEL_MODELS))
def test_ops_and_output_shapes_match_eager_reference(name):
    s = models.make(name)
    s.step()  # past the first iteration (state creation) for both recorders
    torch.manual_seed(1)
    ref = Reference()
    with ref:
        s.step()
    torch.manual_seed(1)
    crucible.enable()
    s.step()
    crucible.disable()
    got = [(o["name"], [(tuple(t["shape"]), t["dtype"]) for t in o["outputs"]])
           for o in crucible.trace().ops()]
    assert comparable(got) == comparable(ref.ops)


def unexplained_inputs(trace):
    """Inputs neither produced earlier in the trace nor classified as externals."""
    externals = trace.externals
    produced = set()
    unexplained = []
    for i, op in enumerate(trace.ops()):
        for t in op["inputs"]:
            if t["wrapped_number"] or not t["has_storage"]:
                continue
            sid = t["storage_id"]
            if sid not in produced and sid not in externals:
                unexplained.append((i, op["name"], op["phase"], t["shape"]))
        for t in op["outputs"]:
            produced.add(t["storage_id"])
    return unexplained


@pytest.mark.parametrize("name", models.large_skipped_under_tsan(models.VESSEL_MODELS))
def test_every_input_is_produced_or_classified(name):
    s = models.make(name)
    trace, _ = record_iterations(s)
    assert unexplained_inputs(trace) == []
    kinds = set(trace.externals.values())
    assert {"parameter", "input"} <= kinds


@pytest.mark.parametrize("name", models.large_skipped_under_tsan(models.VESSEL_MODELS))
def test_every_input_of_a_warmed_up_step_is_produced_or_classified(name):
    # Recording starts after a step: gradients and optimizer state exist already, so they are
    # read before anything recorded writes them, and only their classification explains them.
    s = models.make(name)
    s.step()
    assert crucible.track_optimizer(s.opt) > 0
    trace, _ = record_iterations(s)
    assert unexplained_inputs(trace) == []
    kinds = set(trace.externals.values())
    assert {"parameter", "input", "gradient", "optimizer_state"} <= kinds, kinds


def test_recorded_level_is_the_decomposed_one():
    s = models.make("mlp")
    crucible.enable()
    s.model(s.x)
    crucible.disable()
    names = [o["name"] for o in crucible.trace().ops()]
    assert names == ["aten::t", "aten::addmm", "aten::relu", "aten::t", "aten::addmm"]
    # linear is one of the composites the key falls through (Note [Composite fallthroughs]);
    # a composite without one (square) goes through the fallback, which counts it decomposed.
    assert crucible._ext.composite_fallthrough_count() > 0
    before = crucible.stats()["skipped"]["decomposed"]
    crucible.clear()
    crucible.enable()
    s.x.square()
    crucible.disable()
    assert [o["name"] for o in crucible.trace().ops()] == ["aten::pow.Tensor_Scalar"]
    assert crucible.stats()["skipped"]["decomposed"] == before + 1


def test_composites_that_return_their_input_record_nothing():
    # Note [Composite fallthroughs]: the key falls through these composites; one that
    # dispatches nothing returns its input (nothing new exists), one that computes is recorded
    # as the ops it decomposes into.
    x, x1 = torch.randn(4, 3), torch.randn(5)
    crucible.enable()
    same = [x.to(x.dtype), torch.nn.functional.dropout(x, training=False), x1.flatten()]
    crucible.disable()
    assert same[0] is x and same[1] is x and same[2] is x1
    assert len(crucible.trace()) == 0
    crucible.enable()
    y = x.to(torch.float64)
    crucible.disable()
    assert [o["name"] for o in crucible.trace().ops()] == ["aten::_to_copy"]
    assert y.dtype == torch.float64


@pytest.mark.parametrize("scheme", ["tags", "table"])
def test_reused_addresses_get_fresh_storage_ids(scheme):
    # Each result dies at the next iteration, and the allocator hands its memory (and malloc its
    # StorageImpl's) to the next one: addresses repeat. Storage ids must not. "tags": memory
    # allocated while recording carries its id (Note [Allocation tags]). "table": tensors made
    # while recording is off are named by the weak-reference table, which drops dead storages
    # once per 256 new ones, after which their StorageImpl addresses are reused.
    x = torch.randn(64)
    addresses = set()
    crucible.enable()
    assert crucible.stats()["storage_ids"] == "allocation tags"
    for _ in range(3000):
        if scheme == "tags":
            y = x + 1
        else:
            crucible.disable()
            y = x + 1
            crucible.enable()
            y.relu_()
        assert crucible._ext.storage_is_tagged(crucible._storage_cdata(y)) == (scheme == "tags")
        addresses.add(crucible._storage_cdata(y))
    crucible.disable()
    del y
    name = "aten::add.Tensor" if scheme == "tags" else "aten::relu_"
    outs = [o["outputs"][0] for o in crucible.trace().ops() if o["name"] == name]
    assert len(outs) == 3000
    assert len({o["storage_id"] for o in outs}) == len(outs)
    # The test does exercise address reuse, except under ASan, whose quarantine keeps freed
    # memory from being handed out again.
    with open(os.path.join(crucible.build_dir(), "lib", "crucible_build.json")) as f:
        if "asan" not in json.load(f).get("sanitizer", "none"):
            assert len(addresses) < 0.9 * len(outs)   # a tenth of the results or more reuse an address


def test_tagged_memory_is_aligned_and_views_share_its_id():
    crucible.enable()
    ts = [torch.empty(n) for n in (0, 1, 3, 15, 16, 17, 1000, 1023, 1024, 4096, 100000)]
    views = [t[1:] for t in ts if t.numel() > 1]
    crucible.disable()
    for t in ts:
        # Empty storages are left to the table; the others carry a header in the data's page.
        assert crucible._ext.storage_is_tagged(crucible._storage_cdata(t)) == (t.numel() > 0)
        assert t.numel() == 0 or (t.data_ptr() % 64 == 0 and t.data_ptr() % 4096 >= 64)
    ids = [crucible.storage_id(t) for t in ts]
    assert len(set(ids)) == len(ids) and 0 not in ids
    for v in views:
        assert crucible.storage_id(v) in ids
    assert crucible.storage_id(views[0]) == crucible.storage_id(ts[2])


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without mkldnn")
def test_raw_allocations_are_freed_by_their_own_allocator():
    # ideep (mkldnn) allocates through the CPU allocator's raw_allocate and frees with
    # raw_deallocate, a pointer only: blocks tagged while recording and freed after, and blocks
    # made before recording and freed during it, must each go back to the allocator that made
    # them (glibc aborts on a wrong pointer).
    x = torch.randn(32, 64)
    before = [x.to_mkldnn() for _ in range(100)]
    crucible.enable()
    during = [x.to_mkldnn() for _ in range(100)]
    dense = [d.to_dense() for d in during[:3]]
    freed = crucible._ext.tagged_raw_frees()
    del before
    assert crucible._ext.tagged_raw_frees() == freed  # untagged: the base allocator's
    crucible.disable()
    del during
    assert crucible._ext.tagged_raw_frees() >= freed + 100  # tagged, freed through their headers
    assert all(torch.equal(d, x) for d in dense)
    # mkldnn convolution keeps raw scratch memory inside its kernel, while recording
    w = torch.randn(8, 3, 3, 3)
    inp = torch.randn(16, 3, 32, 32)
    ref = torch.nn.functional.conv2d(inp, w)
    crucible.enable()
    got = torch.nn.functional.conv2d(inp, w)
    crucible.disable()
    assert torch.allclose(got, ref)


def test_forked_child_counts_only_the_forking_thread():
    # A DataLoader worker is a fork of a process that may be recording on several threads. The
    # child has only the forking thread and none of the recorder's threads: it stops recording
    # (Note [Forked children]), so more than a ring's worth of ops cannot hang it, nothing tags
    # its memory, and what needs the recorder says why it cannot run there instead of waiting.
    other_on, release = threading.Event(), threading.Event()

    def other():
        crucible.enable()
        other_on.set()
        release.wait()
        crucible.disable()

    t = threading.Thread(target=other)
    t.start()
    other_on.wait()
    crucible.enable()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            x = torch.ones(8)
            for _ in range(40000):  # 80k ops: more than one ring of 65536 entries
                x = x * 1.0 + 0.0
            during = torch.ones(8) * 2
            off = not crucible._ext.is_enabled()
            untagged = not crucible._ext.storage_is_tagged(crucible._storage_cdata(during))
            refused = 0
            for call in (crucible.flush, crucible.stats, crucible.enable, crucible.iteration):
                try:
                    call()
                except crucible.CrucibleError as e:
                    refused += "forked process" in str(e)
            code = 0 if off and untagged and refused == 4 else 3
        finally:
            os._exit(code)
    crucible.disable()
    release.set()
    t.join()
    for _ in range(600):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_memory_replaced_by_an_op_is_explained():
    # add(out=c) resizes c: its storage gets new memory, and with it a new id, from that op on.
    crucible.enable()  # installs the allocator wrapper (the first enable in a process does)
    crucible.disable()
    crucible.clear()
    a, b = torch.randn(16), torch.randn(16)
    c = torch.empty(0)
    crucible.enable()
    torch.add(a, b, out=c)
    d = c * 2
    crucible.disable()
    assert crucible._ext.storage_is_tagged(crucible._storage_cdata(c))
    ops = {o["name"]: o for o in crucible.trace().ops()}
    add, mul = ops["aten::add.out"], ops["aten::mul.Tensor"]
    out_arg = [t for t in add["inputs"] if t["has_storage"]][-1]
    assert out_arg["storage_id"] != add["outputs"][0]["storage_id"]
    assert mul["inputs"][0]["storage_id"] == add["outputs"][0]["storage_id"]
    assert torch.equal(d, (a + b) * 2)


class _Wrapper(torch.Tensor):
    """A Python wrapper subclass: its storage is a placeholder whose storage() access throws."""

    @staticmethod
    def __new__(cls, elem):
        r = torch.Tensor._make_wrapper_subclass(cls, elem.size(), strides=elem.stride(), dtype=elem.dtype,
                                                device=elem.device, requires_grad=elem.requires_grad)
        r.elem = elem
        return r

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def unwrap(x):
            return x.elem if isinstance(x, _Wrapper) else x
        out = func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})
        return _Wrapper(out) if isinstance(out, torch.Tensor) else out


def test_wrapper_subclass_tensors_are_recorded_with_one_identity():
    a = _Wrapper(torch.randn(4, 4))
    crucible.enable()
    b = torch.relu(a + a)
    crucible.disable()
    ops = crucible.trace().ops()
    assert [o["name"] for o in ops] == ["aten::add.Tensor", "aten::relu"]
    add, relu = ops
    assert add["inputs"][0]["storage_id"] == add["inputs"][1]["storage_id"] != 0
    assert relu["inputs"][0]["storage_id"] == add["outputs"][0]["storage_id"]
    assert list(relu["outputs"][0]["shape"]) == [4, 4] and isinstance(b, _Wrapper)


def test_module_paths_and_phases_are_attached():
    s = models.make("cnn")
    trace, _ = record_iterations(s, iters=1)
    ops = trace.ops()
    convs = [o for o in ops if o["name"].startswith("aten::convolution") or o["name"].startswith("aten::_convolution")
             or o["name"].startswith("aten::mkldnn_convolution") or o["name"] == "aten::conv2d"]
    assert convs and {o["module"] for o in convs if o["phase"] == "forward"} == {"conv1", "conv2"}
    bn = [o for o in ops if "batch_norm" in o["name"] and o["phase"] == "forward"]
    assert bn and all(o["module"] == "bn1" for o in bn)
    assert [o["phase"] for o in ops].count("optimizer") > 0
    mutable = [o for o in ops if o["mutable"]]
    assert any(o["name"].endswith("_") or ".out" in o["name"] or "add_" in o["name"] for o in mutable)


def test_module_scopes_survive_a_forward_that_raises():
    """A forward that raises skips its modules' post-hooks; the next call drops the scopes it
    left, so later ops are not labelled with a module they did not run in."""
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.inner, self.fail = nn.Linear(4, 4), nn.Linear(4, 4), False

        def forward(self, x):
            x = self.fc(x)
            if self.fail:
                raise RuntimeError("boom")
            return self.inner(x)

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.block, self.head = Block(), nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.block(x))

    m = Outer()
    handle = crucible.track_modules(m)
    assert crucible.track_modules(m) is handle, "tracking twice gives the same hooks, not a second set"
    x = torch.randn(2, 4)
    m.block.fail = True
    with pytest.raises(RuntimeError, match="boom"):
        with crucible.recording():
            m(x)
    m.block.fail = False
    with crucible.recording():
        y = m(x)
        (y * 3).sum()  # outside every module
    ops = crucible.trace().ops()
    after = ops[[o["module"] for o in ops].index("block.inner"):]  # the second call's tail
    assert {o["module"] for o in after if o["name"].startswith("aten::addmm")} == {"block.inner", "head"}
    assert ops[-1]["name"].startswith("aten::sum") and ops[-1]["module"] == ""
    assert ops[-2]["name"].startswith("aten::mul") and ops[-2]["module"] == ""
    handle.remove()
    assert crucible.track_modules(m) is not handle, "after remove() the model can be tracked again"


def test_recorded_metadata_equals_the_real_tensors():
    # A strided view (offset and strides of its own), a bfloat16 copy and a sparse result:
    # every recorded field against what PyTorch says of the tensor itself.
    x = torch.randn(6, 8)
    sp = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0]), (2, 2))
    with crucible.recording():
        y = x[1:, ::2]
        z = y.to(torch.bfloat16)
        w = sp * 2
    ops = crucible.trace().ops()
    names = [o["name"] for o in ops]
    assert names == ["aten::slice.Tensor", "aten::slice.Tensor", "aten::_to_copy", "aten::mul.Tensor"], names
    assert all(o["stream"] == 0 for o in ops)   # no accelerator tensor: no stream (test_cuda.py for one)
    for real, rec in ((y, ops[1]["outputs"][0]), (z, ops[2]["outputs"][0])):
        assert rec["shape"] == tuple(real.shape) and rec["stride"] == real.stride()
        assert rec["storage_offset"] == real.storage_offset()
        assert rec["data_ptr"] == real.data_ptr()
        storage = real.untyped_storage() if hasattr(real, "untyped_storage") else real.storage()
        assert rec["storage_nbytes"] == storage.nbytes()
        assert (rec["device"], rec["layout"], rec["has_storage"]) == ("cpu", "strided", True)
        assert rec["dtype"] == str(real.dtype).replace("torch.", "")
    assert ops[1]["outputs"][0]["storage_id"] == ops[0]["inputs"][0]["storage_id"], "a view shares its base's storage"
    assert ops[1]["outputs"][0]["is_view"]
    sparse = ops[3]["outputs"][0]
    assert (sparse["layout"], sparse["has_storage"], sparse["shape"]) == ("sparse_coo", False, tuple(w.shape))


def test_a_module_path_too_deep_for_a_trace_file_is_refused_before_any_hook():
    # 260 nested Sequentials: the innermost Linear's path ("0.0. ... .0") has 260 levels, past
    # the 256 a .crtrace file holds. Refused when tracked, so that export never refuses what was
    # recorded. (Not much deeper: each level is a few Python frames of the forward.)
    import torch.nn as nn
    inner = nn.Linear(2, 2)
    m = inner
    for _ in range(260):
        m = nn.Sequential(m)
    with pytest.raises(crucible.CrucibleError, match="levels deep.*256 levels"):
        crucible.track_modules(m)
    assert not inner._forward_pre_hooks and not m._forward_pre_hooks, "no hook left behind"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4000))   # torch 2.x: three frames per module call
    try:
        with crucible.recording():
            m(torch.randn(1, 2))
    finally:
        sys.setrecursionlimit(limit)
    assert {o["module"] for o in crucible.trace().ops()} == {""}
    crucible.export(os.path.join(tempfile.mkdtemp(), "deep.crtrace"))  # exports as recorded


def test_recording_block_restores_the_mode_and_disable_says_what_it_did():
    crucible.enable()
    with crucible.recording(drop_when_full=True):
        assert crucible._ext.thread_drop_when_full()
        seen = []
        t = threading.Thread(target=lambda: seen.append(crucible._ext.thread_drop_when_full()))
        t.start()
        t.join()
        assert seen == [False], "the mode is this thread's: another thread keeps back-pressure"
    assert not crucible._ext.thread_drop_when_full(), "back-pressure again after the block"
    assert crucible.is_enabled(), "the block leaves an enclosing enable() alone"
    assert crucible.disable() is True
    assert crucible.disable() is False, "nothing to disable on this thread"


def test_tracked_models_are_not_kept_alive_and_recursion_keeps_its_scope():
    import gc
    import weakref
    import torch.nn as nn

    class Rec(nn.Module):  # calls itself: the outer call's scope must survive the inner one
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x, n=1):
            if n:
                x = self(x, n - 1)
            return self.fc(x).relu()

    class Top(nn.Module):
        def __init__(self):
            super().__init__()
            self.rec = Rec()

        def forward(self, x):
            return self.rec(x)

    m = Top()
    crucible.track_modules(m)
    with crucible.recording():
        m(torch.randn(2, 4))
    relus = [o["module"] for o in crucible.trace().ops() if o["name"].startswith("aten::relu")]
    assert relus == ["rec", "rec"], relus
    r = weakref.ref(m)
    del m
    gc.collect()
    assert r() is None, "track_modules must not keep the model (and its parameters) alive"

    # A submodule tracked on its own as well (two sets of hooks on it): neither set reads the
    # other's open calls, and no scope outlives the call.
    class EncHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc, self.head = nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.enc(x)).relu()  # relu: in this module, outside enc and head

    top = EncHead()
    crucible.track_modules(top)
    crucible.track_modules(top.enc)
    crucible.clear()
    with crucible.recording():
        top(torch.randn(2, 4))
    ops = crucible.trace().ops()
    assert [o["module"] for o in ops if o["name"].startswith("aten::relu")] == [""]


def test_bad_arguments_to_the_controller_are_clear_errors():
    with pytest.raises(crucible.CrucibleError, match="crucible.load_trace"):
        crucible.iteration(trace="run.crtrace")
    with pytest.raises(crucible.CrucibleError, match="expected tensors"):
        crucible.mark_inputs(3)
    a, b = torch.randn(2), torch.randn(3)
    assert crucible.mark_inputs([a, b], None) == 2, "lists of tensors are taken apart, None skipped"
    assert crucible.mark_constants(torch.randn(2, 2).to_sparse()) == 0, "a sparse tensor has no storage id"
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    with pytest.warns(crucible.CrucibleWarning, match="after the first training step"):
        assert crucible.track_optimizer(opt) == 0
    m(torch.randn(1, 2)).sum().backward()
    opt.step()
    assert crucible.track_optimizer(opt) == 4, "two gradients and two momentum buffers"


CONFIGURE_SCRIPT = """
import crucible_native as crucible

def refused(match, **kw):
    try:
        crucible.configure(**kw)
    except crucible.CrucibleError as e:
        assert match in str(e), (match, str(e))
        return
    raise AssertionError(f"configure({kw}) was accepted")

refused("ring_entries 1000 is not a power of two", ring_entries=1000)
refused("meta_cells 4294967296 is not a power of two from 2 to 2^31", meta_cells=1 << 32)
refused("per recording thread, over the", ring_entries=1 << 31, meta_cells=1 << 31)
refused("unboxed_kernels must be True or False, got str", unboxed_kernels="no")
refused("memory_budget 18446744073709551616 is over", memory_budget=1 << 64)
refused("plan_alignment 48 is not a power of two", plan_alignment=48)
# Nothing is applied when one value is refused: the rings asked for with a bad budget are not set.
refused("memory_budget", ring_entries=1 << 10, memory_budget=-1)
assert crucible.recorder._ring_sizes == (1 << 16, 1 << 17, 1 << 16), crucible.recorder._ring_sizes
crucible.configure(ring_entries=1 << 12)
assert crucible.recorder._ring_sizes == (1 << 12, 1 << 17, 1 << 16), crucible.recorder._ring_sizes
try:
    crucible.enable(drop_when_full="false")
    raise AssertionError("a string drop_when_full was accepted")
except crucible.CrucibleError as e:
    assert "drop_when_full must be True or False" in str(e), str(e)
crucible.stats()  # makes the recorder
refused("the global recorder already exists", ring_entries=1 << 13)
refused("iteration(), export(), clear() or flush()", scalar_slots=1 << 13)
print("ok")
"""


def test_configure_checks_every_value_before_applying_any():
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(crucible.__file__)), here]))
    r = subprocess.run([sys.executable, "-c", CONFIGURE_SCRIPT], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_iteration_and_export_graph_check_their_arguments(tmp_path):
    s = models.make("mlp")
    models.record(s, 3)
    for kw, match in [({"thread": -2}, "thread -2 is no recording thread's index"),
                      ({"thread": "0"}, "thread must be an int, got str"),
                      ({"thread": True}, "thread must be an int, got bool"),
                      ({"budget": -1}, "budget must not be negative"),
                      ({"budget": 1 << 64}, "budget 18446744073709551616 is over"),
                      ({"alignment": 3}, "alignment 3 is not a power of two"),
                      ({"alignment": 2.0}, "alignment must be an int, got float")]:
        with pytest.raises(crucible.CrucibleError, match=match):
            crucible.iteration(**kw)
    with pytest.raises(crucible.CrucibleError, match="thread -5 is no recording thread's index"):
        crucible.export_graph(str(tmp_path / "g.dot"), thread=-5)
    assert crucible.iteration(thread=0, budget=0, alignment=128)["total_ops"] > 0


def test_file_errors_say_what_is_wrong(tmp_path):
    s = models.make("mlp")
    models.record(s, 3)
    with pytest.raises(crucible.CrucibleError, match="Is a directory"):
        crucible.load_trace(tmp_path)
    with pytest.raises(crucible.CrucibleError, match="NUL character"):
        crucible.load_trace(str(tmp_path / "a\0b"))
    with pytest.raises(crucible.CrucibleError, match="NUL character"):
        crucible.export(str(tmp_path / "a\0b"))
    with pytest.raises(crucible.CrucibleError, match="export_graph: cannot create .*No such file or directory"):
        crucible.export_graph(str(tmp_path / "missing" / "g.dot"))
    # A graph written over an earlier file replaces it whole, and leaves no temporary behind.
    path = tmp_path / "g.dot"
    path.write_text("old")
    n = crucible.export_graph(str(path))
    assert path.read_text().count("[label=") == n and not (tmp_path / "g.dot.tmp").exists()
    t = crucible.trace()
    assert (t == None) is False and (t != 3) is True  # noqa: E711
    assert t == crucible.trace()


def test_no_grad_and_inference_mode():
    s = models.make("mlp")
    with torch.no_grad():
        crucible.enable()
        s.model(s.x)
        crucible.disable()
    ops = crucible.trace().ops()
    assert [o["name"] for o in ops] == ["aten::t", "aten::addmm", "aten::relu", "aten::t", "aten::addmm"]
    assert all(not o["grad_mode"] and o["phase"] == "forward" for o in ops)
    crucible.clear()
    with torch.inference_mode():
        crucible.enable()
        out = s.model(s.x)
        crucible.disable()
    ops = crucible.trace().ops()
    assert [o["name"] for o in ops] == ["aten::t", "aten::addmm", "aten::relu", "aten::t", "aten::addmm"]
    assert all(o["inference_mode"] for o in ops)
    assert ops[-1]["outputs"][0]["inference"] and tuple(ops[-1]["outputs"][0]["shape"]) == tuple(out.shape)


def test_recording_off_records_nothing():
    s = models.make("mlp")
    s.step()
    crucible.flush()
    assert crucible.stats()["total"] == 0
    assert len(crucible.trace()) == 0


def test_two_threads_record_concurrently():
    STEPS = 6
    single = models.make("mlp")
    single.step()
    ref, _ = record_iterations(single, iters=1)
    expect = [o["name"] for o in ref.ops()]
    crucible.clear()
    errors = []
    start, mid = threading.Barrier(2, timeout=60), threading.Barrier(2, timeout=60)
    spans = []  # (first step began, last step ended) per thread

    def worker(seed):
        try:
            s = models.make("mlp", seed=seed)
            s.step()
            start.wait()  # both record at once, not one after the other
            crucible.enable()
            t0 = time.perf_counter()
            for k in range(STEPS):
                s.step()
                if k == 0:
                    mid.wait()  # both are recording now, with steps still to record
            spans.append((t0, time.perf_counter()))
            crucible.disable()
        except Exception as e:  # surfaced below
            start.abort()  # the other thread must not wait for this one
            mid.abort()
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    trace = crucible.trace()
    by_thread = {}
    for o in trace.ops():
        by_thread.setdefault(o["thread"], []).append(o)
    assert len(by_thread) == 2
    for ops in by_thread.values():
        assert [o["seq"] for o in ops] == sorted(o["seq"] for o in ops)
        assert [o["name"] for o in ops] == expect * STEPS
    (a0, a1), (b0, b1) = spans
    assert a0 < b1 and b0 < a1, f"the threads recorded one after the other, not at once: {spans}"


def test_export_load_round_trip_is_lossless(tmp_path):
    s = models.make("transformer")
    live, _ = record_iterations(s, iters=2)
    path = tmp_path / "run.crtrace"
    st = crucible.export(str(path))
    assert st["total"] == len(live)
    back = crucible.load_trace(str(path))
    assert back == live
    assert back.ops() == live.ops()
    assert back.externals == live.externals


def test_corrupted_trace_is_a_clear_error(tmp_path):
    s = models.make("mlp")
    record_iterations(s, iters=1)
    path = tmp_path / "run.crtrace"
    crucible.export(str(path))
    data = path.read_bytes()
    (tmp_path / "cut.crtrace").write_bytes(data[: len(data) // 2])
    with pytest.raises(crucible.CrucibleError, match="corrupt or truncated"):
        crucible.load_trace(str(tmp_path / "cut.crtrace"))
    with pytest.raises(crucible.CrucibleError, match="cannot open"):
        crucible.load_trace(str(tmp_path / "missing.crtrace"))


def test_foreach_tensor_lists_are_recorded_without_cap():
    params = [torch.randn(3) for _ in range(300)]
    others = [torch.randn(3) for _ in range(300)]
    crucible.enable()
    torch._foreach_add_(params, others)
    crucible.disable()
    ops = crucible.trace().ops()
    assert len(ops) == 1 and ops[0]["name"] == "aten::_foreach_add_.List"
    assert len(ops[0]["inputs"]) == 600
    assert [t["list_index"] for t in ops[0]["inputs"][:300]] == list(range(300))
    assert ("tensor_list", 0, 300, 0) in ops[0]["scalars"]


def test_scalars_of_every_kind():
    x = torch.randn(4, 6)
    crucible.enable()
    torch.sum(x, dim=[0, 1], keepdim=True)
    torch.div(x, 2.0, rounding_mode="floor")
    x.clamp(min=None, max=0.5)
    crucible.disable()
    ops = crucible.trace().ops()
    by_name = {o["name"]: o for o in ops}
    s = by_name["aten::sum.dim_IntList"]["scalars"]
    assert ("list", 1, 2, 0) in s and ("int", 1, 0, 0) in s and ("int", 1, 0, 1) in s
    assert ("bool", 2, 0, True) in s and ("none", 3, 0, None) in s
    d = by_name["aten::div.Tensor_mode"]
    assert d["inputs"][1]["wrapped_number"] and d["inputs"][1]["wrapped_value"] == 2.0
    assert any(k == "string" and aux == len("floor") for k, _, aux, _ in d["scalars"])
    c = by_name["aten::clamp"]["scalars"]
    assert ("none", 1, 0, None) in c and ("float", 2, 0, 0.5) in c


DROP_SCRIPT = """
import sys, torch, crucible_native as crucible, models
crucible.configure(ring_entries=4, meta_cells=8, scalar_slots=4)
s = models.make("resnet18")
s.step()
crucible.enable()                     # back-pressure: nothing lost, however small the rings
s.step()
crucible.disable()
full = crucible.stats()
assert full["dropped"] == 0 and full["waits"] > 0, full
crucible.clear()
crucible.enable(drop_when_full=True)  # same step again, counting what does not fit
s.step()
crucible.disable()
st = crucible.stats()
t = crucible.trace()
flagged = sum(1 for o in t.ops() if o["after_drop"])
print(full["total"], st["total"], st["dropped"], len(t), flagged)
crucible.export(sys.argv[1])
for _ in range(3):  # more steps in drop mode: each loses other ops, so no two steps match
    crucible.enable(drop_when_full=True)
    s.step()
    crucible.disable()
try:  # no iteration, and the error says the drops may be why
    crucible.iteration()
    print("published")
except crucible.CrucibleError as e:
    print("dropped-hint" if "ops were dropped while recording" in str(e) else "other: " + str(e))
"""


def test_drop_mode_counts_and_reports_every_dropped_op(tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(crucible.__file__)), here]))
    r = subprocess.run([sys.executable, "-c", DROP_SCRIPT, str(tmp_path / "d.crtrace")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    counts, iteration = r.stdout.splitlines()
    full, recorded, dropped, in_trace, flagged = map(int, counts.split())
    assert iteration == "dropped-hint", iteration
    assert dropped > 0, "4-entry rings in drop mode must drop some of resnet18's ops"
    assert recorded + dropped == full, "every op is either recorded or counted as dropped"
    assert in_trace == recorded
    assert 1 <= flagged <= dropped
    assert "ops were dropped" in r.stderr and "incomplete" in r.stderr
    assert "the trace written to" in r.stderr, "export() itself warns"
    back = crucible.load_trace(str(tmp_path / "d.crtrace"))
    assert back.stats()["dropped"] == dropped


KEY_FLOOR_SCRIPT = """
import torch, crucible_native as crucible, models
s = models.make("cnn")
ref = models.make("cnn")
crucible._ext.install_key_floor()
# The floor's kernels are the ones on the key: the hot ops' (addmm's among them), the
# composites' fallthroughs, and no recording kernel counted.
table = torch._C._dispatch_dump_table("aten::addmm")
on_key = [l for l in table.splitlines() if l.startswith(crucible._ext.dispatch_key() + ":")]
assert on_key and "fallthrough" not in on_key[0], table
assert crucible._ext.installed() and crucible._ext.unboxed_kernel_count() == 0
assert crucible._ext.composite_fallthrough_count() > 0
crucible._ext.set_enabled(True)
losses = [s.step().item() for _ in range(3)]
crucible._ext.set_enabled(False)
ref_losses = [ref.step().item() for _ in range(3)]
same = all(torch.equal(a, b) for a, b in zip(s.model.parameters(), ref.model.parameters()))
try:
    crucible.enable()
    refusal = "none"
except crucible.CrucibleError as e:
    refusal = str(e)
try:
    crucible.configure(unboxed_kernels=False)
    conf_refusal = "none"
except crucible.CrucibleError as e:
    conf_refusal = str(e)
print(crucible.stats()["total"], losses == ref_losses and same, crucible._ext.key_floor_installed())
print(refusal)
print(conf_refusal)
"""


@left_to_verify
def test_key_floor_kernels_record_nothing_and_change_nothing():
    # The benchmark's key-floor install (Note [Key floor]): every op passes through the key's
    # kernels, so the step computes exactly what eager does, and nothing is recorded; recording
    # in that process is refused with a reason.
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(crucible.__file__)), here]))
    r = subprocess.run([sys.executable, "-c", KEY_FLOOR_SCRIPT], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    counts, refusal, conf_refusal = r.stdout.splitlines()
    assert counts == "0 True True", counts
    assert "key-floor kernels" in refusal and "another process" in refusal, refusal
    # Choosing the kind of recording kernels there says why it cannot be done, not that the
    # recording kernels were installed.
    assert "key-floor kernels" in conf_refusal and "another process" in conf_refusal, conf_refusal
    # And the other way round: no floor in a process that installed the recording kernels.
    r = subprocess.run([sys.executable, "-c", "import crucible_native as c\nc.enable(); c.disable()\n"
                        "try:\n    c._ext.install_key_floor()\nexcept RuntimeError as e:\n    print(e)\n"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "recording kernels are installed" in r.stdout, r.stdout


@left_to_verify
@pytest.mark.skipif(crucible._ext.has_ablation_switches(), reason="an ablation build (bench/vessel_ablation.sh) has the switches")
def test_ablation_switch_is_refused_by_a_build_without_it():
    # CRUCIBLE_VESSEL_ABLATE names a rung of the ablation benchmark (Note [Ablation build]); a
    # build without the switches would record in full and the benchmark would report a rung it
    # never ran, so recording is refused, saying how to get such a build.
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(crucible.__file__)), CRUCIBLE_VESSEL_ABLATE="enter_only")
    script = ("import crucible_native as c\n"
              "try:\n    c.enable()\nexcept RuntimeError as e:\n    print(e)\n"
              "print(c._ext.installed(), c._ext.ablation())\n")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    message, state = r.stdout.strip().splitlines()
    assert "CRUCIBLE_VESSEL_ABLATE=enter_only" in message and "-DCRUCIBLE_VESSEL_ABLATION=ON" in message, message
    assert state == "False full", state


@left_to_verify
def test_sanitizer_build_is_refused_with_instructions(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "crucible_build.json").write_text('{"sanitizer": "asan-ubsan"}')
    env = dict(os.environ, CRUCIBLE_BUILD_DIR=str(tmp_path),
               PYTHONPATH=os.path.dirname(os.path.dirname(crucible.__file__)))
    env.pop("LD_PRELOAD", None)
    r = subprocess.run([sys.executable, "-c", "import crucible_native"], env=env,
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "sanitizer build" in r.stderr and "LD_PRELOAD" in r.stderr and "--preset release" in r.stderr


EQUIV_SCRIPT = """
import sys, torch, crucible_native as crucible, models
crucible.configure(unboxed_kernels=sys.argv[2] == "1")
for name in ("mlp", "cnn", "transformer"):
    s = models.make(name)
    crucible.track_modules(s.model)
    crucible.enable()
    for _ in range(2):
        s.step()
    crucible.disable()
crucible.export(sys.argv[1])
print(crucible._ext.unboxed_kernel_count())
"""


def test_unboxed_kernels_record_exactly_what_the_boxed_fallback_records(tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(crucible.__file__)), here]))
    counts = {}
    for mode in ("0", "1"):
        r = subprocess.run([sys.executable, "-c", EQUIV_SCRIPT, str(tmp_path / f"{mode}.crtrace"), mode],
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        counts[mode] = int(r.stdout.split()[-1])
    assert counts["0"] == 0 and counts["1"] > 20
    boxed = crucible.load_trace(str(tmp_path / "0.crtrace")).ops()
    unboxed = crucible.load_trace(str(tmp_path / "1.crtrace")).ops()
    assert len(boxed) == len(unboxed) > 500

    def canonical(ops):
        # Addresses differ between processes; everything else must not, except the values of
        # storage ids, which may differ (Note [Allocation tags]: ids are drawn in blocks per
        # thread as memory is allocated). Renumbering each trace by first appearance keeps the
        # test exact: equal canonical traces mean the two numberings are one renaming of the other.
        ids = {}
        for op in ops:
            for t in op["inputs"] + op["outputs"]:
                t.pop("data_ptr")
                if t["storage_id"]:
                    t["storage_id"] = ids.setdefault(t["storage_id"], len(ids) + 1)
        return ops

    for b, u in zip(canonical(boxed), canonical(unboxed)):
        assert b == u, b["name"]
