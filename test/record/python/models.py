"""The four test models of the Vessel and pipeline tests, each with one training step."""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "utils", "python"))
import crucible_zoo  # noqa: E402  (torchvision's architectures without torchvision)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(x, 2)
        x = F.relu(self.conv2(x))
        return self.fc(torch.flatten(self.pool(x), 1))


class SmallTransformer(nn.Module):
    def __init__(self, vocab=50, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.enc = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        return self.head(self.enc(self.emb(tokens)))


class SmallTransformer2(nn.Module):
    """Two encoder layers (dropout 0.1): the step Forge's fusion figures are measured on."""

    def __init__(self, vocab=50, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, num_layers=2)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        return self.head(self.enc(self.emb(tokens)))


class Setup:
    """A model, its optimizer, one batch, and step() doing zero_grad/forward/backward/step."""

    def __init__(self, name, model, opt, x, y, loss):
        self.name, self.model, self.opt, self.x, self.y, self.loss = name, model, opt, x, y, loss

    def step(self):
        self.opt.zero_grad()
        out = self.model(self.x)
        loss = self.loss(out, self.y)
        loss.backward()
        self.opt.step()
        return loss


# The batch size each model is built with when make() is not given one.
DEFAULT_BATCH = {"mlp": 32, "cnn": 4, "resnet18": 2, "transformer": 4, "efficientnet": 2,
                 "transformer2": 4}


def make(name, seed=0, batch=None):
    """Builds model `name` with its optimizer and one batch of `batch` samples (default:
    DEFAULT_BATCH[name]; the default draws exactly the same tensors as before batch existed)."""
    if name not in DEFAULT_BATCH:
        raise ValueError(name)
    b = DEFAULT_BATCH[name] if batch is None else int(batch)
    if b < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    torch.manual_seed(seed)
    if name == "mlp":
        m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
        return Setup(name, m, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                     torch.randn(b, 64), torch.randint(0, 10, (b,)), F.cross_entropy)
    if name == "cnn":
        m = SmallCNN()
        return Setup(name, m, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=True),
                     torch.randn(b, 3, 16, 16), torch.randint(0, 10, (b,)), F.cross_entropy)
    if name == "resnet18":
        m = crucible_zoo.resnet18(num_classes=10)
        return Setup(name, m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9),
                     torch.randn(b, 3, 64, 64), torch.randint(0, 10, (b,)), F.cross_entropy)
    if name == "efficientnet":
        # EfficientNet-B0's blocks at a quarter of the width: in-place SiLU whose backward reads
        # the copy of its input autograd saved, squeeze-excitation, in-place dropout.
        m = crucible_zoo.efficientnet_b0(num_classes=10, width=0.25, dropout=0.2)
        return Setup(name, m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9),
                     torch.randn(b, 3, 32, 32), torch.randint(0, 10, (b,)), F.cross_entropy)
    if name in ("transformer", "transformer2"):
        m = SmallTransformer() if name == "transformer" else SmallTransformer2()
        tok = torch.randint(0, 50, (b, 12))
        return Setup(name, m, torch.optim.AdamW(m.parameters(), lr=1e-3),
                     tok, torch.randint(0, 50, (b, 12)),
                     lambda out, y: F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)))
    raise ValueError(name)


MODELS = ["mlp", "cnn", "resnet18", "transformer"]
# Recorded and compiled by the Vessel's tests beside MODELS (the graph, Forge and CLI tests and
# their golden plans keep to MODELS).
VESSEL_MODELS = MODELS + ["efficientnet"]

# The sanitizer preset the tests run under (test/CMakeLists.txt sets CRUCIBLE_TEST_SANITIZER), or
# "". Under ASan a step of the two large models costs 10-27 s in each test that compiles it, most
# of the preset's Python time: there they are recorded (test_vessel.py) and compiled through the
# cpu backend (test_replay.py) and skipped elsewhere, saying so. Under TSan their steps add ops,
# not threads: the small models check the recorder's and the pipeline's threads. The verify
# preset runs every one.
SANITIZER = os.environ.get("CRUCIBLE_TEST_SANITIZER", "")
UNDER_ASAN = SANITIZER == "asan-ubsan"
LARGE_MODELS = ("resnet18", "efficientnet")


def large_skipped_under(sanitizers, names, reason):
    """`names` as pytest parameters, the large models marked to skip under `sanitizers`."""
    import pytest
    return [pytest.param(n, marks=pytest.mark.skipif(SANITIZER in sanitizers and n in LARGE_MODELS,
                                                     reason=reason)) for n in names]


def large_skipped_under_asan(names):
    return large_skipped_under(("asan-ubsan",), names, "a large model under ASan runs in "
                               "test_vessel.py and test_replay.py; verify runs it here")


def large_skipped_under_tsan(names):
    return large_skipped_under(("tsan",), names, "a large model's steps add ops, not threads: the "
                               "other presets run it")


def record(s, steps):
    """Records `steps` training steps of setup `s` (modules tracked, batch marked as input) and
    returns the number of ops each step recorded."""
    import crucible_native as crucible
    crucible.track_modules(s.model)
    crucible.mark_inputs(s.x, s.y)
    counts, before = [], 0
    crucible.enable()
    try:
        for _ in range(steps):
            s.step()
            crucible.flush()
            total = crucible.stats()["total"]
            counts.append(total - before)
            before = total
    finally:
        crucible.disable()
    return counts
