"""A run's wall time, estimated before it starts from agent updates and environment steps timed on this machine, and
the check that refuses a run that would take longer than `runtime.max_hours` (a day by default: the paper's settings
on a CPU would take days).

A phase's estimate is its agent steps and its evaluations' (episodes of the suite's 1000 frames) times an agent step
(the policy's action and the environment's step, rendering included), and its updates times an update of its agent,
built on the run's device with the run's threads and updated on a batch of the run's shapes. Analyses, checkpoints
and logging are left out, so the estimate is a lower bound. Runs of fewer than `TIMED_FROM_UPDATES` updates are not
timed: they finish within hours even at a second per update.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from protorl.agents import agent_config, make_agent
from protorl.app.resources import steps_running_every_schedule
from protorl.config import Config, ConfigError
from protorl.envs import make_env
from protorl.replay import Batch
from protorl.runtime import resolve_device
from protorl.training.phases import PlannedPhase

log = logging.getLogger("protorl")
TIMED_FROM_UPDATES = 10_000  # runs with fewer updates are not timed
TIMED_UPDATES = 2  # at least, and whole periods of the agent's schedules, after one untimed update
TIMED_ENV_STEPS = 10  # after one reset
EPISODE_FRAMES = 1000  # an evaluation episode's frames, as the suite's tasks
HOUR_S = 3600.0


@dataclass(frozen=True)
class PhaseDuration:
    """A phase's estimated wall time and what it is made of."""

    phase: str  # "pretrain", "finetune" (from a snapshot) or "scratch" (no pre-training)
    updates: int
    update_s: float  # one update, timed
    env_steps: int  # training and evaluation steps
    env_step_s: float  # one agent step: the policy's action and the environment's step, timed

    @property
    def seconds(self) -> float:
        return self.updates * self.update_s + self.env_steps * self.env_step_s


@dataclass(frozen=True)
class RunDuration:
    """A run's estimated wall time: its phases', in order."""

    phases: tuple[PhaseDuration, ...]
    device: str

    @property
    def seconds(self) -> float:
        return sum(phase.seconds for phase in self.phases)

    def describe(self) -> str:
        """The estimate and what it is made of, in a line."""
        parts = "; ".join(f"{p.phase}: {p.updates} updates at {_short(p.update_s)} and {p.env_steps} environment "
                          f"steps at {_short(p.env_step_s)}" for p in self.phases)
        return (f"at least {duration_text(self.seconds)} on this machine's {self.device} ({parts}, timed here; "
                "analyses and logging not counted)")


