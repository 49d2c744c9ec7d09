"""crucible.compile: N compiled training steps against N eager steps of a twin built with the
same seed. Everything a user can observe must be bit-identical: returned losses, parameters,
.grad, buffers (batchnorm running stats), optimizer state."""
import copy
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import crucible_native as crucible
from crucible_native._native import build_info
import models


def snapshot(model, opt):
    return {
        "params": {k: p.detach().clone() for k, p in model.named_parameters()},
        "grads": {k: (None if p.grad is None else p.grad.clone()) for k, p in model.named_parameters()},
        "buffers": {k: b.clone() for k, b in model.named_buffers()},
        "opt": [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in st.items()}
                for st in opt.state_dict()["state"].values()],
    }


def assert_same(a, b):
    for part in ("params", "grads", "buffers"):
        assert a[part].keys() == b[part].keys()
        for k in a[part]:
            x, y = a[part][k], b[part][k]
            assert (x is None) == (y is None), (part, k)
            if x is not None:
                assert torch.equal(x, y), f"{part} {k} differs by {(x - y).abs().max().item()}"
    assert len(a["opt"]) == len(b["opt"])
    for sa, sb in zip(a["opt"], b["opt"]):
        assert sa.keys() == sb.keys()
        for k in sa:
            if isinstance(sa[k], torch.Tensor):
                assert torch.equal(sa[k], sb[k]), f"optimizer state {k} differs"
            else:
                assert sa[k] == sb[k]


def assert_twins(res):
    """res: [(losses, snapshot) eager, (losses, snapshot) compiled]."""
    for a, b in zip(res[0][0], res[1][0]):
        assert torch.equal(a, b)
    assert_same(res[0][1], res[1][1])


def run_eager(name, steps):
    s = models.make(name)
    losses = [s.step().detach().clone() for _ in range(steps)]
    return losses, snapshot(s.model, s.opt)


def run_compiled(name, steps, **kw):
    s = models.make(name)
    step = crucible.compile(s.step, **kw)
    losses = [step().detach().clone() for _ in range(steps)]
    return losses, snapshot(s.model, s.opt), step


@pytest.mark.parametrize("backend", ["replay", "cpu"])
@pytest.mark.parametrize("name,steps", [("mlp", 8), ("cnn", 6), ("resnet18", 4), ("efficientnet", 5)])
def test_compiled_steps_are_bit_identical_to_eager(name, steps, backend):
    if models.UNDER_ASAN and name in models.LARGE_MODELS and backend == "replay":
        pytest.skip("a large model under ASan compiles through the cpu backend only; verify runs both")
    eager_losses, eager_state = run_eager(name, steps)
    losses, state, step = run_compiled(name, steps, backend=backend)
    st = step.stats()
    # warm-up call, two recorded calls, then the plan
    assert st["plans_built"] == 1 and st["refusals"] == 0, step.last_refusal
    assert st["plan_runs"] == steps - 3
    for a, b in zip(eager_losses, losses):
        assert torch.equal(a, b)
    assert_same(eager_state, state)
    info = step.plans()[0]
    assert info["runs"] == steps - 3 and info["ops"] > 0 and len(info["hash"]) == 32
    phases = {n.rsplit("(", 1)[1] for n in info["op_names"]}
    assert phases == {"forward)", "backward)", "optimizer)"}
    # the first run planned the arena; every later run was served from it (the mlp's cpu plan
    # leaves ATen no allocation of its own inside a run: its one, ones_like's, is generated)
    assert info["arena"] == "ready" and info["arena_mismatches"] == 0
    assert info["arena_runs"] == steps - 4
    assert info["arena_served"] > 0 or (backend == "cpu" and name == "mlp"), info
    assert info["arena_bytes"] >= info["arena_lower_bound"]
    assert info["arena_bytes"] > 0 or info["arena_in_exec"] == info["arena_served"]
    if backend == "replay":
        # the returned loss, and each gradient: zero_grad() sets .grad to None (torch 2.x), so
        # backward makes every gradient anew and it outlives the call as param.grad
        n_params = sum(1 for _ in models.make(name).model.parameters())
        assert info["arena_escaping"] == 1 + n_params
        assert info["exec"] == ""
    elif build_info.get("exec") is False:   # no exec stage in this build: replayed, and said why
        why = build_info.get("exec_off") or "CRUCIBLE_LLVM=OFF"
        assert info["exec"] == "" and why in info["exec_note"], info["exec_note"]
    else:  # the exec stage's plan ran; the arena serves ATen's own allocations inside it,
        # most of them from the free bytes of the exec plan's arena (Note [One arena])
        assert info["exec"] == "cpu" and info["exec_note"] == "", info["exec_note"]
        assert info["arena_in_exec"] > 0 or name == "mlp", info


