"""The training loop of one phase (pre-training or fine-tuning), counted in environment frames.

An agent step applies one action for `action_repeat` frames; frames = agent_steps * action_repeat. What the
phase does besides the loop (evaluation, snapshots, logs, analyses, checkpoints) its callbacks do.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from protorl.agents import make_agent
from protorl.config import EVAL_SEED_OFFSET, Config
from protorl.envs import TimeStep, make_env
from protorl.envs.thread import EnvThread
from protorl.errors import RunInterrupted, TrainingDiverged
from protorl.logs.logger import Logger
from protorl.logs.tracking import PhaseTracker
from protorl.replay import ReplayBuffer, frames_device
from protorl.runtime import resolve_device, set_seed
from protorl.storage.atomic import remove_partial_writes
from protorl.storage.checkpoints import checkpoint_frames, drop_checkpoints, list_checkpoints, load_newest_checkpoint
from protorl.storage.rundir import run_settings, settings_differences
from protorl.storage.snapshots import check_architecture
from protorl.training.callbacks import Callback
from protorl.training.callbacks.checkpointing import Checkpoints
from protorl.training.callbacks.evaluation import Evaluation
from protorl.training.callbacks.exploration import AnalysisMonitor, NoAnalyses
from protorl.training.callbacks.progress import ProgressLog
from protorl.training.callbacks.snapshotting import Snapshots
from protorl.training.context import PhaseContext
from protorl.training.interrupt import StopRequest, stop_request
from protorl.training.phases import PlannedPhase
from protorl.training.pretrain_data import mixed_batch, relabelled_replay
from protorl.training.result import PhaseResult
from protorl.training.rng_state import capture_rngs, restore_rngs

log = logging.getLogger("protorl")


class Trainer:
    """Runs one phase of one agent on one task and writes its logs, snapshots and videos to `out_dir`."""

    def __init__(self, config: Config, planned: PlannedPhase, out_dir: Path, pretrained: dict | None = None,
                 tracker: PhaseTracker | None = None):
        """`planned`: the phase, as the run's plan made it (`protorl.training.phases`); `pretrained`: for a
        fine-tuning from a snapshot (mode "frozen"), the snapshot read by
        `protorl.storage.snapshots.load_snapshot`; without one (mode "online") the downstream agent learns its
        representation by its own rule while it learns the task (DrQ; Proto-RL online, figure 14). `tracker`: also
        send the logs to a W&B run (`protorl.logs.tracking.phase_tracker`)."""
        if (planned.mode == "frozen") != (pretrained is not None):
            raise ValueError(f"a phase in mode {planned.mode} {'needs' if planned.mode == 'frozen' else 'takes no'} "
                             "pre-trained snapshot")
        phase, task = planned.phase, planned.task
        self.config, self.phase, self.task, self.out_dir = config, phase, task, out_dir
        set_seed(config.seed)
        self.device = resolve_device(config.runtime.device)
        self.env = make_env(task, config.env, seed=config.seed)
        # where its resets and steps run
        self.env_thread = EnvThread(self.env, threaded=config.runtime.overlap_env_step)
        self.eval_env = make_env(task, config.env, seed=config.seed + EVAL_SEED_OFFSET)
        self.agent = make_agent(config.agent, self.env.obs_type, self.env.obs_shape, self.env.action_shape,
                                self.device, planned.mode)
        if pretrained is not None:
            source = Path(pretrained.get("path", "<snapshot>"))
            check_architecture(source, pretrained["config"].get("agent", {}), config.agent)
            self.agent.load_pretrained(pretrained["agent"])
        if config.runtime.compile_update:  # one compiled graph per update; on CUDA replayed as a CUDA graph
            self.agent.compile_update(cuda_graphs=self.device.type == "cuda")
        # downstream from a snapshot, the pre-trained exploration actor collects the seed transitions (the paper's
        # code: its random steps are the run's first ones only); otherwise they are uniform-random actions
        self.seeds_with_actor = pretrained is not None and self.agent.loads_pretrained_actor
        self.pretrain_data = None  # the snapshot's replay with this task's rewards (`replay.pretrain_data_share`)
        if pretrained is not None and config.replay.pretrain_data_share > 0:
            relabelling_env = make_env(task, config.env, seed=config.seed)
            self.pretrain_data = relabelled_replay(pretrained["replay"], relabelling_env, config.env.action_repeat,
                                                   seed=[config.seed, 1])
            relabelling_env.close()
            rewarded = int((self.pretrain_data.rewards != 0).sum())
            log.info("pre-training data: %d transitions, %d with a reward of %s", len(self.pretrain_data),
                     rewarded, task)
        keeps_states = config.keeps_physical_states(phase)
        frames_nbytes = config.replay.capacity * math.prod(self.env.frame_shape) * self.env.frame_dtype.itemsize
        self.replay = ReplayBuffer(self.env.frame_shape, self.env.frame_dtype, self.env.action_shape,
                                   config.replay.capacity, self.env.frame_stack, seed=config.seed,
                                   physical_state_shape=self.env.physical_state_shape if keeps_states else None,
                                   device=frames_device(self.device, frames_nbytes, config.replay.on_device))
        self.logger = Logger(out_dir, self.agent.metric_names(), tensorboard=config.logging.tensorboard,
                             tracker=tracker)
        self.total_frames = planned.frames
        self.total_steps = self.total_frames // self.env.action_repeat
        self.agent_steps = 0
        self.updates = 0  # agent updates so far; the SAC and EMA schedules count these
        self.checkpoint_dir = out_dir / "checkpoints"
        self.result = PhaseResult(phase, task, 0, 0, 0.0, out_dir)
        self._rng = np.random.default_rng(config.seed)  # the seed transitions' uniform-random actions
        self.context = PhaseContext(phase, task, self.logger, self.checkpoint_dir)
        self.checkpoints = Checkpoints(config.checkpoints, self.checkpoint_dir, self.state_dict)
        analyses = (AnalysisMonitor(config.analyses, config.env, config.seed, config.downstream_tasks,
                                    self.total_frames, self.env, self.agent, self.replay, self.logger, out_dir)
                    if config.runs_analyses(phase) else NoAnalyses())
        # in the order their hooks run: evaluation and snapshots before a step; at an episode's end the train.csv
        # row, the analyses, then a checkpoint of what they all did
        self.callbacks: list[Callback] = [
            Evaluation(config.evaluation, self.context, self.eval_env, self.agent, self.logger, self.result),
            Snapshots(config.snapshots, OmegaConf.to_container(OmegaConf.structured(config)), self.context,
                      self.total_frames, self.env, self.agent, self.replay, self.result),
            ProgressLog(config.logging, self.context, self.total_steps * self.env.action_repeat, self.env.action_repeat,
                        self.agent, self.logger, self.result),
            analyses,
            self.checkpoints,
        ]

    @property
    def frames(self) -> int:
        return self.agent_steps * self.env.action_repeat

    def run(self) -> PhaseResult:
        """Train to the phase's frame budget (from a resumed checkpoint, if one was loaded). Ctrl-C stops it at
        the next episode end after a checkpoint there, a second Ctrl-C at once: `RunInterrupted`, saying where."""
        self.context.start_clock()
        self._notify("on_phase_start", self.frames)
        try:
            with stop_request() as stop:
                self._loop(stop)
        except RunInterrupted:
            raise
        except KeyboardInterrupt:
            raise RunInterrupted(self._interrupted()) from None
        finally:
            self._notify("close")
            self.env_thread.close()
        self.logger.close()
        self.result.frames = self.frames
        self.result.wall_time_s = self.context.elapsed()
        self.result.save(run_settings(self.config))
        if not self.config.checkpoints.keep_completed:
            drop_checkpoints(self.checkpoint_dir)
        if stop.requested:  # Ctrl-C after the last episode end: the phase is complete, the run stops here
            raise RunInterrupted(f"interrupted at the end of {self.phase} on {self.task}, which is complete; rerun "
                                 "the same command to continue with what follows it")
        return self.result

    def _loop(self, stop: StopRequest) -> None:
        """Agent steps to the phase's budget; at an episode end after Ctrl-C, a checkpoint and `RunInterrupted`."""
        time_step = self._begin_episode()
        while self.agent_steps < self.total_steps:
            self._notify("before_step", self.frames)
            if stop.requested and self._newest_checkpoint_frames() == self.frames:
                raise RunInterrupted(self._interrupted())  # Ctrl-C in an evaluation or a snapshot's write, just
                # after the checkpoint of the episode end that they follow: that checkpoint resumes them exactly
            seeding = self.agent_steps < self.config.training.seed_transitions
            action = self._act(time_step, seeding)
            stepping = self.env_thread.step(action)  # the update never reads this transition: may overlap
            for _ in range(self.config.training.updates_at(self.agent_steps)):
                self._update()
            time_step = self._observed(stepping.result())
            self.replay.add(time_step.frame, action, time_step.reward, time_step.discount,
                            self._kept_state(time_step))
            self.agent_steps += 1
            self._notify("on_time_step", time_step)
            if time_step.last:
                self.result.episodes += 1
                self.context.check_finite(self.frames)  # before the episode's row, analyses and checkpoint
                self._notify("on_episode_end", self.frames)
                if stop.requested:
                    if self._newest_checkpoint_frames() != self.frames:
                        self.checkpoints.save(self.frames)
                    raise RunInterrupted(self._interrupted())
                time_step = self._begin_episode()
        self.context.check_finite(self.frames)
        self._notify("on_phase_end", self.frames)

    def _newest_checkpoint_frames(self) -> int | None:
        checkpoints = list_checkpoints(self.checkpoint_dir)
        return checkpoint_frames(checkpoints[-1]) if checkpoints else None

    def _interrupted(self) -> str:
        """Where Ctrl-C stopped the phase and where a rerun resumes it."""
        where = f"{self.phase} on {self.task} interrupted at frame {self.frames} of {self.total_frames}"
        newest = self._newest_checkpoint_frames()
        if newest is None:
            return f"{where}, before its first checkpoint; rerunning the same command starts this phase again"
        return (f"{where}; the last checkpoint is at frame {newest} ({list_checkpoints(self.checkpoint_dir)[-1]}); "
                "rerun the same command to resume from it")

    def _act(self, time_step: TimeStep, seeding: bool) -> np.ndarray:
        """A policy sample; while seeding, a uniform-random action (unless the pre-trained actor seeds)."""
        if seeding and not self.seeds_with_actor:
            return self._rng.uniform(-1.0, 1.0, size=self.env.action_shape).astype(np.float32)
        action = self.agent.act(time_step.obs, sample=True)
        if not np.isfinite(action).all():  # the action is on the host already: checking it costs nothing
            self.context.check_finite(self.frames)
            raise TrainingDiverged(f"{self.phase} stopped at frame {self.frames}: the policy's action is not finite "
                                   f"({action}); {self.context.last_checkpoint()}")
        return action

    def _observed(self, time_step: TimeStep) -> TimeStep:
        """`time_step`, or `TrainingDiverged` if the environment returned a non-finite observation (states)."""
        if time_step.frame.dtype.kind == "f" and not np.isfinite(time_step.frame).all():
            raise TrainingDiverged(f"{self.phase} stopped at frame {self.frames}: the environment returned a "
                                   f"non-finite observation ({time_step.frame}); {self.context.last_checkpoint()}")
        return time_step

    def _update(self) -> None:
        """One agent update; its metrics stay on the device until the logger reads them (`check_finite`)."""
        if self.pretrain_data is None:
            batch = self.replay.sample(self.config.agent.batch_size, self.device)
        else:
            batch = mixed_batch(self.replay, self.pretrain_data, self.config.agent.batch_size,
                                self.config.replay.pretrain_data_share, self.device)
        metrics = self.agent.update(batch, self.updates)
        self.logger.accumulate(metrics)
        self.updates += 1

    def _begin_episode(self) -> TimeStep:
        time_step = self._observed(self.env_thread.reset())
        self.replay.add_first(time_step.frame, self._kept_state(time_step))
        self._notify("on_time_step", time_step)
        return time_step

    def _kept_state(self, time_step: TimeStep) -> np.ndarray | None:
        """The physical state the replay keeps next to the frame: only if it keeps them (for the analyses)."""
        return time_step.physical_state if self.replay.physical_states is not None else None

    def _notify(self, hook: str, *args) -> None:
        """Call `hook` (a `Callback` method's name) of every callback, in order."""
        for callback in self.callbacks:
            getattr(callback, hook)(*args)

    # -- checkpoints -------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue this phase exactly: taken at an episode end, before the reset."""
        state = {"phase": self.phase, "task": self.task, "seed": self.config.seed,
                 "settings": run_settings(self.config), "agent_steps": self.agent_steps, "updates": self.updates,
                 **self.result.state_dict(),
                 "elapsed_s": self.context.elapsed(), "agent": self.agent.state_dict(),
                 "replay": self.replay.state_dict(),
                 "logger": self.logger.state_dict(self.frames),
                 "rng": capture_rngs(self._rng, self.env, self.eval_env)}
        if self.pretrain_data is not None:
            state["pretrain_data_rng"] = self.pretrain_data.rng_state()
        for callback in self.callbacks:
            state.update(callback.state_dict())
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state_dict()` of this run (`foreign`); `CheckpointError` if its callbacks refuse it."""
        for callback in self.callbacks:  # first: they refuse a checkpoint of other settings before the logs are cut
            callback.load_state_dict(state)
        self.agent_steps, self.updates = int(state["agent_steps"]), int(state["updates"])
        self.result.load_state_dict(state)
        self.context.elapsed_before = float(state["elapsed_s"])
        self.agent.load_state_dict(state["agent"])
        self.replay.load_state_dict(state["replay"])
        if self.pretrain_data is not None:
            self.pretrain_data.set_rng_state(state["pretrain_data_rng"])
        self.logger.load_state_dict(state["logger"])
        restore_rngs(state["rng"], self._rng, self.env, self.eval_env)

    def foreign(self, state: dict) -> str | None:
        """How the run a checkpoint was written by differs from this one (its phase, task, seed, or a setting a rerun
        may not change), or None if it is this run's. A checkpoint of version 4 records no settings."""
        theirs = (state.get("phase"), state.get("task"), state.get("seed"))
        ours = (self.phase, self.task, self.config.seed)
        if theirs != ours:
            return "{} on {} seed {}, not {} on {} seed {}".format(*theirs, *ours)
        differences = settings_differences(state["settings"], run_settings(self.config)) if "settings" in state else []
        if differences:
            return "; ".join(differences[:4]) + (f"; and {len(differences) - 4} more" if len(differences) > 4 else "")
        return None

    def resume_or_start(self) -> Path | None:
        """Continue from this phase's newest intact checkpoint and return its path; without one, start afresh,
        dropping whatever an earlier attempt logged. Temporary files of a killed write go."""
        for directory in (self.checkpoint_dir, self.out_dir / "snapshots"):
            remove_partial_writes(directory)
        newest = load_newest_checkpoint(self.checkpoint_dir, self.foreign)
        if newest is None:
            self.logger.reset()
            self._notify("reset")
            return None
        path, state = newest
        self.load_state_dict(state)
        return path
