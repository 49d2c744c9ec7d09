#!/usr/bin/env python3
"""train.py — trains StripNet (about 132k parameters) briefly on synthetic strips and saves it.

StripNet reads a 44x100 single-channel strip holding four digits (0-9) side by side, plus an
8-value pose/condition vector, and classifies each digit with one head per position. The data is
synthetic and deterministic: each digit is a fixed random 44x25 template, placed in its quarter
of the strip with a shift and a contrast that the pose vector describes, plus noise.

Writes (into --out):
  strip_cnn.pt   torch.save(model.state_dict())           -- what the C++ program loads
  heldout.pt     {'image', 'pose', 'labels', 'logits'}     -- a held-out set and PyTorch's
                                                               eval-mode logits on it
Run with the interpreter that has torch (the project venv: .venv/bin/python).
"""
import argparse
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

H, W, DIGITS, CLASSES, POSE = 44, 100, 4, 10, 8


class StripNet(nn.Module):
    def __init__(self, hidden=192):
        super().__init__()
        self.trunk = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.AdaptiveAvgPool2d((2, 4)))
        self.fc = nn.Linear(64 * 2 * 4 + POSE, hidden)
        self.heads = nn.ModuleList(nn.Linear(hidden, CLASSES) for _ in range(DIGITS))

    def forward(self, image, pose):
        f = torch.flatten(self.trunk(image), 1)
        h = F.relu(self.fc(torch.cat([f, pose], 1)))
        return torch.stack([head(h) for head in self.heads], 1)  # [n, DIGITS, CLASSES]


def make_data(n, gen, templates):
    labels = torch.randint(0, CLASSES, (n, DIGITS), generator=gen)
    pose = torch.rand(n, POSE, generator=gen) * 2 - 1
    image = torch.zeros(n, 1, H, W)
    for j in range(DIGITS):
        t = templates[labels[:, j]]                         # [n, 44, 25]
        contrast = 1.0 + 0.5 * pose[:, j].view(n, 1, 1)     # pose[j] scales digit j
        shift = (pose[:, 4 + j] * 2).round().long()         # pose[4+j] shifts it by -2..2 px
        for s in range(-2, 3):
            m = shift == s
            if m.any():
                image[m, 0, :, 25 * j:25 * j + 25] = torch.roll(t[m] * contrast[m], s, dims=2)
    image += 0.3 * torch.randn(image.shape, generator=gen)
    return image, pose, labels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--heldout", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    templates = F.avg_pool2d(torch.randn(CLASSES, 1, H, 25, generator=gen), 3, 1, 1)[:, 0] * 3

    model = StripNet()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    t0 = time.time()
    model.train()
    for step in range(args.steps):
        image, pose, labels = make_data(64, gen, templates)
        # Label smoothing keeps logits moderate (|logit| < ~10), as a deployed classifier wants.
        loss = F.cross_entropy(model(image, pose).reshape(-1, CLASSES), labels.reshape(-1),
                               label_smoothing=0.1)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    image, pose, labels = make_data(args.heldout, gen, templates)
    with torch.no_grad():
        logits = model(image, pose)
    acc = (logits.argmax(-1) == labels).float().mean().item()
    torch.save(model.state_dict(), os.path.join(args.out, "strip_cnn.pt"))
    torch.save({"image": image, "pose": pose, "labels": labels, "logits": logits},
               os.path.join(args.out, "heldout.pt"))
    print(f"StripNet: {params} parameters, {args.steps} steps in {time.time() - t0:.1f} s, "
          f"final loss {loss.item():.4f}, held-out digit accuracy {acc * 100:.2f}% "
          f"({args.heldout} strips) -> {args.out}")


if __name__ == "__main__":
    main()
