"""Sync-point mode (Note [Sync-point execution], vessel/torch/Sync.cpp): a step whose Python does
more than ATen ops — logs, counters, hooks, a branch on a tensor value, any LR scheduler — runs
compiled with its Python on every call; its backward() and optimizer steps run natively from
the plan where everything before them matched. Every step here runs N times eagerly and N
times compiled from the same state: losses, parameters, gradients, optimizer state, learning
rates and the Python side effects must be identical (bit for bit), and the stats must show the
plan running natively where the step allows it."""
import logging
import random

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import crucible_native as crucible

from test_purity import N, SCHEDULERS, assert_identical, mlp, twin_runs, usual_step
from test_replay import assert_same, batches, branchy, snapshot


def native_calls(step):
    st = step.stats()
    return st["sync_native"], st


def compiled_sync(step, at_least):
    n, st = native_calls(step)
    assert n >= at_least, st
    assert st["refusals"] == 0, (st, step.last_refusal)
    assert not any(e["state"] == "refused" for e in step.explain()), step.explain()


# -- the cases ----------------------------------------------------------------------------
@pytest.mark.parametrize("opt_name", ["SGD", "Adadelta", "RMSprop", "Adagrad", "Adam", "AdamW"])
@pytest.mark.parametrize("sched_name", ["StepLR", "LambdaLR", "CosineAnnealingLR"])
def test_any_scheduler_stepped_inside_the_step_is_right_in_sync_mode(opt_name, sched_name):
    def make():
        m, opt = mlp(opt_name, momentum=0.9) if opt_name == "SGD" else mlp(opt_name)
        sched = SCHEDULERS[sched_name](opt)
        return usual_step(m, opt, after=lambda loss: sched.step()), m, opt, lambda: (sched.last_epoch,
                                                                                      sched.get_last_lr())

    eager, compiled, step, _ = twin_runs(make, compile_kw={"mode": "sync"})
    assert_identical(eager, compiled)
    assert step.stats()["sync_calls"] >= 1


def test_logging_the_loss_and_counting_calls_run_every_call():
    def make():
        m, opt = mlp("SGD", momentum=0.9)
        log, n = [], {"calls": 0}

        def after(loss):
            log.append(loss.item())
            n["calls"] += 1
        return usual_step(m, opt, after=after), m, opt, lambda: (list(log), dict(n))

    eager, compiled, step, caught = twin_runs(make, compile_kw={"mode": "auto"})
    assert_identical(eager, compiled)
    assert len(compiled[3][0]) == N and compiled[3][1]["calls"] == N
    compiled_sync(step, N - 3)
    assert not caught, caught
    modes = [(e["mode"], e["mode_why"]) for e in step.explain() if e["state"] == "compiled"]
    assert modes and all(m == "sync" and why for m, why in modes), modes   # why: what ruled whole-step out
    seg = step.plans()[0]["segments"]
    assert any(s.startswith("backward()") and s.endswith("native") for s in seg), seg
    assert any(s.startswith("optimizer 0 step()") and s.endswith("native") for s in seg), seg


def test_a_forward_hook_that_counts_keeps_counting():
    def make():
        m, opt = mlp("Adam")
        seen = []
        m[0].register_forward_hook(lambda mod, i, o: seen.append(o.shape[0]))
        return usual_step(m, opt), m, opt, lambda: list(seen)

    eager, compiled, step, _ = twin_runs(make, compile_kw={"mode": "auto"})
    assert_identical(eager, compiled)
    assert len(compiled[3]) == N
    compiled_sync(step, N - 3)


def test_a_branch_on_a_tensor_value_that_flips_is_taken_as_in_eager():
    x, y = batches(1, [8])[0]
    m1, o1, eager = branchy(1.0)
    m2, o2, f = branchy(1.0)
    step = crucible.compile(f)
    flips = []
    for _ in range(12):
        a, b = eager(x, y), step(x, y)
        assert torch.equal(a, b)
        flips.append(a.item() > 2.0)
    assert_same(snapshot(m1, o1), snapshot(m2, o2))
    st = step.stats()
    assert st["refusals"] == 0 and st["sync_calls"] >= 1, st


