"""Eager against compiled (`runtime.compile_update`) agent updates from states, paired in one run.

Rows: Proto-RL pre-training with the working variant (the main job's agent), Proto-RL downstream on the frozen
representation, and Random's pre-training update (DrQ's critic-through-encoder rule), at batch 32 / SAC hidden 256
(the main job) and batch 1024 / hidden 1024 (URLB's states setting); the U-maze's 4-d observations and 2-d
actions, replay sampling excluded. Each row runs in a fresh process per variant, alternating which goes first;
the compiled row also reports its compile time (every graph of the update, the first updates after the queue
fills). On CUDA the compiled update is replayed as a CUDA graph.

    python benchmarks/bench_compiled_update.py                   # CPU, one thread (a few minutes: compiling)
    python benchmarks/bench_compiled_update.py --device cuda     # a GPU
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

OBS_DIM, ACTION_DIM = 4, 2
SIZES = ((32, 256), (1024, 1024))
ROWS = (("proto", "pretrain"), ("proto", "frozen"), ("random", "pretrain"))


def _worker(agent_name: str, mode: str, batch: int, hidden: int, compiled: bool, device: str, updates: int) -> dict:
    import torch

    from protorl.agents import ProtoAgent, RandomAgent
    from protorl.agents.proto.agent import ProtoConfig
    from protorl.config import AgentConfig
    from protorl.replay import Batch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dev = torch.device(device)
    if agent_name == "proto":
        cfg = ProtoConfig(batch_size=batch, hidden_dim=hidden, anti_collapse="center", reward_before_enqueue=True,
                          reward_space="raw")
        agent = ProtoAgent("states", (OBS_DIM,), (ACTION_DIM,), cfg, dev, mode)
    else:
        agent = RandomAgent("states", (OBS_DIM,), (ACTION_DIM,), AgentConfig(name="random", batch_size=batch,
                                                                             hidden_dim=hidden), dev, mode)
    if compiled:
        agent.compile_update(cuda_graphs=dev.type == "cuda")
    data = [Batch(obs=torch.randn(batch, OBS_DIM, device=dev), action=torch.rand(batch, ACTION_DIM, device=dev),
                  reward=torch.rand(batch, 1, device=dev), discount=torch.ones(batch, 1, device=dev),
                  next_obs=torch.randn(batch, OBS_DIM, device=dev)) for _ in range(8)]

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    start = time.perf_counter()
    for step in range(24):  # warm-up: the queue fills, the projector settles, every graph compiles
        agent.update(data[step % 8], step)
    sync()
    warmup_s = time.perf_counter() - start
    start = time.perf_counter()
    for step in range(24, 24 + updates):
        agent.update(data[step % 8], step)
    sync()
    return {"ms": (time.perf_counter() - start) / updates * 1e3, "warmup_s": warmup_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--updates", type=int, default=200, help="timed updates per row (even)")
    parser.add_argument("--quick", action="store_true", help="batch 32 / hidden 256 only")
    args = parser.parse_args()
    print(f"{'agent':8} {'mode':9} {'batch':>5} {'hidden':>6} {'eager ms':>9} {'compiled ms':>11} {'speed-up':>8} "
          f"{'compile s':>9}")
    for batch, hidden in SIZES[:1] if args.quick else SIZES:
        for agent, mode in ROWS:
            times = {}
            for compiled in ((False, True) if (batch + hidden) % 2 == 0 else (True, False)):
                code = (f"import json; from benchmarks.bench_compiled_update import _worker; print(json.dumps("
                        f"_worker({agent!r}, {mode!r}, {batch}, {hidden}, {compiled}, {args.device!r}, "
                        f"{args.updates})))")
                out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
                times[compiled] = json.loads(out.stdout.strip().splitlines()[-1])
            eager, fast = times[False], times[True]
            print(f"{agent:8} {mode:9} {batch:5d} {hidden:6d} {eager['ms']:9.2f} {fast['ms']:11.2f} "
                  f"{eager['ms'] / fast['ms']:7.2f}x {fast['warmup_s'] - eager['warmup_s']:9.1f}", flush=True)


if __name__ == "__main__":
    main()
