"""Soak benchmark: many short episodes through the real training loop, printing resident memory.

Runs one `protorl.training.Trainer` (pre-training phase) at a tiny size for `--episodes` episodes and
samples the process's resident set size (VmRSS from /proc/self/status) at episode ends, through a
callback added to the Trainer's. The replay ring (`replay.capacity` 2000 frames, about 16
episodes of 126 frames) wraps early, so after the warm-up every allocation the loop needs exists
already: RSS should then stay flat. The summary gives RSS after the warm-up, at the end, and the
least-squares growth per 100 episodes over the post-warm-up samples.

    python benchmarks/soak.py                       # 80 pixel episodes (~8 minutes on 2 shared cores)
    python benchmarks/soak.py --episodes 200        # longer
    python benchmarks/soak.py --obs states          # 200 state-observation episodes (~4 minutes)

Pixel episodes cost ~6 s here (~11 ms of EGL rendering per frame plus 125 updates), state episodes
~1.1 s; the defaults keep either run under ~10 minutes. Keep `--threads 1` on a shared CPU: with 2
intra-op threads and another busy process, OpenMP spin-waiting made a 5-episode run ~7x slower.

A suite episode (point_mass included) is 1000 environment frames; at action repeat 8 that is 125 agent steps, each with
one agent update (batch 16). Checkpoints are off unless `--checkpoint-every-episodes` is given.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

EPISODE_FRAMES = 1000  # the suite's time limits, e.g. point_mass: 20 s at 0.02 s per control step


def rss_mb() -> float:
    """Resident set size of this process in MB (VmRSS, reported by the kernel in kB)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS line in /proc/self/status (not Linux?)")


