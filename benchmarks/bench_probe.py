"""Time of the state probe's ridge regression (`protorl.exploration.probe.ridge_r2`) on features the size of the pixel
encoder's output (32 x 35 x 35 = 39,200 per frame), for several frame counts: the cost of one row of
`protorl-probe` and of each in-run probe, without the frames' collection and the encoder's forward passes.

Each size runs in a fresh process, on one thread unless `--threads` says otherwise (on a CPU busy with other
jobs, compare `--threads 1` with `--threads 2`: the multi-threaded eigendecomposition waits on its own threads).
`--vs CHECKOUT` times the same sizes with another checkout's protorl too, alternating which goes first in each
round, and prints the same-run ratio (the best round of each):

    python benchmarks/bench_probe.py                               # this checkout
    git worktree add /tmp/before <commit>
    python benchmarks/bench_probe.py --vs /tmp/before --frames 1000 2000 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FEATURES = 32 * 35 * 35  # the pixel encoder's output at 84 x 84 (appendix, architecture)
STATE_DIM = 4  # the U-maze's x, y and velocity

CHILD = """
import json, sys, time
import numpy as np, torch
frames, features, state_dim, threads = (int(a) for a in sys.argv[1:5])
torch.set_num_threads(threads)
from protorl.exploration.probe import ridge_r2
rng = np.random.default_rng(0)
states = rng.normal(size=(frames, state_dim))
x = np.maximum(states @ rng.normal(size=(state_dim, features)) + rng.normal(size=(frames, features)), 0)
start = time.perf_counter()
ridge_r2(x.astype(np.float32), states)
print(json.dumps({"seconds": time.perf_counter() - start}))
"""


def time_once(checkout: Path, frames: int, features: int, threads: int = 1) -> float:
    """Seconds of one `ridge_r2` call on (frames, features) with `threads` threads, in a fresh process importing
    `checkout`'s protorl."""
    output = subprocess.run([sys.executable, "-c", CHILD, str(frames), str(features), str(STATE_DIM), str(threads)],
                            capture_output=True, text=True, check=True, cwd=checkout,
                            env={**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": str(threads)})
    return json.loads(output.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, nargs="+", default=[1000, 2000, 4000])
    parser.add_argument("--features", type=int, default=FEATURES)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--vs", type=Path, help="another checkout to time the same sizes with")
    args = parser.parse_args()
    checkouts = [ROOT] + ([args.vs.resolve()] if args.vs else [])
    print(f"ridge_r2 on (frames, {args.features}) features, {STATE_DIM} targets, {args.threads} thread(s); best of "
          f"{args.rounds} round(s), seconds")
    print(f"{'frames':>7}  " + "  ".join(f"{str(c):>24}" for c in checkouts) + ("  ratio" if args.vs else ""))
    for frames in args.frames:
        best = {c: float("inf") for c in checkouts}
        for round_ in range(args.rounds):
            for checkout in checkouts[::-1] if round_ % 2 else checkouts:
                best[checkout] = min(best[checkout], time_once(checkout, frames, args.features, args.threads))
        ratio = f"  {best[checkouts[1]] / best[ROOT]:5.2f}x" if args.vs else ""
        print(f"{frames:>7}  " + "  ".join(f"{best[c]:24.2f}" for c in checkouts) + ratio, flush=True)


if __name__ == "__main__":
    main()
