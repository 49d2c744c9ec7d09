"""crucible.compile never silently skips what a step does besides ATen ops: every step here
runs N times eagerly and N times compiled from the same state, and everything a user sees —
losses, parameters, optimizer state, learning rates, and the step's Python side effects (a
log list, a counter, a hook's count, printed text) — must be identical. A step whose Python
a replay would skip is refused openly (a CrucibleWarning and step.explain() name the cause)
and runs eagerly; a recognized LR scheduler stepped inside the step runs after each plan
run instead, and the plan runs."""
import io
import logging
import random
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import crucible_native as crucible

from test_replay import assert_same, batches, snapshot

N = 10


def usual_step(m, opt, after=None, before=None):
    """test_replay.train_step's body, with before() first and after(loss) last."""
    def f(x, y):
        if before is not None:
            before()
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        if after is not None:
            after(loss)
        return loss
    return f


def mlp(opt_name="SGD", **kw):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = getattr(torch.optim, opt_name)(m.parameters(), lr=kw.pop("lr", 0.05), **kw)
    return m, opt


def twin_runs(make, n=N, compile_kw=None):
    """make() -> (step, model, optimizer, observe): runs the step n times eagerly and n times
    compiled (whole-step replay unless compile_kw says otherwise: the refusals tested here are
    that mode's; test_sync.py runs the same steps in sync-point mode), each from fresh state. Returns (eager results, compiled results, compiled
    step, warnings of the compiled run); each result is (losses, snapshot, lrs, observe())."""
    out, step, caught = [], None, []
    for compiled in (False, True):
        f, m, opt, observe = make()
        step = crucible.compile(f, **(compile_kw or {"mode": "replay"})) if compiled else f
        losses, lrs = [], []
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for x, y in batches(n, [8]):
                losses.append(step(x, y).detach().clone())
                lrs.append([g["lr"] for g in opt.param_groups])
        if compiled:
            caught = [str(x.message) for x in w if issubclass(x.category, crucible.CrucibleWarning)]
        out.append((losses, snapshot(m, opt), lrs, observe()))
    return out[0], out[1], step, caught


def assert_identical(eager, compiled):
    for a, b in zip(eager[0], compiled[0]):
        assert torch.equal(a, b)
    assert_same(eager[1], compiled[1])
    assert eager[2] == compiled[2], "learning rates differ"
    assert eager[3] == compiled[3], "the step's Python side effects differ"


def refused_with(step, caught, pattern):
    st = step.stats()
    assert st["plan_runs"] == 0 and st["refusals"] >= 1, st
    assert any(pattern in c for c in caught), caught
    causes = [c for e in step.explain() if e["state"] == "refused" for c in e["causes"]]
    assert any(pattern in c for c in causes), causes


# -- recognized LR schedulers: the plan runs, the scheduler steps after it --------------------
SCHEDULERS = {
    "StepLR": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5),
    "LambdaLR": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda i: 1.0 / (1 + i)),
    "CosineAnnealingLR": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=7),
    "OneCycleLR": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=N + 2,
                                                                cycle_momentum=False),
    "SequentialLR": lambda o: torch.optim.lr_scheduler.SequentialLR(
        o, [torch.optim.lr_scheduler.LinearLR(o, 0.5, total_iters=3),
            torch.optim.lr_scheduler.ExponentialLR(o, 0.9)], milestones=[3]),
}


@pytest.mark.parametrize("opt_name", ["SGD", "Adadelta", "RMSprop", "Adagrad", "Adam", "AdamW"])
@pytest.mark.parametrize("sched_name", ["StepLR", "LambdaLR"])
def test_a_scheduler_stepped_inside_the_step_runs_after_each_plan_run(opt_name, sched_name):
    def make():
        m, opt = mlp(opt_name, momentum=0.9) if opt_name == "SGD" else mlp(opt_name)
        sched = SCHEDULERS[sched_name](opt)

        f = usual_step(m, opt, after=lambda loss: sched.step())
        return f, m, opt, lambda: (sched.last_epoch, sched.get_last_lr())

    eager, compiled, step, caught = twin_runs(make)
    assert_identical(eager, compiled)
    st = step.stats()
    assert st["refusals"] == 0, (step.last_refusal, caught)
    assert st["plan_runs"] >= N - 5 and st["replans"] == 0, st
    assert step.explain()[-1]["schedulers"] == [type(SCHEDULERS[sched_name](mlp()[1])).__name__]