def test_arena_off_gives_the_same_results_and_escaping_tensors_stay_valid():
    data = batches(9, [8])
    outs = {}
    for arena in (True, False):
        m, opt, _ = mlp_with_args()

        def f(x, y):
            opt.zero_grad(set_to_none=True)
            out = m(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            opt.step()
            return loss, out.detach()       # a view of an intermediate escapes too

        # the replay's own arena accounting (on the exec stage the outputs are the exec plan's)
        step = crucible.compile(f, arena=arena, backend="replay")
        held = [step(x, y) for x, y in data]   # every returned tensor kept alive
        outs[arena] = ([(l.clone(), o.clone()) for l, o in held], held, snapshot(m, opt))
        info = step.plans()[0]
        if arena:
            assert info["arena"] == "ready" and info["arena_runs"] == 5
            # loss, the logits' storage and the 4 gradients bound to .grad outlive each run
            assert info["arena_escaping"] == 6
        else:
            assert info["arena"].startswith("off")
    for (l1, o1), (l2, o2), (l3, o3) in zip(outs[True][0], outs[False][0], outs[True][1]):
        assert torch.equal(l1, l2) and torch.equal(o1, o2)
        assert torch.equal(l1, l3) and torch.equal(o1, o3)  # not overwritten by later runs
    assert_same(outs[True][2], outs[False][2])


def test_allocation_measurement_of_an_eager_step():
    s = models.make("mlp")
    s.step()
    crucible._ext.alloc_measure_start()
    s.step()
    peak, n = crucible._ext.alloc_measure_stop()
    assert n > 10 and peak > 32 * 128 * 4          # at least the hidden activations
    with pytest.raises(RuntimeError, match="no allocation measurement"):
        crucible._ext.alloc_measure_stop()


def test_plan_returns_plain_tensors_and_sets_grads():
    s = models.make("mlp")
    step = crucible.compile(s.step)
    for _ in range(4):
        loss = step()
    assert step.stats()["plan_runs"] == 1
    assert loss.requires_grad is False and loss.grad_fn is None  # no autograd graph per call
    assert all(p.grad is not None for p in s.model.parameters())


def test_transformer_adamw_dropout_bit_identical_with_optimizer_scalars_patched():
    # PyTorch's single-tensor AdamW computes its step size and bias corrections in Python
    # floats from state["step"]: scalars that change every call. The plan takes them from
    # Crucible's replica of that arithmetic, matched bit for bit against two recorded calls.
    steps = 7
    eager_losses, eager_state = run_eager("transformer", steps)
    losses, state, step = run_compiled("transformer", steps)
    assert step.stats()["plan_runs"] == steps - 3, step.last_refusal
    for a, b in zip(eager_losses, losses):
        assert torch.equal(a, b)
    assert_same(eager_state, state)
    info = step.plans()[0]
    n_params = len(list(models.make("transformer").model.parameters()))
    assert info["patches"] == 2 * n_params      # addcdiv_ value and div other, per parameter
    assert any("bernoulli" in n for n in info["op_names"])


def test_transformer_adamw_dropout_with_a_per_step_lr_schedule():
    steps = 9
    res = []
    for compiled in (False, True):
        s = models.make("transformer")
        sched = torch.optim.lr_scheduler.LambdaLR(s.opt, lambda i: min(1.0, (i + 1) / 5))  # warm-up
        step = crucible.compile(s.step) if compiled else s.step
        losses = []
        for _ in range(steps):
            losses.append(step().detach().clone())
            sched.step()
        res.append((losses, snapshot(s.model, s.opt)))
        if compiled:
            st = step.stats()
            assert st["plans_built"] == 1 and st["hyper_learned"] == 1 and st["replans"] == 0
            assert st["plan_runs"] == steps - 4
    assert_twins(res)


@pytest.mark.parametrize("opt_name", ["adam", "adamw"])
def test_adam_with_scheduler_and_verification(opt_name):
    # A learning rate that changes (a scheduler) is checked once against a recorded call and
    # then fed to the plan like the step counter; verification of every 2nd plan call checks
    # the patched scalars against the replica's values.
    data = batches(14, [8])
    res = []
    for compiled in (False, True):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
        cls = torch.optim.Adam if opt_name == "adam" else torch.optim.AdamW
        opt = cls(m.parameters(), lr=3e-3, weight_decay=0.01, amsgrad=opt_name == "adam")
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)

        f = train_step(m, opt)

        step = crucible.compile(f, verify_every=2) if compiled else f
        losses = []
        for x, y in data:
            losses.append(step(x, y))
            sched.step()
        res.append((losses, snapshot(m, opt)))
        if compiled:
            st = step.stats()
            assert st["refusals"] == 0 and st["divergences"] == 0, (step.last_refusal, step.last_divergence)
            # the scheduler's change is learned: the plan takes the new lr from its sources
            assert st["guard_failures"] == 1 and st["plans_built"] == 1
            assert st["hyper_learned"] == 1 and st["replans"] == 0
            assert st["plan_runs"] >= 4 and st["verifications"] >= 4
    assert_twins(res)


def train_step(m, opt):
    """The usual step: zero_grad, cross-entropy of m(x) against y, backward, opt.step()."""
    def f(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        return loss
    return f


def mlp_with_args(seed=0):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    return m, opt, train_step(m, opt)


def batches(n, sizes, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(b, 16, generator=g), torch.randint(0, 4, (b,), generator=g))
            for b in (sizes[i % len(sizes)] for i in range(n))]


