"""Environment frames per second of real training runs at the paper's settings, and the projected paper run.

Runs protorl's training loop (rendering, replay, updates, logs) from pixels with the paper's networks and batch 512:
a pre-training, then a fine-tuning from its snapshot, each for `--frames` frames after its seed transitions, and
times the frames after seeding. An evaluation episode is timed apart (the paper evaluates 10 episodes every 10k
frames downstream). The projection of a 500k + 500k run is the sum of those rates over the paper's frames.

    python benchmarks/bench_end_to_end.py                     # about 10 minutes on 2 CPU cores
    python benchmarks/bench_end_to_end.py --frames 2000       # longer, steadier
    python benchmarks/bench_end_to_end.py --device cuda --compile --tf32 --warmup 400   # a GPU: compiled update,
                                                      # CUDA graphs, the first 400 frames (compiling) left out
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from protorl.config import (
    AnalysesConfig,
    CheckpointsConfig,
    Config,
    EvaluationConfig,
    LoggingConfig,
    RuntimeConfig,
    SnapshotsConfig,
    TrainingConfig,
)
from protorl.runtime import prepare_process
from protorl.training.callbacks import Callback

PAPER_FRAMES = 500_000  # per phase
PAPER_EVAL = (10_000, 10)  # downstream: every 10k frames, 10 episodes (the paper's defaults in Config)


class Stopwatch(Callback):
    """The wall time from `start_frames` (the seed transitions and any warm-up after them) to the phase's end."""

    def __init__(self, start_frames: int):
        self.start_frames, self.start, self.end, self.frames = start_frames, None, None, 0

    def before_step(self, frames: int) -> None:
        if frames == self.start_frames:
            self.start = time.perf_counter()

    def on_phase_end(self, frames: int) -> None:
        self.end, self.frames = time.perf_counter(), frames - self.start_frames

    @property
    def fps(self) -> float:
        return self.frames / (self.end - self.start)


def timed_phase(cfg: Config, phase: str, out_dir: Path, warmup: int, pretrained: dict | None = None) -> float:
    """Frames per second of `phase` after its seed transitions and `warmup` more frames."""
    from protorl.training import Trainer, phase_of

    mode = "pretrain" if phase == "pretrain" else "frozen" if pretrained is not None else "online"
    trainer = Trainer(cfg, phase_of(cfg, mode, cfg.task), out_dir, pretrained=pretrained)
    watch = Stopwatch(cfg.training.seed_transitions * cfg.env.action_repeat + warmup)
    trainer.callbacks.insert(0, watch)  # its phase end comes before the final evaluation's
    trainer.run()
    return watch.fps


def eval_fps(cfg: Config, snapshot: Path) -> float:
    """Frames per second of one evaluation episode of the fine-tuned agent (its actor's mean, rendered)."""
    from protorl.agents import make_agent
    from protorl.envs import make_env
    from protorl.runtime import resolve_device
    from protorl.storage.snapshots import load_snapshot

    env = make_env(cfg.task, cfg.env, seed=cfg.seed)
    agent = make_agent(cfg.agent, env.obs_type, env.obs_shape, env.action_shape, resolve_device(cfg.runtime.device),
                       "frozen")
    agent.load_pretrained(load_snapshot(snapshot)["agent"])
    time_step, frames, start = env.reset(), 0, time.perf_counter()
    while not time_step.last:
        time_step = env.step(agent.act(time_step.obs, sample=False))
        frames += env.action_repeat
    return frames / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="walker_walk")
    parser.add_argument("--frames", type=int, default=400, help="timed frames per phase, after seeding")
    parser.add_argument("--seed-steps", type=int, default=50, help="agent steps of seed transitions per phase")
    parser.add_argument("--warmup", type=int, default=0,
                        help="frames after seeding left out of the timing (with --compile: the compilation's)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--compile", action="store_true",
                        help="runtime.compile_update (its compile time falls inside the timed frames unless --warmup "
                             "covers it)")
    parser.add_argument("--tf32", action="store_true", help="runtime.tf32 (CUDA)")
    args = parser.parse_args()

    import torch

    from protorl.agents.proto.agent import ProtoConfig
    from protorl.storage.snapshots import load_snapshot

    with tempfile.TemporaryDirectory() as tmp:
        phase_frames = args.seed_steps * 2 + args.warmup + args.frames  # action repeat 2
        cfg = Config(task=args.env, pretrain_frames=phase_frames, finetune_frames=phase_frames, run_dir=tmp,
                     training=TrainingConfig(seed_transitions=args.seed_steps),
                     snapshots=SnapshotsConfig(at_frames=[]), checkpoints=CheckpointsConfig(every_frames=None),
                     evaluation=EvaluationConfig(every_frames=10**9, episodes=1),
                     analyses=AnalysesConfig(every_frames=None),
                     logging=LoggingConfig(tensorboard=False, progress_bar=False),
                     runtime=RuntimeConfig(device=args.device, compile_update=args.compile, tf32=args.tf32),
                     agent=ProtoConfig())
        device = prepare_process(cfg.runtime)
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else \
            f"CPU, {torch.get_num_threads()} threads"
        print(f"{args.env} from pixels, paper settings (batch {cfg.agent.batch_size}, action repeat "
              f"{cfg.env.action_repeat}), torch {torch.__version__}, {name}, compiled update {args.compile}, "
              f"TF32 {args.tf32}, {args.frames} frames timed per phase after {args.warmup} of warm-up")
        pretrain_fps = timed_phase(cfg, "pretrain", Path(tmp) / "pretrain", args.warmup)
        snapshot = sorted((Path(tmp) / "pretrain" / "snapshots").glob("*.pt"))[-1]
        finetune_fps = timed_phase(cfg, "finetune", Path(tmp) / "finetune", args.warmup,
                                   pretrained=load_snapshot(snapshot))
        evaluation_fps = eval_fps(cfg, snapshot)

    every, episodes = PAPER_EVAL
    eval_frames = PAPER_FRAMES // every * episodes * 1000  # 1000-frame episodes
    hours = (PAPER_FRAMES / pretrain_fps + PAPER_FRAMES / finetune_fps + eval_frames / evaluation_fps) / 3600
    print("| phase | env frames/s |\n|---|---|")
    print(f"| pre-training | {pretrain_fps:.2f} |\n| fine-tuning | {finetune_fps:.2f} |\n"
          f"| evaluation | {evaluation_fps:.1f} |")
    print(f"projected {PAPER_FRAMES // 1000}k + {PAPER_FRAMES // 1000}k run with {episodes} evaluation episodes every "
          f"{every // 1000}k downstream frames: {hours:.1f} h ({hours / 24:.1f} days)")


if __name__ == "__main__":
    main()