@pytest.mark.parametrize("sched_name", ["CosineAnnealingLR", "OneCycleLR", "SequentialLR"])
def test_other_schedulers_inside_the_step(sched_name):
    def make():
        m, opt = mlp("SGD", momentum=0.9)
        sched = SCHEDULERS[sched_name](opt)

        f = usual_step(m, opt, after=lambda loss: sched.step())
        return f, m, opt, lambda: sched.last_epoch

    eager, compiled, step, caught = twin_runs(make)
    assert_identical(eager, compiled)
    assert step.stats()["refusals"] == 0 and step.stats()["plan_runs"] >= 1, (step.last_refusal, caught)


def test_a_scheduler_stepped_before_the_optimizer_is_refused():
    def make():
        m, opt = mlp()
        sched = SCHEDULERS["StepLR"](opt)

        def f(x, y):
            sched.step()
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            return loss
        return f, m, opt, lambda: sched.last_epoch

    eager, compiled, step, caught = twin_runs(make)
    assert_identical(eager, compiled)
    refused_with(step, caught, "StepLR.step() ran before its optimizer's step()")


def test_reduce_lr_on_plateau_fed_from_the_loss_is_refused():
    def make():
        m, opt = mlp()
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)

        def f(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            sched.step(loss.item())
            return loss
        return f, m, opt, lambda: sched.num_bad_epochs

    eager, compiled, step, caught = twin_runs(make)
    assert_identical(eager, compiled)
    assert step.stats()["plan_runs"] == 0 and step.stats()["refusals"] == 1


def test_a_step_that_sets_the_learning_rate_itself_is_refused():
    def make():
        m, opt = mlp()

        def f(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            for g in opt.param_groups:
                g["lr"] *= 0.9
            return loss
        return f, m, opt, lambda: None

    eager, compiled, step, caught = twin_runs(make)
    assert_identical(eager, compiled)
    refused_with(step, caught, "['lr'] changed")


# -- Python side effects: refused, and the eager calls keep every one of them -----------------
def side_effect_step(effect):
    """A step doing `effect(loss, state)` after its update; observe() returns the state."""
    def make():
        m, opt = mlp()
        state = {"log": [], "n": 0, "hook": [0], "out": io.StringIO()}

        def f(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            effect(loss, state, m)
            return loss

        def observe():
            return (list(state["log"]), state["n"], list(state["hook"]))
        return f, m, opt, observe
    return make


def _log_item(loss, state, m):
    state["log"].append(loss.item())


def _count(loss, state, m):
    state["n"] += 1


def _append_tensor(loss, state, m):
    state["log"].append(loss.detach())


@pytest.mark.parametrize("effect,pattern", [
    (_log_item, "grew"),
    (_count, "['n'] changed"),
])
def test_python_side_effects_are_refused_and_kept(effect, pattern):
    eager, compiled, step, caught = twin_runs(side_effect_step(effect))
    refused_with(step, caught, pattern)
    if effect is _log_item:
        assert len(compiled[3][0]) == N   # every call appended: the calls ran eagerly
    else:
        assert compiled[3][1] == N
    assert_identical(eager, compiled)


def test_a_list_of_tensors_growing_is_refused():
    eager, compiled, step, caught = twin_runs(side_effect_step(_append_tensor))
    refused_with(step, caught, "grew")
    assert len(compiled[3][0]) == N


N_GLOBAL = 0


def test_a_global_counter_is_refused_and_named():
    def make():
        m, opt = mlp()

        def f(x, y):
            global N_GLOBAL
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            N_GLOBAL += 1
            return loss
        return f, m, opt, lambda: None

    global N_GLOBAL
    N_GLOBAL = 0
    eager, compiled, step, caught = twin_runs(make)
    assert N_GLOBAL == 2 * N
    refused_with(step, caught, "global 'N_GLOBAL'")
    assert_identical(eager, compiled)


def test_a_forward_hook_that_counts_is_refused():
    def make():
        m, opt = mlp()
        count = [0]
        m[0].register_forward_hook(lambda mod, i, o: count.__setitem__(0, count[0] + 1))

        f = usual_step(m, opt)
        return f, m, opt, lambda: count[0]

    eager, compiled, step, caught = twin_runs(make)
    assert compiled[3] == N
    refused_with(step, caught, "_forward_hooks")
    assert_identical(eager, compiled)


def test_a_gradient_hook_that_counts_is_refused():
    def make():
        m, opt = mlp()
        count = [0]
        m[2].weight.register_hook(lambda g: count.__setitem__(0, count[0] + 1))

        f = usual_step(m, opt)
        return f, m, opt, lambda: count[0]

    eager, compiled, step, caught = twin_runs(make)
    assert compiled[3] == N
    refused_with(step, caught, "_backward_hooks")
    assert_identical(eager, compiled)


def test_printing_and_logging_are_refused(capsys, caplog):
    def make():
        m, opt = mlp()
        log = logging.getLogger("crucible.test")

        def f(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            print("step done")
            log.warning("a record")
            return loss
        return f, m, opt, lambda: None

    eager, compiled, step, caught = twin_runs(make)
    refused_with(step, caught, "wrote to stdout: 'step done'")
    causes = step.explain()[-1]["causes"]
    assert any("through logging: 'crucible.test: a record'" in c for c in causes), causes
    assert capsys.readouterr().out.count("step done") == 2 * N
    assert_identical(eager, compiled)


@pytest.mark.parametrize("source", ["random", "numpy"])
def test_drawing_from_python_or_numpy_random_is_refused(source):
    def make():
        m, opt = mlp()
        random.seed(0)
        np.random.seed(0)

        def f(x, y):
            opt.zero_grad()
            scale = random.random() if source == "random" else float(np.random.rand())
            loss = F.cross_entropy(m(x), y) * 0.0 + F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            return loss * (scale * 0 + 1)
        return f, m, opt, lambda: None

    eager, compiled, step, caught = twin_runs(make)
    refused_with(step, caught, "Python's random module" if source == "random" else "NumPy's global random")
    assert_identical(eager, compiled)


@pytest.mark.parametrize("read", ["tolist", "numpy", "array"])
def test_reading_values_without_an_aten_op_is_refused(read):
    def make():
        m, opt = mlp()
        seen = []

        def f(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            d = loss.detach()
            v = d.tolist() if read == "tolist" else (d.numpy() if read == "numpy" else np.asarray(d))
            seen.append(float(v))
            return loss
        return f, m, opt, lambda: list(seen)

    eager, compiled, step, caught = twin_runs(make)
    refused_with(step, caught, "read a tensor's values into Python")
    assert_identical(eager, compiled)


def test_adam_reading_its_step_counter_is_not_a_value_read():
    # Single-tensor Adam calls .item() on state["step"] inside optimizer.step(): recognized
    # optimizer code, fed to the plan through its scalar sources.
    def make():
        m, opt = mlp("Adam")

        f = usual_step(m, opt)
        return f, m, opt, lambda: None

    eager, compiled, step, caught = twin_runs(make)
    assert_identical(eager, compiled)
    assert step.stats()["refusals"] == 0 and step.stats()["plan_runs"] == N - 3


def test_a_pure_step_is_not_refused_and_the_check_leaves_no_trace():
    import sys
    out, err = sys.stdout, sys.stderr
    factory = logging.getLogRecordFactory()
    methods = {k: torch.Tensor.__dict__.get(k) for k in ("tolist", "numpy", "__array__", "data_ptr")}

    def make():
        m, opt = mlp("SGD", momentum=0.9)

        f = usual_step(m, opt)
        return f, m, opt, lambda: None

    eager, compiled, step, caught = twin_runs(make)
    assert_identical(eager, compiled)
    assert step.stats()["refusals"] == 0 and step.stats()["plan_runs"] == N - 3 and not caught
    assert sys.stdout is out and sys.stderr is err and logging.getLogRecordFactory() is factory
    assert {k: torch.Tensor.__dict__.get(k) for k in methods} == methods


def test_a_hook_added_after_the_plan_was_built_makes_the_step_record_again():
    res = []
    for compiled in (False, True):
        m, opt = mlp()
        count = [0]

        f = usual_step(m, opt)

        step = crucible.compile(f) if compiled else f
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i, (x, y) in enumerate(batches(N, [8])):
                if i == 6:
                    m[0].register_forward_hook(lambda mod, inp, o: count.__setitem__(0, count[0] + 1))
                step(x, y)
        res.append((snapshot(m, opt), count[0]))
    assert res[0][1] == res[1][1] == N - 6
    assert_same(res[0][0], res[1][0])
    assert step.stats()["guard_failures"] >= 1


def test_a_step_raising_part_way_leaves_no_watch_behind():
    import sys
    out = sys.stdout
    m, opt = mlp()
    calls = [0]

    def f(x, y):
        calls[0] += 1
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        if calls[0] == 2:
            raise KeyError("boom")
        loss.backward()
        opt.step()
        return loss

    step = crucible.compile(f)
    x, y = batches(1, [8])[0]
    step(x, y)
    with pytest.raises(KeyError):
        step(x, y)
    assert sys.stdout is out and torch.Tensor.__dict__.get("tolist") is None
    step(x, y)   # still usable


def test_grad_mode_autocast_and_default_dtype_are_part_of_the_signature():
    m, opt = mlp()

    def f(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y.long())
        loss.backward()
        opt.step()
        return loss

    step = crucible.compile(f)
    x, y = batches(1, [8])[0]
    for _ in range(5):
        step(x, y)
    assert step.stats()["plan_runs"] == 2
    with torch.no_grad(), pytest.raises(RuntimeError, match="does not require grad"):
        step(x, y)             # as eager: nothing to differentiate, not a replay of the plan
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            step(x, y)         # a new signature, refused: a replay would drop the casts
    assert any("autocast" in str(x.message) for x in w)
    runs = step.stats()["plan_runs"]
    step(x, y)
    assert step.stats()["plan_runs"] == runs + 1   # the plan of the plain signature still runs
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        step(x, y)
        assert step.stats()["plan_runs"] == runs + 1   # another signature: recorded, not replayed
    finally:
        torch.set_default_dtype(old)


# -- after_step: read values once the plan has run, and stay compiled -------------------------
def test_after_step_logs_every_call_and_the_step_stays_compiled():
    def make():
        m, opt = mlp("Adam")
        log = []

        def f(x, y):
            opt.zero_grad()
            out = m(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            opt.step()
            crucible.after_step(lambda l, o: log.append((l.item(), o.sum().item())), loss, out)
            return loss
        return f, m, opt, lambda: list(log)

    eager, compiled, step, caught = twin_runs(make)
    assert_identical(eager, compiled)
    assert len(compiled[3]) == N
    st = step.stats()
    assert st["refusals"] == 0 and st["plan_runs"] == N - 3 and st["guard_failures"] == 0, (st, caught)


LOG = []


def _record(loss):
    LOG.append(loss.item())


def test_after_step_with_a_global_function_and_a_flag_it_sets_that_the_step_reads():
    # The function passed to after_step sets a flag the step's own code reads: the Python
    # guard sees it before the next run, and that call records again.
    def make():
        m, opt = mlp()
        flags = {"halve": False}

        def f(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            if flags["halve"]:
                loss = loss * 0.5
            loss.backward()
            opt.step()
            crucible.after_step(_record, loss)
            crucible.after_step(lambda l: flags.__setitem__("halve", len(LOG) % 8 >= 5), loss)
            return loss
        LOG.clear()
        return f, m, opt, lambda: (list(LOG), dict(flags))

    eager, compiled, step, caught = twin_runs(make)
    assert_identical(eager, compiled)
    assert step.stats()["plan_runs"] >= 1 and step.stats()["guard_failures"] >= 1


def test_after_step_closing_over_a_local_of_the_step_is_refused():
    def make():
        m, opt = mlp()
        log = []

        def f(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            scale = y.shape[0]           # a local the function below closes over
            crucible.after_step(lambda l: log.append(l.item() * scale), loss)
            return loss
        return f, m, opt, lambda: list(log)

    eager, compiled, step, caught = twin_runs(make)
    assert_identical(eager, compiled)
    refused_with(step, caught, "closes over 'scale', a local variable of the step")


def test_after_step_outside_a_compiled_step_runs_at_once_and_checks_its_arguments():
    seen = []
    t = torch.ones(2)
    crucible.after_step(lambda a: seen.append(a.sum().item()), t)
    assert seen == [2.0]
    with pytest.raises(crucible.CrucibleTypeError, match="argument 1 must be a tensor"):
        crucible.after_step(print, 3.0)
    with pytest.raises(TypeError, match="must be callable"):
        crucible.after_step(None, t)


def test_after_step_functions_do_not_run_when_the_step_raises():
    m, opt = mlp()
    ran = []

    def f(x, y):
        loss = F.cross_entropy(m(x), y)
        crucible.after_step(lambda l: ran.append(1), loss)
        raise ValueError("part-way")

    step = crucible.compile(f)
    x, y = batches(1, [8])[0]
    with pytest.raises(ValueError, match="part-way"):
        step(x, y)
    assert ran == []


@pytest.mark.parametrize("opt_name", ["SGD", "RMSprop", "Adadelta"])
def test_foreach_optimizers_learn_a_changing_learning_rate(opt_name):
    def make():
        kw = {"foreach": True}
        if opt_name == "SGD":
            kw["momentum"] = 0.9
        m, opt = mlp(opt_name, **kw)
        sched = SCHEDULERS["StepLR"](opt)

        f = usual_step(m, opt, after=lambda loss: sched.step())
        return f, m, opt, lambda: sched.last_epoch

    eager, compiled, step, caught = twin_runs(make)
    assert_identical(eager, compiled)
    st = step.stats()
    assert st["replans"] == 0 and st["hyper_learned"] == 1 and st["plan_runs"] >= N - 5, (st, caught)


def test_a_plan_dropped_again_and_again_is_refused_with_the_reason():
    # foreach Adagrad passes a list of per-parameter learning rates: no source feeds it, so
    # each new learning rate (every second call here) drops the plan. Said once; after three
    # drops with no plan run in between the signature runs eagerly.
    def make():
        m, opt = mlp("Adagrad", foreach=True)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.9)

        f = usual_step(m, opt, after=lambda loss: sched.step())
        return f, m, opt, lambda: sched.last_epoch

    eager, compiled, step, caught = twin_runs(make, n=24)
    assert_identical(eager, compiled)
    st = step.stats()
    assert any("recorded again" in c for c in caught), caught
    assert st["replans"] >= 1 and step.last_replan
    assert st["refusals"] == 1 and "dropped 3 times" in step.last_refusal, (st, step.last_refusal)


G_FLAG = 0


def test_python_guard_sees_each_kind_of_change_in_cpp_and_names_it():
    from crucible_native._python_guard import PythonGuard
    m, opt = mlp()
    m.cfg = {"t": 1.0}                     # a container attribute of a module
    trainer = type("Trainer", (), {})()
    trainer.scale, trainer.history = 2.0, [1]
    cell_value = [0]

    def f(x):
        return m(x) * trainer.scale * cell_value[0] + G_FLAG + m.cfg["t"]

    g = PythonGuard(f, (), [m, opt], frozenset())
    assert g._native is not None and g.changed() is None
    changes = [
        (lambda: trainer.__setattr__("scale", 3.0), "'trainer'.scale changed 2.0 -> 3.0"),
        (lambda: trainer.history.append(2), "history (list) grew 1 -> 2 items"),
        (lambda: cell_value.__setitem__(0, 5), "'cell_value'[0] changed 0 -> 5"),
        (lambda: globals().__setitem__("G_FLAG", 1), "global 'G_FLAG'"),
        (lambda: m.cfg.__setitem__("t", 2.0), "Sequential.cfg['t'] changed 1.0 -> 2.0"),
        (lambda: m[0].weight.register_hook(lambda grad: grad), "_backward_hooks"),
    ]
    global G_FLAG
    try:
        for change, words in changes:
            g = PythonGuard(f, (), [m, opt], frozenset())
            assert g.changed() is None
            change()
            why = g.changed()
            assert why is not None and words in why, (words, why)
    finally:
        G_FLAG = 0


def test_python_guard_without_native_checks_still_sees_changes():
    from crucible_native._python_guard import PythonGuard
    seen = set()

    def f(x):
        return x * len(seen)

    g = PythonGuard(f, (), [], frozenset())
    assert g._native is None            # a set: walked in Python on every check
    assert g.changed() is None
    seen.add(1)
    assert "changed" in g.changed() or "grew" in g.changed()


def test_python_guard_accepts_an_equal_value_in_a_new_object():
    from crucible_native._python_guard import PythonGuard
    state = {"lr": [0.5]}

    def f(x):
        return x * state["lr"][0]

    g = PythonGuard(f, (), [], frozenset())
    state["lr"] = [0.5]                 # another list, same contents: the C++ check fails,
    assert g.changed() is None          # the walk finds it equal and compiles the checks anew
    assert g._native is not None and g._native.ok()
    state["lr"][0] = 0.25
    assert "changed 0.5 -> 0.25" in g.changed()


def test_reseeding_torch_inside_the_step_is_refused():
    # Eager draws the same dropout mask every call; a replay would keep drawing new ones.
    def make():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 4))
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        f = usual_step(m, opt, before=lambda: torch.manual_seed(123))
        return f, m, opt, lambda: None

    mlp()   # making an optimizer imports torch._dynamo, which rebinds torch.manual_seed once
    originals = (torch.manual_seed, torch.random.manual_seed, torch.cuda.manual_seed_all)
    eager, compiled, step, caught = twin_runs(make)
    refused_with(step, caught, "torch.manual_seed() reset torch's random generator")
    assert_identical(eager, compiled)
    assert (torch.manual_seed, torch.random.manual_seed, torch.cuda.manual_seed_all) == originals


def checkpointed(dropout):
    """A twin_runs maker: an MLP (with dropout or not) run under torch.utils.checkpoint."""
    from torch.utils.checkpoint import checkpoint

    def make():
        torch.manual_seed(0)
        layers = [nn.Linear(16, 32), nn.ReLU()] + ([nn.Dropout(0.5)] if dropout else []) + [nn.Linear(32, 4)]
        m = nn.Sequential(*layers)
        opt = torch.optim.SGD(m.parameters(), lr=0.05)

        def f(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(checkpoint(m, x, use_reentrant=False), y)
            loss.backward()
            opt.step()
            return loss
        return f, m, opt, lambda: None
    return make


def test_activation_checkpointing_with_dropout_is_refused_not_replayed_wrong():
    # torch.utils.checkpoint resets the generator (from torch's own code) to draw the
    # recomputed dropout's mask again in the backward, and fork_rng restores it as it exits: a
    # replay did neither, so from its first plan run the gradients and the generator's state
    # differed from eager's without a word
    eager, compiled, step, caught = twin_runs(checkpointed(dropout=True))
    refused_with(step, caught, "reset torch's random generator")
    assert_identical(eager, compiled)


def test_activation_checkpointing_without_random_ops_compiles():
    # checkpoint resets the generator to the state it saved, which is the state it has when the
    # checkpointed block draws nothing: nothing a replay would miss
    eager, compiled, step, caught = twin_runs(checkpointed(dropout=False))
    assert_identical(eager, compiled)
    assert step.stats()["plan_runs"] > 0, caught


def test_a_forked_generator_inside_the_step_is_refused():
    # torch.random.fork_rng gives the draws inside it back: eager leaves the generator where it
    # was, a replay left it advanced
    def f(x):
        with torch.random.fork_rng():
            return torch.rand_like(x) + x
    step = crucible.compile(f, guard=(), mode="replay")
    x = torch.randn(4, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(5):
            torch.manual_seed(i)
            a, after_a = step(x), torch.rand(3)
            torch.manual_seed(i)
            b, after_b = f(x), torch.rand(3)
            assert torch.equal(a, b) and torch.equal(after_a, after_b), i
    refused_with(step, [str(w.message) for w in caught], "reset torch's random generator")
    assert any("torch.random" in str(w.message) for w in caught), [str(w.message) for w in caught]


class Logger:
    """Hashed by identity: the same call key whatever it holds."""

    def __init__(self):
        self.losses, self.double = [], False


def test_an_argument_object_the_step_changes_or_reads_is_guarded():
    res = []
    for compiled in (False, True):
        m, opt = mlp()
        log, quiet, flags = Logger(), Logger(), Logger()

        def f(x, y, log, flags):
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            if flags.double:
                loss = loss * 2.0
            loss.backward()
            opt.step()
            return loss

        def g(x, y, log, flags):
            loss = f(x, y, log, flags)
            log.losses.append(loss.detach())
            return loss

        plain, logging_ = (crucible.compile(f, mode="replay"), crucible.compile(g, mode="replay")) if compiled else (f, g)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for i, (x, y) in enumerate(batches(N, [8])):
                if i == 6:
                    flags.double = True     # the caller flips a setting the step reads
                plain(x, y, quiet, flags)
                logging_(x, y, log, flags)
        res.append((snapshot(m, opt), len(log.losses)))
        if compiled:
            assert plain.stats()["guard_failures"] >= 1 and plain.stats()["plan_runs"] >= 1
            assert "argument 3" in plain.last_guard_failure and "double" in plain.last_guard_failure
            assert logging_.stats()["plan_runs"] == 0
            assert any("argument 2" in str(x.message) and "losses" in str(x.message) for x in w)
    assert_same(res[0][0], res[1][0])
    assert res[0][1] == res[1][1] == N


def test_reduce_lr_on_plateau_through_after_step_compiles():
    # The plateau scheduler needs the loss's value: stepped from after_step, once the plan
    # has run, the step stays pure; its new learning rates reach the plan as patch points.
    def make():
        m, opt = mlp(lr=0.5)
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5, threshold=0.5)
        f = usual_step(m, opt, after=lambda loss: crucible.after_step(lambda l: sched.step(l.item()), loss))
        return f, m, opt, lambda: (sched.num_bad_epochs, sched.best)

    eager, compiled, step, caught = twin_runs(make, n=16)
    assert_identical(eager, compiled)
    assert len(set(lr for lrs in compiled[2] for lr in lrs)) > 1, "the learning rate never changed"
    st = step.stats()
    assert st["refusals"] == 0 and st["plan_runs"] >= 1 and st["hyper_learned"] == 1, (st, caught)