def test_reduce_lr_on_plateau_fed_from_the_loss_runs_compiled():
    def make():
        m, opt = mlp("SGD", momentum=0.9, lr=0.5)
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
        return usual_step(m, opt, after=lambda loss: sched.step(loss.item())), m, opt, lambda: sched.num_bad_epochs

    eager, compiled, step, _ = twin_runs(make, n=16, compile_kw={"mode": "auto"})
    assert_identical(eager, compiled)
    assert [lr for lr in eager[2]] == [lr for lr in compiled[2]]
    assert step.stats()["sync_calls"] >= 1


def test_printing_logging_and_python_random_happen_every_call(capsys, caplog):
    def make():
        m, opt = mlp("AdamW")
        drawn = []
        logger = logging.getLogger("crucible.test.sync")

        def after(loss):
            print("loss", round(loss.item(), 3))
            logger.warning("step")
            drawn.append((random.random(), float(np.random.rand())))
        random.seed(0)
        np.random.seed(0)
        return usual_step(m, opt, after=after), m, opt, lambda: list(drawn)

    with caplog.at_level(logging.WARNING, logger="crucible.test.sync"):
        eager, compiled, step, _ = twin_runs(make, compile_kw={"mode": "auto"})
    assert_identical(eager, compiled)
    out = capsys.readouterr().out.splitlines()
    assert len([line for line in out if line.startswith("loss")]) == 2 * N
    assert len([r for r in caplog.records if r.name == "crucible.test.sync"]) == 2 * N
    compiled_sync(step, N - 3)


# -- what runs the engine or the optimizer's Python instead ----------------------------------------
def test_a_gradient_hook_runs_inside_the_engine(monkeypatch):
    import crucible_native._sync as sync
    monkeypatch.setattr(sync, "TIMED", 0)   # the own plan is never dropped for its speed here

    def make():
        m, opt = mlp("SGD", momentum=0.9)
        count = []
        m[2].weight.register_hook(lambda g: count.append(g.shape) or None)
        return usual_step(m, opt), m, opt, lambda: len(count)

    eager, compiled, step, _ = twin_runs(make, compile_kw={"mode": "sync"})
    assert_identical(eager, compiled)
    assert compiled[3] == N
    seg = step.plans()[0]["segments"]
    # the hook is Python inside backward(): the engine runs it; the optimizer step runs
    # natively, as a stretch three times, then as its own plan, which records two calls first
    # (Note [Optimizer plans])
    st = step.stats()
    assert st["sync_native"] >= N - 5 and st["optimizer_plan_runs"] == st["sync_native"] - 3, st


class Twice(torch.autograd.Function):
    calls = 0

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        Twice.calls += 1
        return g * 2


def test_a_custom_autograd_function_runs_its_python_backward():
    def make():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        Twice.calls = 0

        def f(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(Twice.apply(m(x)), y)
            loss.backward()
            opt.step()
            return loss
        return f, m, opt, lambda: Twice.calls

    eager, compiled, step, _ = twin_runs(make, compile_kw={"mode": "sync"})
    assert_identical(eager, compiled)
    assert compiled[3] == N


def test_gradient_accumulation_two_optimizers_and_dropout():
    def make():
        torch.manual_seed(0)
        enc = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2))
        head = nn.Linear(32, 4)
        o1 = torch.optim.Adam(enc.parameters(), lr=1e-2)
        o2 = torch.optim.SGD(head.parameters(), lr=0.1, momentum=0.9, nesterov=True)
        m = nn.Sequential(enc, head)
        seen = []

        def f(x, y):
            o1.zero_grad()
            o2.zero_grad()
            total = 0.0
            for xs, ys in zip(x.chunk(2), y.chunk(2)):
                loss = F.cross_entropy(m(xs), ys) / 2
                loss.backward()
                total += loss.item()
            o1.step()
            o2.step()
            seen.append(total)
            return loss
        return f, m, o1, lambda: list(seen)

    torch.manual_seed(5)
    eager, compiled, step, _ = twin_runs(make, compile_kw={"mode": "auto"})
    assert eager[3] == compiled[3]
    assert_identical(eager, compiled)