def test_step_arguments_are_patch_points_and_a_new_batch_size_builds_another_plan():
    data = batches(4, [8]) + batches(4, [5], seed=2) + batches(3, [8], seed=3)
    m1, o1, eager = mlp_with_args()
    m2, o2, f = mlp_with_args()
    step = crucible.compile(f)
    for x, y in data:
        assert torch.equal(eager(x, y), step(x, y))
    assert_same(snapshot(m1, o1), snapshot(m2, o2))
    st = step.stats()
    assert st["plans_built"] == 2 and st["plans"] == 2
    assert st["guard_misses"] == 1          # batch 5 arrived once a plan existed
    # batch 8: 1; batch 5: 1 recorded (it repeats batch 8's plan: Note [Size families]), 3 runs; batch 8: 3
    assert st["plan_runs"] == 1 + 3 + 3 and st["sizes_derived"] == 1
    assert all(p["args"] == 2 for p in step.plans())


def test_changed_hyperparameter_replaced_parameter_and_train_eval():
    data = batches(30, [8])
    m1, o1, eager = mlp_with_args()
    m2, o2, f = mlp_with_args()
    step = crucible.compile(f)
    it = iter(data)

    def both(n):
        for _ in range(n):
            x, y = next(it)
            assert torch.equal(eager(x, y), step(x, y))
        assert_same(snapshot(m1, o1), snapshot(m2, o2))

    both(5)
    assert step.stats()["plan_runs"] == 2
    for o in (o1, o2):                     # a scheduler would do this
        o.param_groups[0]["lr"] = 0.05
    both(5)
    st = step.stats()
    assert st["guard_failures"] == 1 and st["hyper_learned"] == 1 and st["replans"] == 0
    for m, o in ((m1, o1), (m2, o2)):      # a replaced parameter (and the optimizer told)
        torch.manual_seed(7)
        o.state.pop(m[0].weight, None)
        m[0].weight = nn.Parameter(torch.randn(32, 16) * 0.1)
        o.param_groups[0]["params"][0] = m[0].weight
    both(5)
    # The next call creates its momentum buffer: optimizer state that grows is Python a replay
    # would skip, so that capture is dropped; the call after it matches the plan, with the new
    # parameter and buffer bound in place of the old ones.
    st = step.stats()
    assert st["guard_failures"] == 3 and st["impure_captures"] == 1
    assert st["replans"] == 0 and st["rebinds"] == 1 and st["plan_updates"] == 2
    m1.eval(), m2.eval()
    both(4)
    # eval() changes no op of this model: the recorded call matches and the plan is kept
    st = step.stats()
    assert st["guard_failures"] == 4 and st["replans"] == 0 and st["plan_updates"] == 3
    m1.train(), m2.train()
    both(4)
    assert step.stats()["refusals"] == 0


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_learning_rate_changing_every_step_needs_no_rebuild(opt_name):
    data = batches(24, [8])
    res = []
    for compiled in (False, True):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        if opt_name == "sgd":
            opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        else:
            opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.05)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 / (1 + 0.1 * i))  # every step

        f = train_step(m, opt)

        step = crucible.compile(f) if compiled else f
        losses = []
        for x, y in data:
            losses.append(step(x, y))
            sched.step()
        res.append((losses, snapshot(m, opt)))
        if compiled:
            st = step.stats()
            assert st["plans_built"] == 1 and st["hyper_learned"] == 1 and st["replans"] == 0
            assert st["plan_runs"] == len(data) - 4   # warm-up, 2 recorded, 1 learning call
            assert step.plans()[0]["patches"] >= 4
    assert_twins(res)


def test_momentum_change_is_not_learned_and_records_again():
    data = batches(12, [8])
    m1, o1, eager = mlp_with_args()
    m2, o2, f = mlp_with_args()
    step = crucible.compile(f)
    for i, (x, y) in enumerate(data):
        if i == 6:
            o1.param_groups[0]["momentum"] = o2.param_groups[0]["momentum"] = 0.5
        assert torch.equal(eager(x, y), step(x, y))
    assert_same(snapshot(m1, o1), snapshot(m2, o2))
    st = step.stats()
    assert st["guard_failures"] == 1 and st["hyper_learned"] == 0 and st["replans"] == 1


def test_plan_survives_state_dict_round_trips():
    data = batches(16, [8])
    m1, o1, eager = mlp_with_args()
    m2, o2, f = mlp_with_args()
    step = crucible.compile(f)
    for i, (x, y) in enumerate(data):
        if i in (6, 11):
            for m, o in ((m1, o1), (m2, o2)):
                msd = {k: v.clone() for k, v in m.state_dict().items()}
                # a copy, as from a checkpoint file: torch 2.x keeps the very tensors of a
                # state_dict() loaded back (.to() of a tensor already in place is itself)
                osd = copy.deepcopy(o.state_dict())
                m.load_state_dict(msd)     # copies into the same tensors: the plan stays valid
                o.load_state_dict(osd)     # new state tensors: the guard sees it
        assert torch.equal(eager(x, y), step(x, y))
    assert_same(snapshot(m1, o1), snapshot(m2, o2))
    st = step.stats()
    # load_state_dict gives the optimizer new state tensors: one recorded call rebinds them
    assert st["guard_failures"] == 2 and st["rebinds"] == 2 and st["replans"] == 0
    assert st["plans_built"] == 1 and st["plan_runs"] == len(data) - 5