def updates_of(config: Config, phase: PlannedPhase) -> int:
    """The agent updates `phase` runs: `training.updates_per_step` at each agent step past the seed steps whose
    count is a multiple of `training.update_every_steps`."""
    steps, every = phase.frames // config.env.action_repeat, config.training.update_every_steps
    updating_steps = max(0, -(-steps // every) - -(-config.training.seed_transitions // every))
    return updating_steps * config.training.updates_per_step


def env_steps_of(config: Config, phase: PlannedPhase) -> int:
    """The environment steps `phase` runs: its agent steps, and its evaluations' (downstream, or with
    `evaluation.during_pretrain`: every `evaluation.every_frames` from frame 0 on, and at the end)."""
    steps = phase.frames // config.env.action_repeat
    if phase.kind == "pretrain" and not config.evaluation.during_pretrain:
        return steps
    evaluations = -(-phase.frames // config.evaluation.every_frames) + 1
    return steps + evaluations * config.evaluation.episodes * (EPISODE_FRAMES // config.env.action_repeat)


def estimate_duration(config: Config, phases: Sequence[PlannedPhase]) -> RunDuration | None:
    """The estimate of `phases` (a run's, in order); None for a run of fewer than `TIMED_FROM_UPDATES` updates,
    which is not timed."""
    if sum(updates_of(config, phase) for phase in phases) < TIMED_FROM_UPDATES:
        return None
    device = resolve_device(config.runtime.device)
    threads = torch.get_num_threads()
    if config.runtime.threads is not None:
        torch.set_num_threads(config.runtime.threads)  # as the run will
    try:
        timed: dict[str, tuple[float, float]] = {}  # kind -> (seconds per update, per environment step)
        for phase in phases:  # the tasks of a domain share their shapes: one timing per kind of phase
            if phase.kind not in timed:
                timed[phase.kind] = _time_phase(config, phase, device)
    finally:
        torch.set_num_threads(threads)
    return RunDuration(tuple(PhaseDuration(phase.kind, updates_of(config, phase), timed[phase.kind][0],
                                           env_steps_of(config, phase), timed[phase.kind][1]) for phase in phases),
                       "GPU" if device.type == "cuda" else "CPU")


def check_duration(config: Config, phases: Sequence[PlannedPhase],
                   estimate: RunDuration | None = None) -> RunDuration | None:
    """Raise `ConfigError` if the estimate of `phases` (a run's: `estimate`, or `estimate_duration`'s) exceeds
    `runtime.max_hours`, naming what to run instead; the estimate (logged when made here) otherwise, or None where
    the run is not timed."""
    made_here = estimate is None
    estimate = estimate or estimate_duration(config, phases)
    if estimate is None:
        return None
    if config.runtime.max_hours is not None and estimate.seconds > config.runtime.max_hours * HOUR_S:
        raise ConfigError(f"this run would take {estimate.describe()}, more than runtime.max_hours="
                          f"{config.runtime.max_hours:g}: fewer frames (pretrain_frames, finetune_frames) or a "
                          "smaller preset shorten it (protorl-train alone, the main job, and preset=small run in "
                          "minutes on a CPU; on a GPU the paper's settings take hours); to start this run anyway, "
                          "add runtime.max_hours=null")
    if made_here:
        log.info("estimated wall time: %s", estimate.describe())
    return estimate


def duration_text(seconds: float) -> str:
    """`seconds` as a person says it: "40 minutes", "7.5 hours", "3.1 days"."""
    if seconds < HOUR_S:
        return f"{max(1, round(seconds / 60))} minutes"
    if seconds < 48 * HOUR_S:
        return f"{seconds / HOUR_S:.1f} hours"
    return f"{seconds / (24 * HOUR_S):.1f} days"


def _short(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.1f} s"
    return f"{seconds * 1000:.1f} ms" if seconds < 0.01 else f"{seconds * 1000:.0f} ms"


def _time_phase(config: Config, phase: PlannedPhase, device: torch.device) -> tuple[float, float]:
    """(seconds per update, seconds per agent step: the policy's action and the environment's step) of `phase` on
    `device`."""
    env = make_env(phase.task, config.env, seed=config.seed)
    try:
        agent_cfg = agent_config(config.agent)
        agent = make_agent(agent_cfg, env.obs_type, env.obs_shape, env.action_shape, device, phase.agent_mode)
        time_step = env.reset()
        started = time.perf_counter()
        for _ in range(TIMED_ENV_STEPS):
            time_step = env.step(agent.act(time_step.obs, sample=True))
        step_s = (time.perf_counter() - started) / TIMED_ENV_STEPS
        update_s = _time_update(agent, agent_cfg, env, device) if updates_of(config, phase) else 0.0
    finally:
        env.close()
    return update_s, step_s


def _time_update(agent, agent_cfg, env, device: torch.device) -> float:
    """Seconds per update of `agent` on a random batch of the environment's shapes: consecutive update steps over
    whole periods of its schedules, after an untimed one at which they all fire (it builds the optimisers' state)."""
    size, dtype = agent_cfg.batch_size, torch.uint8 if env.obs_type == "pixels" else torch.float32
    obs = [torch.randint(0, 256, (size, *env.obs_shape), device=device).to(dtype) for _ in range(2)]
    batch = Batch(obs=obs[0], action=torch.rand(size, *env.action_shape, device=device) * 2 - 1,
                  reward=torch.rand(size, 1, device=device), discount=torch.ones(size, 1, device=device),
                  next_obs=obs[1])
    first, second = steps_running_every_schedule(agent_cfg)
    period = second - first
    timed = period * -(-TIMED_UPDATES // period)  # whole periods, at least TIMED_UPDATES updates
    agent.update(batch, first)
    _synchronize(device)
    started = time.perf_counter()
    for step in range(first + 1, first + 1 + timed):
        agent.update(batch, step)
    _synchronize(device)
    return (time.perf_counter() - started) / timed


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)

