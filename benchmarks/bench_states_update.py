"""Time per update and aten operator calls of the agents' updates from states, at the main job's size and URLB's.

Rows (one thread, CPU, replay sampling excluded; the U-maze's 4-d observations and 2-d actions):
- Proto-RL pre-training with the working variant (the main job's agent: `anti_collapse=center`,
  `reward_before_enqueue=true`, `reward_space=raw`), downstream on the frozen representation ("frozen"), and
- the SAC-only update of Random pre-training (DrQ's critic-through-encoder rule on reward 0),
each at batch 32 / SAC hidden 256 (the main job) and at URLB's states setting, batch 1024 / hidden 1024.
"ops" counts the aten operator calls of one update (nested calls included), "syncs" the ones that wait for the
device on an accelerator (`.item()`, data-dependent shapes), both averaged over an even and an odd step.
"products ms" is the time the update spends inside its matrix products and distance matrices (timed one by one
as it runs them): at these sizes they run near the core's peak, so they bound what removing overhead can gain;
"Adam ms" likewise the time inside Adam's fused kernel (every optimiser step of the update).

Each row runs in a fresh process. `--vs CHECKOUT` times the same rows with another checkout's protorl too,
alternating which goes first in each round, and prints the same-run ratio (the best round of each):

    python benchmarks/bench_states_update.py                       # this checkout (about 2 minutes)
    git worktree add /tmp/before <commit>
    python benchmarks/bench_states_update.py --vs /tmp/before --rounds 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OBS_DIM, ACTION_DIM = 4, 2  # the U-maze from states: the point's position and velocity; its 2-d force
SIZES = ((32, 256), (1024, 1024))  # (batch, SAC hidden width): the main job; URLB from states
ROWS = (("proto", "pretrain"), ("proto", "frozen"), ("random", "pretrain"))
# aten operators that make an accelerator wait for its queue: a scalar read back, or an output whose shape
# depends on the data
PRODUCT_OPS = ("mm", "addmm", "bmm", "baddbmm", "_euclidean_dist", "_cdist_forward")
ADAM_OPS = ("_fused_adam_",)  # Adam's fused kernel: one call per optimiser step
SYNC_OPS = ("_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive",
            "repeat_interleave")


def _agent(agent: str, mode: str, batch: int, hidden: int):
    import torch

    from protorl.agents import ProtoAgent, RandomAgent
    from protorl.agents.proto.agent import ProtoConfig
    from protorl.config import AgentConfig

    if agent == "proto":
        cfg = ProtoConfig(batch_size=batch, hidden_dim=hidden, anti_collapse="center", reward_before_enqueue=True,
                          reward_space="raw")
        return ProtoAgent("states", (OBS_DIM,), (ACTION_DIM,), cfg, torch.device("cpu"), mode)
    cfg = AgentConfig(name="random", batch_size=batch, hidden_dim=hidden)
    return RandomAgent("states", (OBS_DIM,), (ACTION_DIM,), cfg, torch.device("cpu"), mode)


def _batches(batch: int, count: int, seed: int = 0) -> list:
    """`count` replay batches of random 4-d states, sampled before anything is timed."""
    import numpy as np

    from protorl.replay import ReplayBuffer

    rng = np.random.default_rng(seed)
    replay = ReplayBuffer((OBS_DIM,), np.float32, (ACTION_DIM,), capacity=20_000, frame_stack=1, seed=seed)
    for _ in range(10):
        replay.add_first(rng.normal(size=OBS_DIM).astype(np.float32))
        for _ in range(1000):
            replay.add(rng.normal(size=OBS_DIM).astype(np.float32), rng.uniform(-1, 1, ACTION_DIM),
                       float(rng.uniform()), 1.0)
    return [replay.sample(batch) for _ in range(count)]


def _count_ops(update, steps: tuple[int, ...]) -> dict[str, float]:
    """Per call of `update(step)`, averaged over `steps`: aten operator calls, host synchronisations and the
    seconds spent inside matrix products and inside Adam's kernel."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counts = {"ops": 0, "syncs": 0, "products_s": 0.0, "adam_s": 0.0}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            counts["ops"] += 1
            counts["syncs"] += name in SYNC_OPS
            start = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            if name in PRODUCT_OPS:
                counts["products_s"] += time.perf_counter() - start
            elif name in ADAM_OPS:
                counts["adam_s"] += time.perf_counter() - start
            return out

    with Count():
        for step in steps:
            update(step)
    return {key: value / len(steps) for key, value in counts.items()}


