"""This checkout's agent updates against another checkout's, alternating in fresh processes: the same-run ratio.

Each measurement is `bench_update.py`'s worker (its pixel Proto-RL agent and replay, 8 updates at batch 512 and
20 at 32 after 2 warm-up ones) in a new process that imports protorl from the checkout named and checks that it
did. Rounds alternate which checkout goes first, so a drift in the machine's speed hits both; each row reports
the best round.

    git worktree add /tmp/old <commit>
    python benchmarks/paired_update.py /tmp/old --rounds 4
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench_update import _run_worker

ROOT = Path(__file__).resolve().parent.parent
ROWS = ((512, "pretrain"), (512, "finetune"), (32, "pretrain"), (32, "finetune"))


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
                result = _run_worker("protorl-speed", batch, phase, 8 if batch == 512 else 20,
                                     checkout=checkouts[name])
                seconds.setdefault((batch, phase, name), []).append(result["seconds_per_update"])
    print(f"this: {ROOT}; other: {args.other}; best of {args.rounds} rounds, s/update")
    print("| update | batch | other | this | other / this |")
    print("|---|---|---|---|---|")
    for batch, phase in ROWS:
        other, this = min(seconds[(batch, phase, "other")]), min(seconds[(batch, phase, "this")])
        print(f"| {phase} | {batch} | {other:.4f} | {this:.4f} | {other / this:.3f} |", flush=True)


if __name__ == "__main__":
    main()
