"""The training loop of one phase (pre-training or fine-tuning), counted in environment frames.

An agent step applies one action for `action_repeat` frames; frames = agent_steps * action_repeat.
"""

from __future__ import annotations

import json
import logging
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from protorl.agents import make_agent
from protorl.analysis.monitor import AnalysisMonitor
from protorl.checkpoint import (
    SnapshotError,
    UnreadableFileError,
    drop_checkpoints,
    list_checkpoints,
    load_checkpoint,
    remove_partial_writes,
    save_checkpoint,
    write_text_atomic,
)
from protorl.config import EVAL_SEED_OFFSET, Config
from protorl.envs import make_env
from protorl.logger import Logger
from protorl.replay import ReplayBuffer
from protorl.snapshot import check_architecture, check_spec, save_snapshot
from protorl.tracking import phase_tracker
from protorl.utils import resolve_device, set_seed

log = logging.getLogger("protorl")


class TrainingDiverged(RuntimeError):
    """A loss or metric became NaN or infinite; the message names it and the last good checkpoint."""


@dataclass
class PhaseResult:
    phase: str
    task: str
    frames: int
    episodes: int
    wall_time_s: float
    out_dir: Path
    eval_rewards: list[tuple[int, float]] = field(default_factory=list)  # (frames, mean episode reward)
    snapshots: list[Path] = field(default_factory=list)

    def save(self) -> Path:
        """Write `result.json` into the phase directory: the marker that this phase is complete. Paths in it
        are relative to the phase directory, so a copied or moved run directory stays whole."""
        path = self.out_dir / "result.json"
        data = {**asdict(self), "out_dir": ".", "snapshots": [_relative(p, self.out_dir) for p in self.snapshots]}
        return write_text_atomic(path, json.dumps(data, indent=1))

    @classmethod
    def load(cls, out_dir: Path) -> PhaseResult | None:
        """The result of a completed phase in `out_dir`, or None if it has not completed."""
        path = out_dir / "result.json"
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text())
        except ValueError:  # not written whole (by an older protorl): the phase is not known to be complete
            log.warning("%s cannot be read: taking the phase as not complete", path)
            return None
        data.update(out_dir=out_dir, snapshots=[_inside(p, out_dir) for p in data["snapshots"]],
                    eval_rewards=[tuple(pair) for pair in data["eval_rewards"]])
        return cls(**data)


def _relative(path: Path, out_dir: Path) -> str:
    """`path` as written into the phase directory's own files: relative to `out_dir`."""
    return str(Path(path).relative_to(out_dir))


def _inside(path: str, out_dir: Path) -> Path:
    """A path read from the phase directory's own files; older absolute ones are taken by their place in it."""
    path = Path(path)
    return out_dir / (Path(*path.parts[-2:]) if path.is_absolute() else path)