def test_an_exception_part_way_leaves_the_same_state_as_eager():
    def make():
        m, opt = mlp("SGD", momentum=0.9)
        calls = {"n": 0}

        def f(x, y):
            calls["n"] += 1
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            if calls["n"] == 7:
                raise KeyError("boom")
            opt.step()
            return loss
        return f, m, opt, lambda: calls["n"]

    results = []
    for compiled in (False, True):
        f, m, opt, observe = make()
        step = crucible.compile(f) if compiled else f
        losses = []
        for x, y in batches(N, [8]):
            try:
                losses.append(step(x, y).detach().clone())
            except KeyError:
                losses.append(None)
        results.append((losses, snapshot(m, opt), observe()))
    (le, se, ce), (lc, sc, cc) = results
    assert ce == cc and [x is None for x in le] == [x is None for x in lc]
    assert all(a is None or torch.equal(a, b) for a, b in zip(le, lc))
    assert_same(se, sc)


# -- the mode switch ------------------------------------------------------------------------------
def test_mode_is_checked():
    with pytest.raises(ValueError, match="mode must be one of auto, replay, sync"):
        crucible.compile(lambda: None, mode="fast")
    with pytest.raises(TypeError, match="mode must be a string"):
        crucible.compile(lambda: None, mode=1)


def test_a_pure_step_replays_whole_and_mode_sync_forces_sync_point_calls():
    for mode, key in (("auto", "plan_runs"), ("sync", "sync_native")):
        def make():
            m, opt = mlp("SGD", momentum=0.9)
            return usual_step(m, opt), m, opt, lambda: None
        eager, compiled, step, _ = twin_runs(make, compile_kw={"mode": mode})
        assert_identical(eager, compiled)
        st = step.stats()
        assert st[key] >= N - 3, (mode, st)
        assert st["sync_calls" if mode == "auto" else "plan_runs"] == 0, (mode, st)
        assert step.plans()[0]["sync"] == (mode == "sync")


def test_python_reads_of_tensor_memory_see_computed_values():
    """No tensor is ever pending in sync-point mode: numpy(), tolist(), data_ptr() and the
    buffer protocol read, right after a native optimizer step, what eager reads."""
    import ctypes

    def make():
        m, opt = mlp("SGD", momentum=0.9)
        reads = []

        def after(loss):
            w = m[0].weight
            p = ctypes.cast(w.data_ptr(), ctypes.POINTER(ctypes.c_float))
            reads.append((w.detach().numpy().sum().item(), w.detach().tolist()[0][:3], p[0],
                          bytes(memoryview(w.detach().numpy()))[:8], loss.item()))
        return usual_step(m, opt, after=after), m, opt, lambda: list(reads)

    eager, compiled, step, _ = twin_runs(make, compile_kw={"mode": "sync"})
    assert_identical(eager, compiled)
    compiled_sync(step, N - 3)


def test_two_backwards_with_retain_graph_and_autograd_grad_in_one_step():
    def make():
        m, opt = mlp("SGD", momentum=0.9)
        norms = []

        def f(x, y):
            opt.zero_grad()
            out = m(x)
            loss = F.cross_entropy(out, y)
            (g,) = torch.autograd.grad(loss, out, retain_graph=True)   # the engine, not a marked stretch
            norms.append(g.norm().item())
            loss.backward(retain_graph=True)
            (loss * 0.5).backward()
            opt.step()
            return loss
        return f, m, opt, lambda: list(norms)

    eager, compiled, step, _ = twin_runs(make, compile_kw={"mode": "auto"})
    assert_identical(eager, compiled)
    compiled_sync(step, N - 3)


