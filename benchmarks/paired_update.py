"""This checkout's agent updates against another checkout's, alternating in fresh processes: the same-run ratio.

Each measurement builds the pixel Proto-RL agent of `bench_update.py` in a new process, imports protorl from
the checkout named, checks that it did, and reports the best of 2 rounds of updates (4 at batch 512, 20 at 32).
Rounds alternate which checkout goes first, so a drift in the machine's speed hits both.

    git worktree add /tmp/old <commit>
    python benchmarks/paired_update.py /tmp/old --rounds 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROWS = ((512, "pretrain"), (512, "finetune"), (32, "pretrain"), (32, "finetune"))
WORKER = """
import json, sys, time
import torch
sys.path.insert(0, sys.argv[3])  # bench_update.py of this checkout, for its agent and replay set-up
from bench_update import _build
import protorl
from protorl.utils import tune_malloc

tune_malloc()
batch, phase = int(sys.argv[1]), sys.argv[2]
agent, replay = _build(batch, phase)
for step in range(2):
    agent.update(replay.sample(batch), step)
updates, best = (4 if batch == 512 else 20), float("inf")
for _ in range(2):
    start = time.perf_counter()
    for step in range(2, 2 + updates):
        agent.update(replay.sample(batch), step)
    best = min(best, (time.perf_counter() - start) / updates)
print(json.dumps({"protorl": protorl.__file__, "seconds_per_update": best}))
"""


def measure(checkout: Path, batch: int, phase: str) -> float:
    """Seconds per update of `checkout`'s protorl, in a fresh process started outside any checkout (a working
    directory inside one would shadow PYTHONPATH)."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    with tempfile.TemporaryDirectory() as cwd:
        out = subprocess.run([sys.executable, "-c", WORKER, str(batch), phase, str(ROOT / "benchmarks")],
                             env=env, cwd=cwd, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not Path(result["protorl"]).resolve().is_relative_to(checkout.resolve()):
        raise RuntimeError(f"imported {result['protorl']}, not the checkout {checkout}")
    return result["seconds_per_update"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("other", type=Path, help="a checkout of the code to compare against (git worktree add)")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    checkouts = {"this": ROOT, "other": args.other}
    seconds: dict[tuple, list[float]] = {}
    for round_ in range(args.rounds):
        order = ("other", "this") if round_ % 2 == 0 else ("this", "other")
        for batch, phase in ROWS:
            for name in order:
                seconds.setdefault((batch, phase, name), []).append(measure(checkouts[name], batch, phase))
    print(f"this: {ROOT}; other: {args.other}; best of {args.rounds} rounds, s/update")
    print("| update | batch | other | this | other / this |")
    print("|---|---|---|---|---|")
    for batch, phase in ROWS:
        other, this = min(seconds[(batch, phase, "other")]), min(seconds[(batch, phase, "this")])
        print(f"| {phase} | {batch} | {other:.4f} | {this:.4f} | {other / this:.3f} |", flush=True)


if __name__ == "__main__":
    main()