class Trainer:
    """Runs one phase of one agent on one task and writes its logs, snapshots and videos to `out_dir`."""

    def __init__(self, cfg: Config, phase: str, task: str, out_dir: Path, pretrained: dict | None = None):
        """`pretrained`: for phase "finetune", a snapshot read by `protorl.snapshot.load_snapshot`; without
        one the downstream agent learns its representation from the task reward (DrQ, figure 14)."""
        self.cfg, self.phase, self.task, self.out_dir = cfg, phase, task, out_dir
        set_seed(cfg.seed)
        self.device = resolve_device(cfg.device)
        self.env = make_env(task, cfg, seed=cfg.seed)
        self.eval_env = make_env(task, cfg, seed=cfg.seed + EVAL_SEED_OFFSET)
        mode = "pretrain" if phase == "pretrain" else "online" if pretrained is None else "frozen"
        self.agent = make_agent(cfg.agent, self.env.obs_type, self.env.obs_shape, self.env.action_shape,
                                self.device, mode)
        if pretrained is not None:
            source = Path(pretrained.get("path", "<snapshot>"))
            check_spec(source, pretrained["env_spec"], self.env.spec())
            check_architecture(source, pretrained["config"].get("agent", {}), cfg.agent)
            self.agent.load_pretrained(pretrained["agent"])
        # downstream from a snapshot, the pre-trained exploration actor collects the seed transitions (the paper's
        # code: its random steps are the run's first ones only); otherwise they are uniform-random actions
        self.seeds_with_actor = pretrained is not None and self.agent.loads_pretrained_actor
        self.analyses = phase == "pretrain" and cfg.analysis_every_frames is not None
        self.replay = ReplayBuffer(self.env.frame_shape, self.env.frame_dtype, self.env.action_shape,
                                   cfg.replay_capacity, self.env.frame_stack, seed=cfg.seed,
                                   physical_state_shape=self.env.physical_state_shape if self.analyses else None)
        self.logger = Logger(out_dir, self.agent.metric_names(), tensorboard=cfg.tensorboard,
                             tracker=phase_tracker(cfg, out_dir.name))
        self.monitor = None  # pre-training analyses: coverage, maps, reward variance (protorl/analysis/)
        if self.analyses:
            self.monitor = AnalysisMonitor(cfg, self.env, self.agent, self.replay, self.logger, out_dir)
        self.total_frames = cfg.pretrain_frames if phase == "pretrain" else cfg.finetune_frames
        self.agent_steps = 0
        self.updates = 0  # agent updates so far; the SAC and EMA schedules count these
        self.next_eval_frames = 0
        self.pending_snapshot_frames = sorted(f for f in cfg.snapshot_at_frames if f < self.total_frames)
        self.next_checkpoint_frames = cfg.checkpoint_every_frames
        self.checkpoint_dir = out_dir / "checkpoints"
        self.result = PhaseResult(phase, task, 0, 0, 0.0, out_dir)
        self._rng = np.random.default_rng(cfg.seed)
        self._elapsed_before = 0.0  # wall time of the run before a resume
        self._collapse_warned = False
        self._start = time.time()

    @property
    def frames(self) -> int:
        return self.agent_steps * self.env.action_repeat

    @property
    def evaluates(self) -> bool:
        return self.cfg.eval_episodes > 0 and (self.phase == "finetune" or self.cfg.eval_during_pretrain)

    def run(self) -> PhaseResult:
        """Train to the phase's frame budget (from a resumed checkpoint, if one was loaded)."""
        cfg, env = self.cfg, self.env
        total_steps = self.total_frames // env.action_repeat
        self._start = self._last_log_time = self._last_checkpoint_time = time.time()
        self._last_log_frames = self.frames
        self._bar = tqdm(total=total_steps * env.action_repeat, initial=self.frames, unit="frame",
                         desc=f"{self.phase} {self.task}", disable=not cfg.progress_bar, dynamic_ncols=True,
                         mininterval=1.0 if sys.stderr.isatty() else 30.0)

        time_step = self._begin_episode()
        episode_reward, episode_steps = 0.0, 0
        while self.agent_steps < total_steps:
            if self.evaluates and self.frames >= self.next_eval_frames:
                self.evaluate()
                self.next_eval_frames += cfg.eval_every_frames
            if self.phase == "pretrain" and self.pending_snapshot_frames and \
                    self.frames >= self.pending_snapshot_frames[0]:
                self.pending_snapshot_frames.pop(0)
                self.save_snapshot(self.frames)

            seeding = self.agent_steps < cfg.seed_transitions
            if seeding and not self.seeds_with_actor:
                action = self._rng.uniform(-1.0, 1.0, size=env.action_shape).astype(np.float32)
            else:
                action = self.agent.act(time_step.obs, sample=True)
            if not seeding and len(self.replay) > 0 and self.agent_steps % cfg.update_every_steps == 0:
                metrics = self.agent.update(self.replay.sample(cfg.agent.batch_size, self.device), self.updates)
                self._check_finite(metrics)
                self.logger.accumulate(metrics)
                self.updates += 1

            time_step = env.step(action)
            self.replay.add(time_step.frame, action, time_step.reward, time_step.discount, self._kept_state(time_step))
            if self.monitor is not None:
                self.monitor.record(time_step.physical_state)
            episode_reward += time_step.reward
            episode_steps += 1
            self.agent_steps += 1
            self._bar.update(env.action_repeat)

            if time_step.last:
                self._end_episode(episode_reward, episode_steps)
                if self._checkpoint_due():
                    self.save_checkpoint()
                time_step = self._begin_episode()
                episode_reward, episode_steps = 0.0, 0

        if self.evaluates:
            self.evaluate()
        if self.phase == "pretrain":
            self.save_snapshot(self.frames)
        if self.monitor is not None:
            self.monitor.finish(self.frames)
        self._bar.close()
        self.logger.close()
        self.result.frames = self.frames
        self.result.wall_time_s = self._elapsed()
        self.result.save()
        if not self.cfg.keep_checkpoints:
            drop_checkpoints(self.checkpoint_dir)
        return self.result

    def _begin_episode(self):
        time_step = self.env.reset()
        self.replay.add_first(time_step.frame, self._kept_state(time_step))
        if self.monitor is not None:
            self.monitor.record(time_step.physical_state)
        return time_step

    def _kept_state(self, time_step):
        """The physical state the replay keeps next to the frame: only while analyses need it."""
        return time_step.physical_state if self.monitor is not None else None

    def _elapsed(self) -> float:
        return self._elapsed_before + time.time() - self._start

    def _check_finite(self, metrics: dict[str, float]) -> None:
        bad = sorted(key for key, value in metrics.items() if not math.isfinite(value))
        if bad:
            checkpoints = list_checkpoints(self.checkpoint_dir)
            last = f"the last good checkpoint is {checkpoints[-1]}" if checkpoints else "no checkpoint was written"
            raise TrainingDiverged(f"{self.phase} stopped at frame {self.frames}: non-finite "
                                   f"{', '.join(bad)} ({', '.join(f'{k}={metrics[k]}' for k in bad)}); {last}")

    def _end_episode(self, episode_reward: float, episode_steps: int) -> None:
        """Count the episode; every `log_every_episodes` write a train.csv row with the averaged metrics."""
        self.result.episodes += 1
        now = time.time()
        fps = (self.frames - self._last_log_frames) / max(now - self._last_log_time, 1e-9)
        if self.result.episodes % self.cfg.log_every_episodes == 0:
            row = self.logger.log_train({
                "frames": self.frames, "agent_steps": self.agent_steps, "episode": self.result.episodes,
                "episode_reward": episode_reward, "episode_length_frames": episode_steps * self.env.action_repeat,
                "fps": fps, "total_time_s": self._elapsed()})
            self._last_log_time, self._last_log_frames = now, self.frames
            self._warn_if_collapsed(row)
        self._bar.set_postfix(episode_reward=f"{episode_reward:.1f}", fps=f"{fps:.0f}")
        if self.monitor is not None:
            self.monitor.end_episode(self.frames)

    def _warn_if_collapsed(self, row: dict) -> None:
        """One warning per phase, the first time a logged row shows a collapsed representation."""
        message = None if self._collapse_warned else self.agent.collapse_message(row)
        if message is not None:
            log.warning("%s %s", self.phase, message)
            self._collapse_warned = True

    def evaluate(self) -> None:
        """Run `eval_episodes` episodes with the policy's mean action; log their mean return."""
        rewards = []
        video_frames: list[np.ndarray] = []
        record = self.cfg.save_video
        for _ in range(self.cfg.eval_episodes):
            time_step = self.eval_env.reset()
            total = 0.0
            while True:
                if record:
                    video_frames.append(self.eval_env.render(self.cfg.video_size))
                time_step = self.eval_env.step(self.agent.act(time_step.obs, sample=False))
                total += time_step.reward
                if time_step.last:
                    break
            rewards.append(total)
            record = False  # one video per evaluation: its first episode
        mean = float(np.mean(rewards))
        self.logger.log_eval({"frames": self.frames, "agent_steps": self.agent_steps, "episode_reward": mean,
                              "episode_reward_std": float(np.std(rewards)), "episodes": len(rewards),
                              "total_time_s": self._elapsed()})
        self.result.eval_rewards.append((self.frames, mean))
        if video_frames:
            self._write_video(video_frames)

    def save_snapshot(self, frames: int) -> Path:
        path = save_snapshot(self.out_dir / "snapshots" / f"snapshot_{frames}.pt",
                             self.agent.representation_state(), self.env.spec(),
                             OmegaConf.to_container(OmegaConf.structured(self.cfg)), frames)
        self.result.snapshots.append(path)
        return path

    def _write_video(self, frames: list[np.ndarray]) -> None:
        import imageio

        path = self.out_dir / "videos" / f"eval_{self.frames}.mp4"
        path.parent.mkdir(parents=True, exist_ok=True)
        imageio.mimsave(path, frames, fps=30, macro_block_size=1)


    # -- checkpoints -------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue this phase exactly: taken at an episode end, before the reset."""
        return {
            "phase": self.phase, "task": self.task, "seed": self.cfg.seed,
            "agent_steps": self.agent_steps, "updates": self.updates, "episodes": self.result.episodes,
            "next_eval_frames": self.next_eval_frames, "next_checkpoint_frames": self.next_checkpoint_frames,
            "pending_snapshot_frames": list(self.pending_snapshot_frames),
            "eval_rewards": [list(pair) for pair in self.result.eval_rewards],
            "snapshots": [_relative(p, self.out_dir) for p in self.result.snapshots], "elapsed_s": self._elapsed(),
            "collapse_warned": self._collapse_warned,
            "agent": self.agent.state_dict(), "replay": self.replay.state_dict(),
            "logger": self.logger.state_dict(self.frames),
            "monitor": None if self.monitor is None else self.monitor.state_dict(),
            "rng": {"trainer": self._rng.bit_generator.state, "torch": torch.get_rng_state(),
                    "numpy": _numpy_global_state(), "python": _python_state(),
                    "env": self.env.rng_state(), "eval_env": self.eval_env.rng_state()},
        }

    def load_state_dict(self, state: dict) -> None:
        if (state["monitor"] is None) != (self.monitor is None):
            raise SnapshotError(f"checkpoint of {self.phase} was written with analyses "
                                f"{'off' if state['monitor'] is None else 'on'}: resume with the run's own "
                                "analysis_every_frames, or start over with start_over=true")
        if (state["phase"], state["task"], state["seed"]) != (self.phase, self.task, self.cfg.seed):
            raise SnapshotError(f"checkpoint is of {state['phase']} on {state['task']} seed {state['seed']}, "
                             f"not {self.phase} on {self.task} seed {self.cfg.seed}")
        self.agent_steps, self.updates = int(state["agent_steps"]), int(state["updates"])
        self.result.episodes = int(state["episodes"])
        self.next_eval_frames = int(state["next_eval_frames"])
        self.next_checkpoint_frames = state["next_checkpoint_frames"]
        self.pending_snapshot_frames = list(state["pending_snapshot_frames"])
        self.result.eval_rewards = [(int(f), float(r)) for f, r in state["eval_rewards"]]
        self.result.snapshots = [_inside(p, self.out_dir) for p in state["snapshots"]]
        self._elapsed_before = float(state["elapsed_s"])
        self._collapse_warned = bool(state["collapse_warned"])
        self.agent.load_state_dict(state["agent"])
        self.replay.load_state_dict(state["replay"])
        self.logger.load_state_dict(state["logger"])
        if self.monitor is not None:
            self.monitor.load_state_dict(state["monitor"])
        rng = state["rng"]
        self._rng.bit_generator.state = rng["trainer"]
        torch.set_rng_state(rng["torch"])
        np.random.set_state(("MT19937", np.asarray(rng["numpy"]["keys"], dtype=np.uint32), *rng["numpy"]["rest"]))
        random.setstate((rng["python"]["version"], tuple(rng["python"]["state"]), None))
        self.env.set_rng_state(rng["env"])
        self.eval_env.set_rng_state(rng["eval_env"])

    def _checkpoint_due(self) -> bool:
        frames_due = self.next_checkpoint_frames is not None and self.frames >= self.next_checkpoint_frames
        minutes = self.cfg.checkpoint_every_minutes
        time_due = minutes is not None and time.time() - self._last_checkpoint_time >= 60 * minutes
        return frames_due or time_due

    def save_checkpoint(self) -> Path:
        every = self.cfg.checkpoint_every_frames
        if every is not None:
            self.next_checkpoint_frames = (self.frames // every + 1) * every
        self._last_checkpoint_time = time.time()
        return save_checkpoint(self.state_dict(), self.checkpoint_dir, self.frames, self.cfg.checkpoint_keep)

    def resume_or_start(self) -> Path | None:
        """Continue from this phase's newest intact checkpoint and return its path; without one, start afresh,
        dropping whatever an earlier attempt logged. An unreadable newest checkpoint (e.g. cut short by a full
        disk) is deleted with a warning and the one before it used. Temporary files of a killed write go."""
        for directory in (self.checkpoint_dir, self.out_dir / "snapshots"):
            remove_partial_writes(directory)
        for path in reversed(list_checkpoints(self.checkpoint_dir)):
            try:
                state = load_checkpoint(path)
            except UnreadableFileError as error:
                if not list_checkpoints(self.checkpoint_dir)[:-1]:
                    raise
                log.warning("%s; moving it aside (.unreadable) and resuming from the checkpoint before it", error)
                path.rename(path.with_suffix(".pt.unreadable"))
                continue
            self.load_state_dict(state)
            return path
        self.logger.reset()
        if self.monitor is not None:
            self.monitor.reset()
        return None


def _numpy_global_state() -> dict:
    _, keys, *rest = np.random.get_state()
    return {"keys": keys.tolist(), "rest": [int(rest[0]), int(rest[1]), float(rest[2])]}


def _python_state() -> dict:
    version, state, _ = random.getstate()
    return {"version": version, "state": list(state)}


def prepare_process(cfg: Config) -> torch.device:
    """Process-wide settings for a run: threads, allocator tuning; returns the device."""
    from protorl.utils import tune_malloc

    if cfg.fast_malloc:
        tune_malloc()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    return resolve_device(cfg.device)