def test_zero_grad_set_to_none_binds_new_gradients():
    torch.manual_seed(0)
    data = batches(7, [8])
    res = []
    for compiled in (False, True):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)

        def f(x, y):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            return loss

        step = crucible.compile(f) if compiled else f
        losses = [step(x, y) for x, y in data]
        res.append((losses, snapshot(m, opt)))
        if compiled:
            assert step.stats()["plan_runs"] == 4
            assert step.plans()[0]["grad_bindings"] == 4
    assert_twins(res)


class DropNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 64), nn.Linear(64, 4)

    def forward(self, x):
        return self.fc2(F.dropout(F.relu(self.fc1(x)), p=0.3, training=self.training))


def test_dropout_draws_the_same_random_numbers_as_eager():
    data = batches(8, [8])
    res = []
    for compiled in (False, True):
        torch.manual_seed(3)
        m = DropNet()
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

        f = train_step(m, opt)

        step = crucible.compile(f) if compiled else f
        losses = [step(x, y) for x, y in data]
        res.append((losses, snapshot(m, opt), torch.rand(3)))
        if compiled:
            assert step.stats()["plan_runs"] == 5
            assert any("bernoulli" in n for n in step.plans()[0]["op_names"])
    assert_twins(res)
    assert torch.equal(res[0][2], res[1][2])  # the generator ends in the same state


