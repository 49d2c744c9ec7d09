"""The exec stage on recorded training steps: a step the Vessel recorded, planned through Forge
(trace -> IR001 -> the cpu-avx2 rules -> IR002 -> execution plan) and run on the null backend
(every kernel as ATen calls on memory the plan placed, through the ATen provider) or on Mimic's
CPU backend (its generated kernels, the rest through the same provider), from the step's inputs
as they were before it, gives eager's bits: parameters, buffers, optimizer state, gradients and
the loss."""
import os

import pytest
import torch

import crucible_native as crucible
from crucible_native._native import build_info
import models
from stepstate import state_tensors, storage_bytes

pytestmark = pytest.mark.skipif(build_info.get("exec") is False,
                                reason="built with -DCRUCIBLE_LLVM=OFF: no exec stage")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
RULES = os.path.join(ROOT, "rules")


def names(s):
    """A name for each storage the step's state uses, for messages."""
    n = {}
    for k, p in s.model.named_parameters():
        n[crucible.storage_id(p)] = k
        if p.grad is not None:
            n[crucible.storage_id(p.grad)] = k + ".grad"
    for k, b in s.model.named_buffers():
        n[crucible.storage_id(b)] = k
    for i, st in enumerate(s.opt.state.values()):
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                n[crucible.storage_id(v)] = f"opt.state[{i}].{k}"
    return n


def snapshot(tensors):
    """Each tensor's storage bytes by storage id, taken with the recording paused (the copies
    are not part of the step)."""
    on = crucible.is_enabled()
    crucible.disable()
    try:
        return {crucible.storage_id(t): storage_bytes(t).clone() for t in tensors}
    finally:
        if on:
            crucible.enable()


@pytest.mark.parametrize("backend", ["null", "cpu"])
@pytest.mark.parametrize("name", models.large_skipped_under_asan(models.VESSEL_MODELS + ["transformer2"]))
def test_a_recorded_step_run_through_its_plan_gives_eager_bits(name, backend):
    """The last of four recorded steps, planned from its own ops (as crucible.compile would plan
    a captured call), not from iteration detection."""
    s = models.make(name)
    crucible.track_modules(s.model)
    batch = s.x.shape[0]
    steps = []  # per step: its inputs' bytes before, the state's bytes after, the loss
    try:
        for i in range(4):
            # A batch of its own per step: its storage id says which step the plan covers.
            torch.manual_seed(100 + i)
            s.x = torch.randn_like(s.x) if s.x.is_floating_point() else torch.randint_like(s.x, 0, 50)
            s.y = torch.randint_like(s.y, 0, 10)
            crucible.mark_inputs(s.x, s.y)
            before = snapshot(state_tensors(s) + [s.x, s.y])
            rng = torch.get_rng_state()
            crucible.flush()
            first = crucible.stats()["total"]
            crucible.enable()
            loss = s.step()
            crucible.disable()
            crucible.flush()
            after_tensors = state_tensors(s) + [loss]
            steps.append({"x": crucible.storage_id(s.x), "before": before, "rng": rng,
                          "ops": (first, crucible.stats()["total"]),
                          "after": snapshot(after_tensors), "loss": crucible.storage_id(loss)})
    finally:
        crucible.disable()
    assert batch == s.x.shape[0]

    # What Python holds after each step escapes: the loss and the gradients.
    held = [sid for st in steps for sid in st["after"]]
    step = steps[-1]
    begin, end = step["ops"]
    plan = crucible._native.load_exec().exec_plan(crucible.trace(), RULES, escaping=held,
                                                  backend=backend, begin=begin, end=end)
    assert step["x"] in [sid for sid, _ in plan.inputs], "the plan reads the step's batch"

    ins, outs, memory = [], [], {}
    for sid, nbytes in plan.inputs:
        assert sid in step["before"], (
            f"input storage {sid} ({nbytes} B) is not a tensor Python holds\n{plan.describe()}")
        buf = step["before"][sid].clone()
        assert buf.numel() >= nbytes
        memory[sid] = buf
        ins.append(buf.data_ptr())
    for sid, nbytes in plan.outputs:
        buf = torch.zeros(max(nbytes, 1), dtype=torch.uint8)
        memory[sid] = buf
        outs.append(buf.data_ptr())
    # Dropout draws from the default generator: from the state the step began with, the plan's
    # random ops draw what the step drew.
    torch.set_rng_state(step["rng"])
    stats = plan.run(ins, outs)
    assert stats["calls"] > 0
    if backend == "cpu":
        # Generated code runs the pointwise calls (Note [Kernel runs]): the optimizer's update
        # (SGD's momentum and lr steps), activations, residual adds, gradient accumulation; GEMMs,
        # convolutions, norms and reductions stay library calls.
        assert stats["generated_calls"] > 0, plan.kernels()

    compared, differ = 0, []
    for sid, want in step["after"].items():
        assert sid in memory, f"storage {sid}, held after the step, is not bound\n{plan.describe()}"
        got = memory[sid][:want.numel()]
        if not torch.equal(got, want):
            differ.append(f"{names(s).get(sid, 'the loss')} (storage {sid}): "
                          f"{(got != want).sum().item()} of {want.numel()} bytes")
        compared += 1
    assert not differ, "differ from eager's: " + "; ".join(differ)
    assert step["loss"] in memory, f"the loss ({step['loss']}) is an output of the plan\n{plan.describe()}"
    params = sum(1 for _ in s.model.parameters())
    assert compared >= params + 1, f"compared {compared} storages for {params} parameters"