def _worker(agent_name: str, mode: str, batch: int, hidden: int) -> dict:
    """In a fresh process: seconds per update (best of 5 blocks, after a warm-up), ops and syncs per update."""
    import torch

    import protorl
    from protorl.runtime import tune_malloc

    torch.set_num_threads(1)
    tune_malloc()
    torch.manual_seed(0)
    agent = _agent(agent_name, mode, batch, hidden)
    steps_per_block = 100 if batch <= 32 else 10
    batches = _batches(batch, 16)
    step = 0

    def update(i: int) -> None:
        agent.update(batches[i % len(batches)], i)

    for step in range(20):  # warm-up: the queue fills, the optimisers allocate their state
        update(step)
    blocks = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(steps_per_block):
            step += 1
            update(step)
        blocks.append((time.perf_counter() - start) / steps_per_block)
    counted = [_count_ops(update, (step + 2 * i + 1, step + 2 * i + 2)) for i in range(5)]
    return {"seconds_per_update": min(blocks), "ops": counted[0]["ops"], "syncs": counted[0]["syncs"],
            "products_s": min(c["products_s"] for c in counted), "adam_s": min(c["adam_s"] for c in counted),
            "protorl": protorl.__file__}


def _run_worker(*args, checkout: Path) -> dict:
    """`_worker(*args)` in a fresh process importing `checkout`'s protorl (checked), started outside any checkout:
    a working directory inside one would shadow PYTHONPATH."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["PYTHONPATH"] = str(checkout)
    with tempfile.TemporaryDirectory() as outside:
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", *map(str, args)],
                             capture_output=True, text=True, env=env, check=True, cwd=outside)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not Path(result["protorl"]).resolve().is_relative_to(checkout.resolve()):
        raise RuntimeError(f"imported {result['protorl']}, not the checkout {checkout}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vs", type=Path, help="another checkout to time in the same run (git worktree add)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds per row; each alternates the order")
    parser.add_argument("--quick", action="store_true", help="batch 32 / hidden 256 only")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        agent_name, mode, batch, hidden = args.worker
        print(json.dumps(_worker(agent_name, mode, int(batch), int(hidden))))
        return

    import torch

    checkouts = {"this": ROOT} if args.vs is None else {"before": args.vs.resolve(), "this": ROOT}
    sizes = SIZES[:1] if args.quick else SIZES
    print(f"torch {torch.__version__}, 1 thread, CPU; {OBS_DIM}-d states, {ACTION_DIM}-d actions; "
          f"best of {args.rounds} round(s); " + "; ".join(f"{name}: {path}" for name, path in checkouts.items()))
    header = "| agent | update | batch | hidden | " + " | ".join(
        f"{name} ms | {name} ops | {name} syncs | {name} products ms | {name} Adam ms" for name in checkouts)
    header += " | before / this |" if args.vs is not None else " |"
    print(header)
    print("|---" * (4 + 5 * len(checkouts) + (args.vs is not None)) + "|")
    for batch, hidden in sizes:
        for agent_name, mode in ROWS:
            results: dict[str, list[dict]] = {name: [] for name in checkouts}
            for round_ in range(args.rounds):
                order = list(checkouts) if round_ % 2 == 0 else list(reversed(checkouts))
                for name in order:
                    results[name].append(_run_worker(agent_name, mode, batch, hidden, checkout=checkouts[name]))
            best = {name: min(rows, key=lambda r: r["seconds_per_update"]) for name, rows in results.items()}
            cells = " | ".join(f"{best[n]['seconds_per_update'] * 1e3:.2f} | {best[n]['ops']:.0f} | "
                               f"{best[n]['syncs']:.1f} | {best[n]['products_s'] * 1e3:.2f} | "
                               f"{best[n]['adam_s'] * 1e3:.2f}" for n in checkouts)
            line = f"| {agent_name} | {mode} | {batch} | {hidden} | {cells}"
            if args.vs is not None:
                line += f" | {best['before']['seconds_per_update'] / best['this']['seconds_per_update']:.2f}x"
            print(line + " |", flush=True)


if __name__ == "__main__":
    main()