def branchy(threshold):
    m, opt, _ = mlp_with_args()

    def f(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        if loss.item() > threshold:        # data-dependent control flow
            loss = loss * 2.0
        loss.backward()
        opt.step()
        return loss

    return m, opt, f


def test_branch_on_item_is_refused_and_runs_eagerly():
    x, y = batches(1, [8])[0]
    m1, o1, eager = branchy(1.0)
    losses = [eager(x, y).item() for _ in range(12)]
    assert losses[0] > 1.0 * 2 and min(losses) < 1.0  # the branch flips while training
    m1, o1, eager = branchy(1.0)
    m2, o2, f = branchy(1.0)
    step = crucible.compile(f, mode="replay")
    with pytest.warns(crucible.CrucibleWarning, match=r"reads tensor values into Python \(op #\d+ aten::_local_scalar_dense"):
        for _ in range(12):
            assert torch.equal(eager(x, y), step(x, y))
    assert_same(snapshot(m1, o1), snapshot(m2, o2))
    st = step.stats()
    assert st["refusals"] == 1 and st["plan_runs"] == 0 and st["eager_calls"] == 12
    refused = [x for x in step.explain() if x["state"] == "refused"]
    assert len(refused) == 1 and any("_local_scalar_dense" in c for c in refused[0]["causes"])


def flagged(env):
    """A step whose path depends on an environment variable: Python state no guard sees."""
    m, opt, _ = mlp_with_args()

    def f(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        if os.environ.get(env) == "1":
            loss = loss * 2.0
        loss.backward()
        opt.step()
        return loss

    return m, opt, f


def test_a_branch_no_guard_sees_is_caught_by_verification_and_the_call_is_eager(monkeypatch):
    env = "CRUCIBLE_TEST_BRANCH"
    monkeypatch.delenv(env, raising=False)
    x, y = batches(1, [8])[0]
    m1, o1, eager = flagged(env)
    m2, o2, f = flagged(env)
    step = crucible.compile(f, verify_every=1)   # every plan call re-records and compares
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for i in range(12):
            if i == 6:
                monkeypatch.setenv(env, "1")
            assert torch.equal(eager(x, y), step(x, y))
    assert_same(snapshot(m1, o1), snapshot(m2, o2))
    st = step.stats()
    assert st["divergences"] >= 1 and st["verifications"] >= 1
    assert any("diverged" in str(x.message) for x in w)
    assert "different ops" in step.last_divergence or "ops in one call" in step.last_divergence


def test_a_global_the_caller_changes_between_calls_makes_the_step_record_again():
    # The step reads a module-level setting; the training loop changes it between calls. The
    # plan ran the old path: the Python guard sees the change before the next run.
    m1, o1, _ = mlp_with_args()
    m2, o2, _ = mlp_with_args()
    data = batches(12, [8])
    res = []
    for m, o, compiled in ((m1, o1, False), (m2, o2, True)):
        settings = {"double": False}

        def f(x, y, m=m, o=o, settings=settings):
            o.zero_grad()
            loss = F.cross_entropy(m(x), y)
            if settings["double"]:
                loss = loss * 2.0
            loss.backward()
            o.step()
            return loss

        step = crucible.compile(f) if compiled else f
        losses = []
        for i, (x, y) in enumerate(data):
            if i == 6:
                settings["double"] = True
            losses.append(step(x, y))
        res.append(losses)
    for a, b in zip(*res):
        assert torch.equal(a, b)
    assert_same(snapshot(m1, o1), snapshot(m2, o2))
    st = step.stats()
    assert st["guard_failures"] >= 1 and st["plan_runs"] >= 4
    assert "settings" in step.last_guard_failure and "False -> True" in step.last_guard_failure


def test_changing_python_number_is_refused_with_its_source_named():
    m, opt, _ = mlp_with_args()
    cfg = {"scale": 1.0}

    def f(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y) * cfg["scale"]
        loss.backward()
        opt.step()
        return loss

    step = crucible.compile(f, mode="replay")
    # The caller changes the number between calls (the step itself changing it is a side
    # effect, refused by the purity check: test_side_effects_*). Three pairs of recorded calls
    # disagree (it might have been a one-off), then it is refused.
    with pytest.warns(crucible.CrucibleWarning, match="Python number 1.75"):
        for x, y in batches(6, [8]):
            step(x, y)
            cfg["scale"] += 0.25
    assert "aten::mul.Tensor" in step.last_refusal and "'other'" in step.last_refusal
    assert step.stats()["plan_runs"] == 0 and step.stats()["eager_calls"] == 6


def test_a_step_that_changes_a_python_number_it_uses_is_refused():
    m, opt, _ = mlp_with_args()
    cfg = {"scale": 1.0}

    def f(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y) * cfg["scale"]
        loss.backward()
        opt.step()
        cfg["scale"] += 0.25
        return loss

    step = crucible.compile(f, mode="replay")
    with pytest.warns(crucible.CrucibleWarning, match=r"f closure variable 'cfg'\['scale'\] changed"):
        for x, y in batches(6, [8]):
            step(x, y)
    assert step.stats()["plan_runs"] == 0 and step.stats()["eager_calls"] == 6
    assert cfg["scale"] == 1.0 + 6 * 0.25


def test_tensor_made_by_python_each_call_is_refused():
    m, opt, _ = mlp_with_args()
    data = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)

    def f(y):
        x = torch.from_numpy(data.copy())   # a new tensor each call, which the plan cannot feed
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        return loss

    step = crucible.compile(f, mode="replay")
    y = torch.randint(0, 4, (8,))
    with pytest.warns(crucible.CrucibleWarning, match="Pass it to the step as an argument"):
        for _ in range(5):
            step(y)
    assert step.stats()["plan_runs"] == 0


def test_output_structures_and_a_non_tensor_output():
    m, opt, _ = mlp_with_args()

    def f(x, y):
        opt.zero_grad()
        out = m(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        opt.step()
        return {"loss": loss, "extra": (out.detach(), None)}

    step = crucible.compile(f)
    m2, opt2, _ = mlp_with_args()

    def g(x, y):
        return f(x, y)
    for x, y in batches(5, [8]):
        r = step(x, y)
    assert step.stats()["plan_runs"] == 2
    assert set(r) == {"loss", "extra"} and r["extra"][1] is None and r["extra"][0].shape == (8, 4)

    def h(x, y):
        opt2.zero_grad()
        loss = F.cross_entropy(m2(x), y)
        loss.backward()
        opt2.step()
        return loss.item()

    step2 = crucible.compile(h)
    with pytest.warns(crucible.CrucibleWarning, match="returns a float"):
        vals = [step2(x, y) for x, y in batches(4, [8])]
    assert all(isinstance(v, float) for v in vals)


def test_capture_leaves_the_trace_alone_and_stats_count():
    before = crucible.stats()["compiled"]
    s = models.make("mlp")
    step = crucible.compile(s.step)
    for _ in range(5):
        step()
    crucible.flush()
    st = crucible.stats()
    assert st["total"] == 0                      # recording was off: nothing in the trace
    c = st["compiled"]
    assert c["plans_built"] - before["plans_built"] == 1
    assert c["plan_runs"] - before["plan_runs"] == 2
    assert c["captures"] - before["captures"] == 2


def test_compiled_step_while_recording_runs_eagerly_and_records_every_call():
    """A plan runs outside the recording; while the thread records, a compiled step runs
    eagerly instead, so the trace holds every call, as for the uncompiled step."""
    s = models.make("mlp")
    step = crucible.compile(s.step)
    for _ in range(4):
        step()
    assert step.stats()["plan_runs"] > 0, "a plan exists before recording starts"
    runs = step.stats()["plan_runs"]
    with pytest.warns(crucible.CrucibleWarning, match="runs eagerly while this thread records"):
        with crucible.recording():
            for _ in range(3):
                step()
    assert step.stats()["plan_runs"] == runs
    recorded = crucible.stats()["total"]
    crucible.clear()
    ref = models.make("mlp")
    for _ in range(4):
        ref.step()
    with crucible.recording():
        for _ in range(3):
            ref.step()
    assert recorded == crucible.stats()["total"] > 0


def test_bad_arguments():
    with pytest.raises(crucible.CrucibleError, match="callable"):
        crucible.compile(3)
    with pytest.raises(crucible.CrucibleError, match="verify_every must not be negative"):
        crucible.compile(lambda: None, verify_every=-1)
    with pytest.raises(crucible.CrucibleError, match="verify_every must be an int, got float"):
        crucible.compile(lambda: None, verify_every=2.5)
    with pytest.raises(crucible.CrucibleError, match="warmup must be an int, got NoneType"):
        crucible.compile(lambda: None, warmup=None)
    with pytest.raises(crucible.CrucibleError, match="arena must be True or False"):
        crucible.compile(lambda: None, arena="no")
    # guard: one module is taken as it is; an entry that holds no module or optimizer is an error,
    # not ignored.
    m = torch.nn.Linear(2, 2)
    assert crucible.compile(lambda: None, guard=m)._guard_objs == [m]
    with pytest.raises(crucible.CrucibleError, match="guard entry of type OrderedDict is no module"):
        crucible.compile(lambda: None, guard=(m, m.state_dict()))
    with pytest.raises(crucible.CrucibleError, match="guard must be a module, an optimizer, or a sequence"):
        crucible.compile(lambda: None, guard=3)


def test_an_unhashable_argument_runs_eagerly_and_says_why():
    m = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)

    def f(x, tags):
        opt.zero_grad()
        loss = m(x).sum()
        loss.backward()
        opt.step()
        return loss

    step = crucible.compile(f)
    x = torch.randn(4, 3)
    with pytest.warns(crucible.CrucibleWarning, match="of type set cannot be hashed"):
        step(x, [{"a"}])
    step(x, [{"a"}])  # warned once
    assert step.stats()["eager_calls"] == 2 and step.stats()["plans_built"] == 0
    assert "set" in step.last_refusal


def test_gradient_accumulation_outside_the_step():
    # The step only runs forward and backward; the optimizer steps and clears the gradients
    # every 3 calls outside it. Whether .grad is None when a call begins changes what backward
    # does (store vs accumulate): the plan checks it before every run.
    data = batches(13, [8])
    res = []
    for compiled in (False, True):
        m, opt, _ = mlp_with_args()

        def f(x, y):
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            return loss

        step = crucible.compile(f, guard=(m, opt)) if compiled else f
        losses = []
        for i, (x, y) in enumerate(data):
            losses.append(step(x, y).detach())
            if i % 3 == 2:
                opt.step()
                opt.zero_grad(set_to_none=True)
        res.append((losses, snapshot(m, opt)))
        if compiled:
            st = step.stats()
            # one plan for "no .grad yet" (backward stores), one for "accumulate"
            assert st["plans"] == 2 and st["plan_runs"] >= 5 and st["replans"] == 0
    assert_twins(res)


def test_frozen_parameter_and_replaced_data_are_noticed():
    data = batches(14, [8])
    m1, o1, eager = mlp_with_args()
    m2, o2, f = mlp_with_args()
    step = crucible.compile(f)
    for i, (x, y) in enumerate(data):
        if i == 5:                                   # freeze the first layer
            for m in (m1, m2):
                m[0].weight.requires_grad_(False)
                m[0].bias.requires_grad_(False)
        if i == 10:                                  # new data under the same Parameter
            for m in (m1, m2):
                torch.manual_seed(5)
                m[2].weight.data = torch.randn(4, 32) * 0.1
        assert torch.equal(eager(x, y), step(x, y))
    assert_same(snapshot(m1, o1), snapshot(m2, o2))
    assert step.stats()["guard_failures"] >= 2


def test_python_number_arguments_are_plan_constants_by_value():
    m, opt, _ = mlp_with_args()
    m2, opt2, _ = mlp_with_args()

    def make(model, o):
        def f(x, y, scale):
            o.zero_grad()
            loss = F.cross_entropy(model(x), y) * scale
            loss.backward()
            o.step()
            return loss
        return f

    eager, step = make(m, opt), crucible.compile(make(m2, opt2))
    for i, (x, y) in enumerate(batches(16, [8])):
        scale = 0.5 if (i // 4) % 2 == 0 else 0.25
        assert torch.equal(eager(x, y, scale), step(x, y, scale))
    assert_same(snapshot(m, opt), snapshot(m2, opt2))
    assert step.stats()["plans"] == 2 and step.stats()["plan_runs"] >= 4


def test_tensors_inside_tuple_arguments_are_patch_points():
    m1, o1, eager = mlp_with_args()
    m2, o2, f = mlp_with_args()
    step = crucible.compile(lambda batch: f(*batch), guard=(m2, o2))
    for x, y in batches(7, [8]):
        assert torch.equal(eager(x, y), step((x, y)))
    assert_same(snapshot(m1, o1), snapshot(m2, o2))
    st = step.stats()
    assert st["plans"] == 1 and st["plan_runs"] == 4 and st["guard_misses"] == 0


def test_autocast_is_refused_and_runs_eagerly():
    m, opt, f = mlp_with_args()
    step = crucible.compile(f)
    with pytest.warns(crucible.CrucibleWarning, match="autocast"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for x, y in batches(4, [8]):
                step(x, y)
    assert step.stats()["plan_runs"] == 0 and step.stats()["refusals"] == 1


def test_a_step_without_visible_modules_warns():
    m, opt, f = mlp_with_args()
    holder = [f]
    step = crucible.compile(lambda x, y: holder[0](x, y))   # model and optimizer out of sight
    with pytest.warns(crucible.CrucibleWarning, match="found no torch.nn.Module"):
        for x, y in batches(4, [8]):
            step(x, y)


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_param_groups_that_share_a_learning_rate_and_later_diverge(opt_name):
    # Two groups on the same warm-up: while the plan learns the learning rate their scalars
    # are equal, so each op must be tied to its own group's source (by the tensor it
    # updates), not to whichever group comes first.
    data = batches(16, [8])
    res = []
    for compiled in (False, True):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        groups = [{"params": m[0].parameters()}, {"params": m[2].parameters()}]
        opt = (torch.optim.SGD(groups, lr=0.1, momentum=0.9) if opt_name == "sgd"
               else torch.optim.AdamW(groups, lr=1e-2, weight_decay=0.05))
        warm = lambda i: min(1.0, (i + 1) / 4)                                # noqa: E731
        sched = torch.optim.lr_scheduler.LambdaLR(opt, [warm, lambda i: warm(i) * (0.3 if i >= 9 else 1.0)])

        f = train_step(m, opt)

        step = crucible.compile(f) if compiled else f
        losses = []
        for x, y in data:
            losses.append(step(x, y))
            sched.step()
        res.append((losses, snapshot(m, opt)))
        if compiled:
            assert step.stats()["replans"] == 0 and step.stats()["plan_runs"] >= 8, step.stats()
    assert_twins(res)


def test_module_settings_are_guarded():
    data = batches(12, [8])
    res = []
    for compiled in (False, True):
        torch.manual_seed(0)
        m = DropNet()
        bn = nn.BatchNorm1d(4)
        opt = torch.optim.SGD(list(m.parameters()) + list(bn.parameters()), lr=0.1, momentum=0.9)

        def f(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(bn(m(x)), y)
            loss.backward()
            opt.step()
            return loss

        step = crucible.compile(f) if compiled else f
        torch.manual_seed(1)
        losses = []
        for i, (x, y) in enumerate(data):
            if i == 6:
                bn.momentum = 0.5          # read by the forward as a scalar
            losses.append(step(x, y))
        res.append((losses, snapshot(m, opt), bn.running_mean.clone(), bn.running_var.clone()))
        if compiled:
            assert step.stats()["guard_failures"] == 1
    assert_twins(res)
    assert torch.equal(res[0][2], res[1][2]) and torch.equal(res[0][3], res[1][3])


@pytest.mark.parametrize("opt_name", ["SGD", "Adam", "AdamW"])
@pytest.mark.parametrize("impl", ["single", "foreach", "fused"])
def test_torch2_optimizer_implementations_replay_bit_identically_or_refuse_with_the_reason(opt_name, impl):
    # torch 2.x optimizers keep `step` as a tensor and pick a single-tensor, foreach or fused
    # implementation; on the CPU the default is single-tensor. Each runs compiled bit for bit,
    # or runs eagerly with the reason said.
    data = batches(10, [8])
    res, step = [], None
    for compiled in (False, True):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
        kw = {"lr": 0.01, "foreach": impl == "foreach", "fused": impl == "fused"}
        if opt_name == "SGD":
            kw["momentum"] = 0.9
        opt = getattr(torch.optim, opt_name)(m.parameters(), **kw)
        f = train_step(m, opt)
        step = crucible.compile(f, verify_every=2, mode="replay") if compiled else f
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", crucible.CrucibleWarning)
            losses = [step(x, y).detach().clone() for x, y in data]
        res.append((losses, snapshot(m, opt)))
    assert_twins(res)
    st = step.stats()
    assert st["divergences"] == 0, step.last_divergence
    if opt_name in ("Adam", "AdamW") and impl == "foreach":
        # The foreach path computes its bias corrections in Python from each step tensor and
        # passes them as a list of scalars that changes every call: no source feeds it yet.
        assert st["plan_runs"] == 0 and st["refusals"] == 1
        assert "_foreach_div_.ScalarList" in step.last_refusal
    else:
        # warm-up and two recorded calls, then the plan (every 2nd plan call verified)
        assert st["refusals"] == 0 and st["plan_runs"] >= 4 and st["plans_built"] == 1


def test_a_step_off_the_cpu_is_refused_and_runs_eagerly():
    # A step whose tensors live on another device (meta here; CUDA on a GPU machine: its
    # backward runs on autograd's device threads, which the capture does not follow) runs
    # eagerly, with the reason said, never a partial plan.
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("meta")
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    step = crucible.compile(train_step(m, opt))
    x, y = torch.randn(8, 16, device="meta"), torch.randint(0, 4, (8,), device="meta")
    with pytest.warns(crucible.CrucibleWarning, match="replays CPU steps only"):
        for _ in range(5):
            loss = step(x, y)
    assert loss.device.type == "meta"
    st = step.stats()
    assert st["plan_runs"] == 0 and st["refusals"] == 1 and st["eager_calls"] == 5
    assert "tensor on meta" in step.last_refusal


def test_a_step_that_makes_device_tensors_inside_is_refused_and_runs_eagerly():
    # Inputs and parameters on the CPU, but the step works on a tensor of another device it
    # holds itself (meta here; a global CUDA weight on a GPU machine, test_cuda.py): the
    # capture sees an op on it and refuses, since that device's backward would run unseen.
    torch.manual_seed(0)
    m = nn.Linear(8, 4)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    side = torch.zeros(4, device="meta")
    seen = []

    def f(x):
        opt.zero_grad()
        loss = m(x).square().mean()
        loss.backward()
        opt.step()
        seen.append((side + 1).shape)
        return loss

    ref_m = copy.deepcopy(m)
    ref_opt = torch.optim.SGD(ref_m.parameters(), lr=0.1)
    step = crucible.compile(f, guard=(m, opt))
    xs = [torch.randn(16, 8, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    with pytest.warns(crucible.CrucibleWarning, match="replays CPU"):
        losses = [step(x) for x in xs]
    for x, loss in zip(xs, losses):
        ref_opt.zero_grad()
        ref = ref_m(x).square().mean()
        ref.backward()
        ref_opt.step()
        assert torch.equal(ref, loss)
    st = step.stats()
    assert st["plan_runs"] == 0 and st["refusals"] == 1 and len(seen) == 6
    assert "aten::add" in step.last_refusal and "tensor on meta" in step.last_refusal, step.last_refusal


@pytest.mark.parametrize("arena", [True, False])
def test_tensors_made_from_python_data_inside_the_step_keep_their_values(arena):
    # torch.tensor(data) copies the data in below the dispatcher (Note [Lifted constants]):
    # the plan writes the recorded value, and a value that changes is refused.
    res = []
    for compiled in (False, True):
        torch.manual_seed(0)
        m = nn.Linear(4, 2)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        x = torch.randn(8, 4)
        c1, c2 = torch.zeros(()), torch.zeros(())

        def f(x):
            opt.zero_grad()
            loss = m(x).square().mean() * torch.tensor(0.5)
            loss.backward()
            opt.step()
            torch._foreach_add_([c1], torch.tensor(1.0), alpha=1.0)
            c2.add_(torch.tensor([1.0, 2.0]).sum())
            return loss

        step = crucible.compile(f, arena=arena) if compiled else f
        res.append(([step(x) for _ in range(10)], c1.clone(), c2.clone(), snapshot(m, opt)))
    for a, b in zip(res[0][0], res[1][0]):
        assert torch.equal(a, b)
    assert res[1][1].item() == 10.0 and res[1][2].item() == 30.0
    assert_same(res[0][3], res[1][3])
    assert step.stats()["plan_runs"] == 7 and step.plans()[0]["constants"] == 3


def test_a_tensor_made_from_python_data_that_changes_between_calls_is_refused():
    m, opt, _ = mlp_with_args()
    scale = [1.0]

    def f(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y) * torch.tensor(scale[0])
        loss.backward()
        opt.step()
        return loss

    step = crucible.compile(f, mode="replay")
    with pytest.warns(crucible.CrucibleWarning, match=r"built from Python data \(torch.tensor\(...\)\) that held other values"):
        for x, y in batches(6, [8]):
            step(x, y)
            scale[0] += 0.5   # between calls: the recorded calls disagree
    assert step.stats()["plan_runs"] == 0


@pytest.mark.parametrize("opt_name", ["RMSprop", "Adagrad", "Adadelta"])
def test_foreach_optimizers_counting_steps_with_torch_tensor(opt_name):
    # Their foreach step counts with _foreach_add_(steps, torch.tensor(1.0)): the state's step
    # must advance as eager's does (or the step be refused).
    res = []
    for compiled in (False, True):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        opt = getattr(torch.optim, opt_name)(m.parameters(), lr=0.01, foreach=True)
        f = train_step(m, opt)
        step = crucible.compile(f) if compiled else f
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", crucible.CrucibleWarning)
            losses = [step(x, y) for x, y in batches(10, [8])]
        res.append((losses, snapshot(m, opt)))
    assert_twins(res)
    assert all(float(s["step"]) == 10.0 for s in opt.state.values())


# A form whose last reference to a tensor dies in form_release while another Python thread
# waits for the replay registry: the tensor's weakref callback (run as it dies, in the releasing
# thread) lets the other thread into the registry and waits for it. Before Note [Releasing under
# the registry lock] the form died under the registry's mutex, and this hung.
RELEASE_SCRIPT = r"""
import threading, weakref
import torch
import crucible_native as crucible
_ext = crucible._ext
t = torch.randn(4)
_ext.capture_start(True)
y = t * 2
_ext.capture_stop()
form = torch.ops.crucible.capture_finish([], [y])
go, done = threading.Event(), threading.Event()
def other():
    go.wait()
    _ext.replay_counters()   # takes the registry's lock
    done.set()
threading.Thread(target=other, daemon=True).start()
seen = []
def dying(_):
    go.set()
    seen.append((releasing, done.wait(timeout=30)))
w = weakref.ref(t, dying)
releasing = False
del t, y
releasing = True
_ext.form_release(form)
print(seen)
"""


def test_releasing_a_form_lets_other_threads_into_the_registry_as_its_tensors_die():
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(crucible.__file__)), here]))
    try:
        r = subprocess.run([sys.executable, "-c", RELEASE_SCRIPT], env=env, capture_output=True, text=True,
                           timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("form_release deadlocked with a thread waiting for the replay registry")
    assert r.returncode == 0, r.stderr
    # the tensor died inside form_release, and the other thread got the registry meanwhile
    assert r.stdout.strip() == "[(True, True)]", r.stdout
