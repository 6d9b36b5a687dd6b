"""Does the prototype representation stay alive? Every `agent.anti_collapse` variant on identical frames.

Collects random-policy pixel frames once, then runs protorl's own pre-training update (`ProtoAgent.update`,
L_SSL + SAC on the k-NN reward) for each variant x batch size x seed, every variant drawing the same batches
(the replay's sampling seed is the run's seed). Every `--log-every` updates it records, on held-out frames
that no update sees, the four collapse diagnostics (`protorl.agents.diagnostics`) of the projections as acting uses
them (running statistics), and from training the Sinkhorn target entropy and the mean k-NN reward.
Prints one markdown table (median and range over seeds at the last update) and writes every row to --out.

    python benchmarks/compare_anti_collapse.py                          # U-maze, batch 32 and 512, 3 seeds
    python benchmarks/compare_anti_collapse.py --batches 32 --updates 50 --seeds 1   # a quick look
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time

import numpy as np
import torch

from protorl.agents import ProtoAgent
from protorl.agents.diagnostics import projection_diagnostics
from protorl.agents.proto.agent import ProtoConfig
from protorl.agents.proto.math import ANTI_COLLAPSE
from protorl.envs import DMCEnv
from protorl.replay import ReplayBuffer
from protorl.runtime import resolve_device

# the reward settings each variant is run with: the paper's order for none, the sound ones otherwise
REWARD = {"none": dict(reward_before_enqueue=False, reward_space="sphere"),
          "center": dict(reward_before_enqueue=True, reward_space="raw"),
          "batchnorm": dict(reward_before_enqueue=True, reward_space="raw")}
assert set(REWARD) == set(ANTI_COLLAPSE)


def collect(task: str, frames: int, seed: int) -> tuple[ReplayBuffer, torch.Tensor]:
    """`frames` env frames of a uniform-random policy in a replay buffer, and 256 held-out stacked observations."""
    env = DMCEnv(task, obs="pixels", seed=seed)
    rng = np.random.default_rng(seed)
    agent_steps = frames // env.action_repeat
    replay = ReplayBuffer(env.frame_shape, env.frame_dtype, env.action_shape, agent_steps + 1000, env.frame_stack)
    held_out: list[np.ndarray] = []
    time_step = env.reset()
    replay.add_first(time_step.frame)
    for step in range(agent_steps + 256 * 4):
        action = rng.uniform(-1, 1, env.action_shape).astype(np.float32)
        time_step = env.step(action)
        if step < agent_steps:
            replay.add(time_step.frame, action, time_step.reward, time_step.discount)
        elif step % 4 == 0:  # every 4th frame of a separate stretch of episodes, as the reward sees x_{t+1}
            held_out.append(time_step.obs)
        if time_step.last:
            time_step = env.reset()
            if step < agent_steps:
                replay.add_first(time_step.frame)
    return replay, torch.from_numpy(np.stack(held_out[:256]))


@torch.no_grad()
def held_out_diagnostics(agent: ProtoAgent, obs: torch.Tensor) -> dict[str, float]:
    """The four `repr/*` of held-out observations (N, C, H, W), projected as when acting (running statistics)."""
    agent.head.eval()
    linear = agent.head.projector.linear(agent.encoder(obs.to(agent.device)))  # (N, D)
    used = agent.head.projector.anti_collapse_step(linear)  # (N, D)
    agent.head.train()
    return projection_diagnostics(linear, used, agent.head.prototypes)


def run(variant: str, batch: int, seed: int, replay: ReplayBuffer, held_out: torch.Tensor, updates: int,
        log_every: int, device: torch.device) -> list[dict]:
    torch.manual_seed(seed)
    replay._rng = np.random.default_rng(seed)  # the same batches for every variant
    cfg = dataclasses.replace(ProtoConfig(), batch_size=batch, anti_collapse=variant, **REWARD[variant])
    agent = ProtoAgent("pixels", tuple(held_out.shape[1:]), replay.actions.shape[1:], cfg, device)
    rows, window = [], []
    start = time.perf_counter()
    for update in range(updates + 1):
        window.append(agent.update(replay.sample(batch, device), update))
        if update % log_every == 0:
            mean = {key: float(np.mean([m[key] for m in window if key in m])) for key in
                    ("repr_loss", "repr/target_entropy", "intr_reward_mean")}
            rows.append(dict(variant=variant, batch=batch, seed=seed, update=update, **mean,
                             **held_out_diagnostics(agent, held_out), seconds=time.perf_counter() - start))
            window = []
    return rows


def table(rows: list[dict], num_prototypes: int) -> str:
    """Median [min, max] over seeds at each (variant, batch)'s last update."""
    columns = ("repr_loss", "repr/target_entropy", "repr/distinct_prototypes", "repr/projection_spread",
               "repr/shared_direction", "intr_reward_mean")
    last = max(row["update"] for row in rows)
    lines = [f"| variant | batch | {' | '.join(columns)} |", "|---|---|" + "---|" * len(columns)]
    for variant in ANTI_COLLAPSE:
        for batch in sorted({row["batch"] for row in rows}):
            final = [row for row in rows
                     if row["variant"] == variant and row["batch"] == batch and row["update"] == last]
            if not final:
                continue
            cells = []
            for column in columns:
                values = np.array([row[column] for row in final])
                cells.append(f"{np.median(values):.4g} [{values.min():.3g}, {values.max():.3g}]")
            lines.append(f"| {variant} | {batch} | {' | '.join(cells)} |")
    return f"After {last} updates (log M = {math.log(num_prototypes):.3f}; held-out frames except the loss, " \
           "the target entropy and the reward):\n\n" + "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="point_mass_maze_explore")
    parser.add_argument("--frames", type=int, default=20_000, help="env frames of random-policy data")
    parser.add_argument("--variants", nargs="+", default=list(ANTI_COLLAPSE), choices=ANTI_COLLAPSE)
    parser.add_argument("--batches", nargs="+", type=int, default=[32, 512])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default="anti_collapse.json")
    args = parser.parse_args()
    device = resolve_device(args.device)
    os.environ.setdefault("MUJOCO_GL", "egl")
    replay, held_out = collect(args.task, args.frames, seed=0)
    rows: list[dict] = []
    for batch in args.batches:
        for variant in args.variants:
            for seed in args.seeds:
                rows += run(variant, batch, seed, replay, held_out, args.updates, args.log_every, device)
                last = rows[-1]
                print(f"{variant:9s} B={batch:4d} seed {seed}: distinct {last['repr/distinct_prototypes']:.0f}, "
                      f"spread {last['repr/projection_spread']:.3f}, shared {last['repr/shared_direction']:.5f}, "
                      f"target entropy {last['repr/target_entropy']:.3f}, reward {last['intr_reward_mean']:.4g} "
                      f"({last['seconds']:.0f} s)", flush=True)
    with open(args.out, "w") as f:
        json.dump(dict(args=vars(args), device=str(device), rows=rows), f)
    print(table(rows, ProtoConfig().num_prototypes))


if __name__ == "__main__":
    main()