def test_threads_each_with_their_own_sync_point_step():
    import threading

    def build(compiled):   # in this thread: models are initialised from the global generator
        m, opt = mlp("Adam")
        log = []
        f = usual_step(m, opt, after=lambda loss: log.append(loss.item()))
        return (crucible.compile(f) if compiled else f), m, opt, log

    def run(setup, out, i, data):
        step, m, opt, log = setup
        for x, y in data:
            step(x, y)
        out[i] = (log, snapshot(m, opt), step.stats() if hasattr(step, "stats") else None)

    results = {}
    for compiled in (False, True):
        out = {}
        setups = [build(compiled) for _ in range(3)]
        data = [batches(N, [8], seed=i + 1) for i in range(3)]
        # The first calls (warm-up and the recorded ones) one thread at a time: a call is
        # recorded only while no other thread records. Then the three run concurrently.
        for i in range(3):
            for x, y in data[i][:4]:
                setups[i][0](x, y)
            data[i] = data[i][4:]
        threads = [threading.Thread(target=run, args=(setups[i], out, i, data[i])) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results[compiled] = out
    for i in range(3):
        le, se, _ = results[False][i]
        lc, sc, st = results[True][i]
        assert le == lc
        assert_same(se, sc)
        assert st["sync_native"] >= 1, st


def test_a_step_that_alternates_between_two_paths_runs_both_natively():
    def make():
        m, opt = mlp("SGD", momentum=0.9)
        state = {"n": 0}

        def f(x, y):
            state["n"] += 1
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            if state["n"] % 2 == 0:       # every other call takes another path
                loss = loss * 2.0
            loss.backward()
            opt.step()
            return loss
        return f, m, opt, lambda: state["n"]

    n = 24
    eager, compiled, step, _ = twin_runs(make, n=n, compile_kw={"mode": "auto"})
    assert_identical(eager, compiled)
    st = step.stats()
    plans = step.plans()
    assert len(plans) == 2 and all(p["sync"] for p in plans), plans
    assert st["sync_native"] >= n - 12, st   # after the two paths are recorded, every call
    assert st["refusals"] == 0 and st["replans"] == 0, st


def test_a_layer_frozen_between_calls_is_not_trained_by_the_plan():
    """requires_grad_(False) on a parameter changes what autograd builds but not the forward's
    ATen ops: the call leaves the plan (and records the new state) instead of running a
    backward and an optimizer step that would still train the frozen layer."""
    def make():
        m, opt = mlp("SGD", momentum=0.9)
        log = []
        calls = {"n": 0}

        def f(x, y):
            calls["n"] += 1
            if calls["n"] == 6:
                m[0].weight.requires_grad_(False)
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            log.append(loss.item())
            return loss
        return f, m, opt, lambda: list(log)

    eager, compiled, step, _ = twin_runs(make, n=14, compile_kw={"mode": "auto"})
    assert_identical(eager, compiled)
    assert step.stats()["sync_native"] >= 3, step.stats()


def test_an_op_whose_output_size_depends_on_data_takes_the_call_off_the_plan():
    """A boolean mask selects a different number of elements each call: the same ops with the
    same wiring, but the backward was recorded for other sizes."""
    def make():
        m, opt = mlp("SGD", momentum=0.9)
        seen = []

        def f(x, y):
            opt.zero_grad()
            out = m(x)
            picked = out[out > out.mean()]        # how many: depends on the values
            seen.append(picked.numel())
            loss = F.cross_entropy(out, y) + picked.square().mean()
            loss.backward()
            opt.step()
            return loss
        return f, m, opt, lambda: list(seen)

    eager, compiled, step, _ = twin_runs(make, n=14, compile_kw={"mode": "auto"})
    assert_identical(eager, compiled)
    assert len(set(compiled[3])) > 1, compiled[3]   # the sizes did change


def test_a_pure_step_with_a_data_sized_result_is_not_replayed_whole():
    """Note [Data-sized results]: whole-step replay would run the backward at the recorded
    sizes; such a step runs sync-point, and stays right whatever the mask selects."""
    def make():
        m, opt = mlp("SGD", momentum=0.9)

        def f(x, y):
            opt.zero_grad()
            out = m(x)
            loss = F.cross_entropy(out, y) + out[out > out.mean()].square().mean()
            loss.backward()
            opt.step()
            return loss
        return f, m, opt, lambda: None

    eager, compiled, step, _ = twin_runs(make, n=14, compile_kw={"mode": "auto"})
    assert_identical(eager, compiled)
    st = step.stats()
    assert st["plan_runs"] == 0 and st["refusals"] == 0, st
    modes = [e["mode_why"] for e in step.explain() if e["mode"] == "sync"]
    assert modes and "depends on tensor values" in modes[0], step.explain()


# -- the optimizer's own plan (Note [Optimizer plans] in vessel/torch/Sync.cpp) ------------------
@pytest.mark.parametrize("opt_name", ["SGD", "Adadelta", "RMSprop", "Adagrad", "Adam", "AdamW"])
def test_a_sync_point_step_runs_its_optimizer_step_as_the_optimizers_own_plan(opt_name):
    def make():
        m, opt = mlp(opt_name, momentum=0.9) if opt_name == "SGD" else mlp(opt_name)
        log = []
        return usual_step(m, opt, after=lambda loss: log.append(loss.item())), m, opt, lambda: list(log)

    n = 14
    eager, compiled, step, caught = twin_runs(make, n=n, compile_kw={"mode": "sync"})
    assert_identical(eager, compiled)
    st = step.stats()
    # calls 1-3 warm up and record the step; in calls 4-6 the optimizer's step runs as a
    # stretch of the plan, in calls 7-8 its own plan records; then its own plan runs (three
    # times at least: a plan slower than the stretch is dropped after three runs)
    assert st["optimizer_plan_runs"] >= 3, st
    own = list(step._own_plans)
    assert len(own) == 1 and (own[0].step is not None or "the stretch" in own[0].dropped), own[0].dropped
    if own[0].step is not None:
        assert st["optimizer_plan_runs"] == n - 8, st
    assert st["sync_native"] >= n - 3 and st["refusals"] == 0, st
    assert not caught, caught


def test_an_optimizer_plan_slower_than_the_stretch_is_dropped(monkeypatch):
    import crucible_native._sync as sync
    monkeypatch.setattr(sync.OwnPlan, "stretch_ran", lambda self, s: self.stretch_s.append(0.0))

    def make():
        m, opt = mlp("AdamW")
        return usual_step(m, opt), m, opt, lambda: None

    eager, compiled, step, _ = twin_runs(make, n=16, compile_kw={"mode": "sync"})
    assert_identical(eager, compiled)
    st = step.stats()
    own = list(step._own_plans)
    assert own[0].step is None and "the stretch 0 us" in own[0].dropped, own[0].dropped
    assert st["optimizer_plan_runs"] == sync.TIMED and st["sync_native"] >= 16 - 3 - 2, st


def test_an_optimizer_plan_that_never_runs_gives_the_step_back_to_the_stretch(monkeypatch):
    import crucible_native._sync as sync
    monkeypatch.setattr(sync, "OWN_PLAN_TRIES", 1)   # dropped after its first call, which records

    def make():
        m, opt = mlp("Adam")
        return usual_step(m, opt), m, opt, lambda: None

    eager, compiled, step, _ = twin_runs(make, compile_kw={"mode": "sync"})
    assert_identical(eager, compiled)
    st = step.stats()
    assert st["optimizer_plan_runs"] == 0 and st["sync_native"] >= N - 3, st
    assert all(own.step is None for own in step._own_plans)


def _grads_outside(opt_name, set_to_none, n=12, restride_at=None):
    """backward() outside the compiled optimizer step, gradients zeroed to None or in place:
    (losses, snapshot, stats or None) for the eager and the compiled optimizer step."""
    out = []
    for compiled in (False, True):
        m, opt = mlp(opt_name, momentum=0.9) if opt_name == "SGD" else mlp(opt_name)
        step = crucible.compile(opt.step) if compiled else opt.step
        losses = []
        for i, (x, y) in enumerate(batches(n, [8], seed=5)):
            opt.zero_grad(set_to_none=set_to_none)
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            if i == restride_at:   # the same values in a gradient of other strides
                w = m[0].weight
                w.grad = w.grad.t().contiguous().t()
            step()
            losses.append(loss.detach().clone())
        out.append((losses, snapshot(m, opt), step.stats() if compiled else None, step))
    return out


@pytest.mark.parametrize("opt_name", ["SGD", "Adam", "AdamW", "RMSprop"])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_an_optimizer_step_compiled_alone_binds_each_calls_gradients(opt_name, set_to_none):
    # Note [Gradient bindings] (Replay.cpp): zero_grad() makes new gradient tensors every call
    (le, se, _, _), (lc, sc, st, step) = _grads_outside(opt_name, set_to_none)
    for a, b in zip(le, lc):
        assert torch.equal(a, b)
    assert_same(se, sc)
    assert st["plan_runs"] >= 12 - 3 and st["refusals"] == 0, (st, step.last_refusal)
    assert [e["mode"] for e in step.explain()] == ["replay"], step.explain()


def test_a_gradient_of_other_strides_fails_the_guard_and_the_step_stays_right():
    (le, se, _, _), (lc, sc, st, step) = _grads_outside("Adam", True, restride_at=6)
    for a, b in zip(le, lc):
        assert torch.equal(a, b)
    assert_same(se, sc)
    assert st["guard_failures"] >= 1 and st["plan_runs"] >= 4, st


def test_an_error_inside_the_optimizers_own_plan_ends_the_call_and_the_next_calls_run(monkeypatch):
    import crucible_native._sync as sync
    m, opt = mlp("SGD", momentum=0.9)
    step = crucible.compile(usual_step(m, opt), mode="sync")
    data = batches(14, [8])
    for x, y in data[:9]:
        step(x, y)
    assert step.stats()["optimizer_plan_runs"] >= 1, step.stats()

    def boom(self):
        raise RuntimeError("raised inside the optimizer's own plan")
    monkeypatch.setattr(sync, "TIMED", 0)   # never dropped for its speed
    with monkeypatch.context() as mp:
        mp.setattr(sync.OwnPlan, "run", boom)
        with pytest.raises(RuntimeError, match="inside the optimizer's own plan"):
            step(*data[9])
    before = step.stats()["optimizer_plan_runs"]
    for x, y in data[10:]:   # the suspended call was ended: sync-point calls go on
        assert torch.isfinite(step(x, y))
    assert step.stats()["optimizer_plan_runs"] == before + len(data[10:]), step.stats()


def test_a_users_own_step_function_on_the_optimizer_keeps_its_ops():
    # opt.step replaced on the instance by a function with ops of its own: the class's step()
    # as its own plan would skip them, so the stretch (which replays them) runs it
    def make():
        m, opt = mlp("Adam")
        base = opt.step

        def step_and_shrink():
            base()
            with torch.no_grad():
                m[0].weight.mul_(0.999)
        opt.step = step_and_shrink
        return usual_step(m, opt), m, opt, lambda: None

    eager, compiled, step, _ = twin_runs(make, n=14, compile_kw={"mode": "sync"})
    assert_identical(eager, compiled)
    st = step.stats()
    assert st["optimizer_plan_runs"] == 0 and st["sync_native"] >= 14 - 3, st


def test_a_recording_inside_a_sync_point_call_gives_the_call_its_hooks_back():
    import crucible_native._sync as sync
    with sync.Hooks("sync", []) as outer:
        with sync.Hooks("capture", []) as inner:   # an optimizer's own plan records
            assert sync._active() is inner
        assert sync._active() is outer
    assert sync._active() is None


def test_a_dropped_optimizer_plan_is_released_and_a_replaced_optimizer_forgotten(monkeypatch):
    import crucible_native._sync as sync
    monkeypatch.setattr(sync.OwnPlan, "stretch_ran", lambda self, s: self.stretch_s.append(0.0))
    released = []
    drop = sync.OwnPlan.drop

    def watched_drop(self, why):
        inner = self.step
        drop(self, why)
        released.append((why, inner.plans() if inner is not None else None))
    monkeypatch.setattr(sync.OwnPlan, "drop", watched_drop)

    def make():
        import types
        m, opt = mlp("AdamW")
        holder = types.SimpleNamespace(opt=opt)   # found one attribute deep
        log = []

        def f(x, y):
            holder.opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            holder.opt.step()
            log.append(loss.item())
            return loss

        def observe():
            return list(log)
        f.swap = lambda: setattr(holder, "opt", torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9))
        return f, m, holder.opt, observe

    out = []
    for compiled in (False, True):
        f, m, _, observe = make()
        step = crucible.compile(f, mode="sync") if compiled else f
        losses = []
        for i, (x, y) in enumerate(batches(30, [8])):
            if i == 12:
                f.swap()
            losses.append(step(x, y).detach().clone())
        out.append((losses, {k: p.detach().clone() for k, p in m.named_parameters()}, step))
    (le, pe, _), (lc, pc, step) = out
    assert all(torch.equal(a, b) for a, b in zip(le, lc))
    assert all(torch.equal(pe[k], pc[k]) for k in pe)
    assert released and released[0][1] == [], released   # slower than the stretch: its plans released
    own = list(step._own_plans)
    assert len(own) == 1 and type(own[0].opt).__name__ == "SGD", [type(o.opt).__name__ for o in own]
    assert any(why == "the step no longer uses this optimizer" for why, _ in released), released


