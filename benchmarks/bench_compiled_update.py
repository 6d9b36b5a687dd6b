"""Eager against compiled (`runtime.compile_update`) agent updates, paired in one run.

Rows from states (the default): Proto-RL pre-training with the working variant (the main job's agent), Proto-RL
downstream on the frozen representation, and Random's pre-training update (DrQ's critic-through-encoder rule), at
batch 32 / SAC hidden 256 (the main job) and batch 1024 / hidden 1024 (URLB's states setting); the U-maze's 4-d
observations and 2-d actions, replay sampling excluded. With `--obs pixels`: the paper's Proto-RL from 84x84 pixels
(hidden 1024, 6-d actions) at batch 32 and 512, pre-training and frozen. Each row runs in a fresh process with an
empty compile cache, which builds an eager and a compiled agent and times them in alternating blocks (the best block
of each); "compile s" is what compiling every graph of the update added to the compiled agent's warm-up. On CUDA the
compiled update is replayed as a CUDA graph.

    python benchmarks/bench_compiled_update.py                   # CPU, one thread (a few minutes: compiling)
    python benchmarks/bench_compiled_update.py --device cuda     # a GPU
    python benchmarks/bench_compiled_update.py --obs pixels --device cuda --updates 100   # the pixel update
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

OBS_DIM, ACTION_DIM = 4, 2
SIZES = ((32, 256), (1024, 1024))
WARMUP = 16  # updates before timing
ROWS = (("proto", "pretrain"), ("proto", "frozen"), ("random", "pretrain"))
# --obs pixels: the paper's Proto-RL from 84x84 pixels (walker: 6-d actions), hidden 1024, batch 32 and 512
PIXEL_OBS, PIXEL_ACTION_DIM, PIXEL_BATCHES = (9, 84, 84), 6, (32, 512)


def _worker(agent_name: str, mode: str, batch: int, hidden: int, device: str, updates: int, rounds: int,
            obs: str = "states") -> dict:
    """In a fresh process with an empty compile cache: an eager and a compiled agent of the same row, timed in
    alternating blocks of `updates` updates, `rounds` each; the best block of each, and the compiled agent's extra
    time over its warm-up updates (compiling every graph)."""
    import torch

    from protorl.agents import ProtoAgent, RandomAgent
    from protorl.agents.proto.agent import ProtoConfig
    from protorl.config import AgentConfig
    from protorl.replay import Batch

    torch.set_num_threads(1)
    dev = torch.device(device)

    obs_shape, action_dim = ((OBS_DIM,), ACTION_DIM) if obs == "states" else (PIXEL_OBS, PIXEL_ACTION_DIM)

    def build(compiled: bool):
        torch.manual_seed(0)
        if agent_name == "proto" and obs == "pixels":  # the paper's Proto-RL from pixels
            agent = ProtoAgent("pixels", obs_shape, (action_dim,), ProtoConfig(batch_size=batch), dev, mode)
        elif agent_name == "proto":
            cfg = ProtoConfig(batch_size=batch, hidden_dim=hidden, anti_collapse="center", reward_before_enqueue=True,
                              reward_space="raw")
            agent = ProtoAgent("states", obs_shape, (action_dim,), cfg, dev, mode)
        else:
            agent = RandomAgent(obs, obs_shape, (action_dim,),
                                AgentConfig(name="random", batch_size=batch, hidden_dim=hidden), dev, mode)
        if compiled:
            agent.compile_update(cuda_graphs=dev.type == "cuda")
        return agent

    def observations() -> torch.Tensor:
        if obs == "states":
            return torch.randn(batch, *obs_shape, device=dev)
        return torch.randint(0, 256, (batch, *obs_shape), dtype=torch.uint8, device=dev)

    data = [Batch(obs=observations(), action=torch.rand(batch, action_dim, device=dev) * 2 - 1,
                  reward=torch.rand(batch, 1, device=dev), discount=torch.ones(batch, 1, device=dev),
                  next_obs=observations()) for _ in range(8)]

    def timed(agent, first: int, count: int) -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for step in range(first, first + count):
            agent.update(data[step % 8], step)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    agents = {False: build(False), True: build(True)}
    # warm-up: the queue fills (4 updates), the projector's momentum settles (10), every graph compiles
    warmup = {compiled: timed(agent, 0, WARMUP) for compiled, agent in agents.items()}
    best = {False: float("inf"), True: float("inf")}
    for round_ in range(rounds):
        for compiled in ((False, True) if round_ % 2 == 0 else (True, False)):
            best[compiled] = min(best[compiled], timed(agents[compiled], WARMUP + round_ * updates, updates) / updates)
    return {"eager_ms": best[False] * 1e3, "compiled_ms": best[True] * 1e3,
            "compile_s": warmup[True] - warmup[False]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--updates", type=int, default=200,
                        help="timed updates per row at batch 32 (even); a tenth of them at batch 1024")
    parser.add_argument("--rounds", type=int, default=5, help="alternating timed blocks of each variant")
    parser.add_argument("--quick", action="store_true", help="the batch-32 rows only")
    parser.add_argument("--obs", choices=("states", "pixels"), default="states")
    parser.add_argument("--pixel-batches", type=int, nargs="+", help="with --obs pixels: these batch sizes only")
    args = parser.parse_args()
    print(f"{'agent':8} {'mode':9} {'batch':>5} {'hidden':>6} {'eager ms':>9} {'compiled ms':>11} {'speed-up':>8} "
          f"{'compile s':>9}")
    if args.obs == "pixels":
        batches = PIXEL_BATCHES[:1] if args.quick else args.pixel_batches or PIXEL_BATCHES
        sizes, rows = [(batch, 1024) for batch in batches], ROWS[:2]
    else:
        sizes, rows = SIZES[:1] if args.quick else SIZES, ROWS
    for batch, hidden in sizes:
        updates = args.updates if (batch <= 32 and args.obs == "states") else max(4, args.updates // 10)
        for agent, mode in rows:
            code = (f"import json; from benchmarks.bench_compiled_update import _worker; print(json.dumps("
                    f"_worker({agent!r}, {mode!r}, {batch}, {hidden}, {args.device!r}, {updates}, {args.rounds}, "
                    f"{args.obs!r})))")
            with tempfile.TemporaryDirectory() as cache:  # a cold compile: nothing cached by an earlier run
                out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                     cwd=ROOT, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache})
            row = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{agent:8} {mode:9} {batch:5d} {hidden:6d} {row['eager_ms']:9.2f} {row['compiled_ms']:11.2f} "
                  f"{row['eager_ms'] / row['compiled_ms']:7.2f}x {row['compile_s']:9.1f}", flush=True)


if __name__ == "__main__":
    main()
