"""make_traces.py — records the four test models for the forge tests: <dir>/<model>_b<batch>.crtrace.

Each model (test/record/python/models.py: mlp, cnn, resnet18, transformer; SGD or AdamW) is
recorded for --steps training steps at its default batch, twice it and four times it, so the
forge tests can symbolize shapes over the batch (two sizes unify, the third checks the result).
The transformer is also recorded at sequence lengths 12 and 9 (its default batch):
<dir>/transformer_s<length>.crtrace, for `crucible plan --sizes-from` over a length.
Every recording runs in a fresh Python process: the recorder's module paths and storage ids
start from the same state, so the same program gives the same trace.

    CRUCIBLE_BUILD_DIR=build-release python3 test/forge/make_traces.py build-release/test/forge/traces

Writes <dir>/index.json ({"mlp": [32, 64, 128], ...}) last, after every trace is complete: the
tests take its presence to mean the directory is usable.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PATHS = [os.path.join(ROOT, "vessel", "torch"), os.path.join(ROOT, "test", "record", "python")]
MULTIPLES = (1, 2, 4)
LENGTHS = {"transformer": (12, 9)}   # sequence lengths recorded beside the batches

# Runs in the child process: argv = model, batch, steps, output path[, sequence length].
RECORD_ONE = """
import sys
import torch
import crucible_native as crucible
import models
name, batch, steps, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
s = models.make(name, batch=batch)
if len(sys.argv) > 5:   # tokens of another length
    g = torch.Generator().manual_seed(0)
    s.x = torch.randint(0, 50, (batch, int(sys.argv[5])), generator=g)
    s.y = torch.randint(0, 50, (batch, int(sys.argv[5])), generator=g)
counts = models.record(s, steps)
crucible.track_optimizer(s.opt)  # gradients and optimizer state exist only after step 1
st = crucible.export(path)
if st["dropped"]:
    sys.exit(f"{path}: {st['dropped']} ops dropped; the trace is incomplete")
print(name, batch, "ops per step", counts)
"""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="output directory (created)")
    ap.add_argument("--models", nargs="*", default=None, help="subset of models (default: all four)")
    ap.add_argument("--steps", type=int, default=4,
                    help="training steps per recording (>= 3: the first step differs, two steady)")
    args = ap.parse_args(argv)
    if args.steps < 3:
        ap.error("--steps must be >= 3 so that two steady iterations follow the first")

    sys.path[:0] = PATHS
    import models  # noqa: E402  (the model list and default batches; recording is in children)
    names = args.models or list(models.MODELS)
    unknown = [n for n in names if n not in models.DEFAULT_BATCH]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {models.MODELS}")

    os.makedirs(args.dir, exist_ok=True)
    index_path = os.path.join(args.dir, "index.json")
    if os.path.exists(index_path):
        os.remove(index_path)  # absent until every trace below is written
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(PATHS + [p for p in [env.get("PYTHONPATH")] if p])
    index = {}
    for name in names:
        batches = [models.DEFAULT_BATCH[name] * k for k in MULTIPLES]
        runs = [(f"{name}_b{b}.crtrace", b, []) for b in batches]
        runs += [(f"{name}_s{n}.crtrace", models.DEFAULT_BATCH[name], [str(n)]) for n in LENGTHS.get(name, ())]
        for file, b, extra in runs:
            path = os.path.join(args.dir, file)
            r = subprocess.run([sys.executable, "-c", RECORD_ONE, name, str(b), str(args.steps), path, *extra],
                               env=env, capture_output=True, text=True)
            if r.returncode != 0:
                sys.stderr.write(r.stdout + r.stderr)
                print(f"make_traces: recording {file} failed (exit {r.returncode}); "
                      "check that CRUCIBLE_BUILD_DIR names a build with the Vessel (_crucible_ext)",
                      file=sys.stderr)
                return 1
            print(r.stdout.strip())
        index[name] = batches
    with open(index_path + ".tmp", "w") as f:
        json.dump(index, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(index_path + ".tmp", index_path)
    print(f"make_traces: {sum(len(v) for v in index.values())} traces in {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