def test_gradients_sharing_memory_they_did_not_share_when_recorded_fail_the_guard():
    # Note [Gradient bindings]: the plan was made over separate gradient storages
    out = []
    for compiled in (False, True):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
        opt = torch.optim.Adam(m.parameters(), lr=0.01)
        step = crucible.compile(opt.step) if compiled else opt.step
        for i in range(12):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
            opt.zero_grad()
            m(x).square().mean().backward()
            if i >= 7:
                m[1].weight.grad = m[0].weight.grad   # one gradient tensor for both
            step()
        out.append(([p.detach().clone() for p in m.parameters()], step))
    (pe, _), (pc, step) = out
    assert all(torch.equal(a, b) for a, b in zip(pe, pc))
    st = step.stats()
    assert st["guard_failures"] >= 1 and st["plan_runs"] >= 3, st


@pytest.mark.parametrize("flat_first", [True, False])
def test_gradients_in_one_flat_buffer_are_not_bound_and_the_step_stays_right(flat_first):
    # Note [Gradient bindings]: a gradient that is part of a larger storage (the others are
    # other parameters' gradients) is not bound; switching between a flat buffer and separate
    # gradients part-way records the step again or runs it eagerly, never reads stale memory
    out = []
    for compiled in (False, True):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
        params = list(m.parameters())
        opt = torch.optim.Adam(params, lr=0.01)
        step = crucible.compile(opt.step, mode="replay") if compiled else opt.step
        for i in range(14):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
            opt.zero_grad()
            m(x).square().mean().backward()
            if (i < 7) == flat_first:   # the gradients moved into one buffer, each a view of it
                flat = torch.cat([p.grad.reshape(-1) for p in params])
                at = 0
                for p in params:
                    p.grad = flat[at:at + p.numel()].view_as(p)
                    at += p.numel()
            step()
        out.append([p.detach().clone() for p in params])
    assert all(torch.equal(a, b) for a, b in zip(*out))