def slope_per_100(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs, times 100 (MB per 100 episodes)."""
    n = len(xs)
    if n < 2:
        return float("nan")
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    return 100.0 * sxy / sxx if sxx > 0 else float("nan")


def build_config(args: argparse.Namespace, run_dir: Path):
    from protorl.agents.proto.agent import ProtoConfig
    from protorl.app.plan import configured

    steps_per_episode = -(-EPISODE_FRAMES // args.action_repeat)
    checkpoint_every = args.checkpoint_every_episodes * EPISODE_FRAMES if args.checkpoint_every_episodes else None
    return configured(None, {
        "task": args.env, "seed": args.seed, "pretrain_frames": args.episodes * steps_per_episode * args.action_repeat,
        "env": {"obs": args.obs, "image_size": 32, "action_repeat": args.action_repeat},
        "training": {"seed_transitions": 50}, "replay": {"capacity": args.replay_capacity},
        "evaluation": {"every_frames": 10**9, "episodes": 1}, "snapshots": {"at_frames": []},
        "checkpoints": {"every_frames": checkpoint_every},
        "logging": {"every_episodes": 1, "tensorboard": False, "progress_bar": False},
        "runtime": {"device": "cpu", "threads": args.threads}, "run_dir": str(run_dir),
        "agent": ProtoConfig(batch_size=16, hidden_dim=64, num_prototypes=32),
    })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=None,
                        help="episodes to run (default: 80 with pixels, 200 with states)")
    parser.add_argument("--obs", choices=("pixels", "states"), default="pixels")
    parser.add_argument("--env", default="point_mass_easy")
    parser.add_argument("--action-repeat", type=int, default=8)
    parser.add_argument("--replay-capacity", type=int, default=2000)
    parser.add_argument("--every", type=int, default=None,
                        help="sample RSS every N episodes (default: about 25 rows)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="episodes excluded from the slope (default: until the replay ring has wrapped, "
                             "plus 10%% of the episodes)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (tiny tensors: 1 is fastest)")
    parser.add_argument("--checkpoint-every-episodes", type=int, default=0,
                        help="also write training checkpoints every N episodes (0: never)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.episodes is None:
        args.episodes = 80 if args.obs == "pixels" else 200
    if args.episodes < 2:
        parser.error("--episodes must be at least 2")
    every = args.every or max(1, args.episodes // 25)

    from protorl.app.plan import validate
    from protorl.training import Trainer, phase_of, prepare_process
    from protorl.training.callbacks import Callback

    samples: list[tuple[int, int, float, int, bool]] = []  # (episode, frames, rss MB, gc objects, ring wrapped)
    start = time.time()

    class Sampler(Callback):
        def __init__(self, trainer: Trainer):
            self.trainer = trainer

        def on_episode_end(self, frames: int) -> None:
            episode, replay = self.trainer.result.episodes, self.trainer.replay
            if episode % every == 0 or episode in (1, args.episodes):
                wrapped = replay.num_written >= replay.capacity
                samples.append((episode, frames, rss_mb(), len(gc.get_objects()), wrapped))
                print(f"{episode:>8} {frames:>10} {samples[-1][2]:>9.1f} {samples[-1][3]:>11} "
                      f"{'yes' if wrapped else 'no':>8} {time.time() - start:>8.0f}", flush=True)

    with tempfile.TemporaryDirectory(prefix="protorl_soak_") as tmp:
        cfg = build_config(args, Path(tmp))
        validate(cfg, "pretrain")
        prepare_process(cfg.runtime)
        print(f"soak: {args.episodes} episodes of {args.env} ({args.obs}, {cfg.env.image_size}px, action repeat "
              f"{cfg.env.action_repeat}), batch {cfg.agent.batch_size}, replay capacity {cfg.replay.capacity}, "
              f"{args.threads} thread(s), fast_malloc={cfg.runtime.fast_malloc}; python {sys.version.split()[0]}")
        rss_start = rss_mb()
        trainer = Trainer(cfg, phase_of(cfg, "pretrain", cfg.task), Path(tmp) / "pretrain")
        trainer.callbacks.append(Sampler(trainer))
        print(f"RSS before the trainer: {rss_start:.1f} MB, after building it: {rss_mb():.1f} MB")
        print(f"{'episode':>8} {'frames':>10} {'RSS MB':>9} {'gc objects':>11} {'wrapped':>8} {'time s':>8}")
        result = trainer.run()
        wall = time.time() - start
        rss_final = rss_mb()

    if result.episodes != args.episodes:
        print(f"warning: ran {result.episodes} episodes, expected {args.episodes}")
    wrap_episode = next((e for e, *_, wrapped in samples if wrapped), None)
    warmup = args.warmup
    if warmup is None:
        warmup = (wrap_episode or args.episodes) + args.episodes // 10
    post = [(e, r, g) for e, _, r, g, _ in samples if e >= warmup]
    print()
    print(f"episodes {result.episodes}, frames {result.frames}, wall time {wall:.0f} s "
          f"({result.frames / wall:.0f} frames/s)")
    print(f"replay ring wrapped by episode {wrap_episode}; warm-up: episodes < {warmup}")
    if len(post) < 2:
        print("too few post-warm-up samples for a slope: raise --episodes or lower --warmup/--every")
        return
    xs, ys = [float(e) for e, _, _ in post], [r for _, r, _ in post]
    print(f"RSS after warm-up (episode {post[0][0]}): {post[0][1]:.1f} MB")
    print(f"RSS at the end (episode {post[-1][0]}): {post[-1][1]:.1f} MB "
          f"(after run() returned: {rss_final:.1f} MB)")
    print(f"RSS min/max after warm-up: {min(ys):.1f} / {max(ys):.1f} MB")
    print(f"growth: {slope_per_100(xs, ys):+.2f} MB per 100 episodes (least squares over {len(post)} samples)")
    print(f"gc-tracked objects: {post[0][2]} -> {post[-1][2]} "
          f"({slope_per_100(xs, [float(g) for _, _, g in post]):+.0f} per 100 episodes)")


if __name__ == "__main__":
    main()
