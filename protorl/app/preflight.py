"""The pre-flight: before a run writes anything, on the machine that runs it, refuse in one line a run whose replay
buffer this machine cannot hold, or that would take longer than `runtime.max_hours`.

Memory: a phase's replay buffer (the part its frames fill, twice where a checkpoint or snapshot copies it out, and
the pre-training's data a fine-tuning relabels) against the memory available now, and the whole buffer against the
memory and swap there are; on a GPU, the replay's frames kept there against its free memory. The agent's own memory
is not estimated: a GPU that runs out ends the run in one line (`protorl.app.exits`).

Wall time: a phase's agent steps and updates (`TrainingConfig.updates_at`, as the trainer makes them; in a run
continued, those after its newest checkpoint, none for a completed phase) times an agent step and an update of its
agent timed here, on the run's device and threads; evaluations, analyses and logging are not counted, so it is a
lower bound; under `runtime.compile_update` the update is timed uncompiled (compiling it takes a minute), and the
line says so instead. Runs of fewer than `TIMED_FROM_UPDATES` updates are not timed. On a CPU whose cores other work
keeps busy (by the load average), threads that wait on each other can make an update tens of times slower for a
while: an update is then also timed on one thread, the faster reading is counted, and the line says so.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from protorl.agents import agent_config, make_agent
from protorl.config import Config, ConfigError
from protorl.envs import Env, make_env
from protorl.replay import Batch, ReplayBuffer, frames_device
from protorl.runtime import resolve_device
from protorl.storage.atomic import payload_bytes
from protorl.storage.checkpoints import checkpoint_frames, list_checkpoints
from protorl.storage.run_files import is_complete
from protorl.training.phases import PlannedPhase

log = logging.getLogger("protorl")
GIB, HOUR_S = 2**30, 3600.0
TIMED_FROM_UPDATES = 10_000  # runs with fewer updates are not timed
TIMED_UPDATES = 4  # consecutive ones (every period of 1, 2 or 4 updates falls due in them), after an untimed one
TIMED_ENV_STEPS = 10  # after one reset
BUSY_RATIO = 2.0  # an update this many times slower on the run's CPU threads than on one: the CPU is busy


def preflight(config: Config, phases: Sequence[PlannedPhase], pretrained: dict | None = None) -> float | None:
    """Raise `ConfigError` if one of `phases` (a run's, in order) needs more memory than this machine has for its
    replay, or if they would take longer than `runtime.max_hours`; the estimated seconds otherwise (None: not
    timed). `pretrained`: the snapshot a fine-tuning starts from, read already."""
    device, timed = resolve_device(config.runtime.device), {}
    steps = {phase: range(_steps_done(config, phase), phase.frames // config.env.action_repeat) for phase in phases}
    updates = {phase: sum(map(config.training.updates_at, steps[phase])) for phase in phases}
    timing = sum(updates.values()) >= TIMED_FROM_UPDATES
    threads = torch.get_num_threads()
    if config.runtime.threads is not None:
        torch.set_num_threads(config.runtime.threads)  # as the run will
    run_threads = torch.get_num_threads()
    try:
        for phase in phases:  # the tasks of a domain share their shapes: one phase of each mode still to run
            if phase.mode in timed or not steps[phase]:
                continue
            env = make_env(phase.task, config.env, seed=config.seed)
            try:
                time_step = env.reset()  # from pixels, its renderer starts before anything is written
                _check_replay(config, phase, env, device, pretrained)
                timed[phase.mode] = _time_phase(config, phase, env, time_step, device) if timing else None
            finally:
                env.close()
    finally:
        torch.set_num_threads(threads)
    if not timing:
        return None
    seconds, parts, busy = 0.0, [], ""
    for phase in (phase for phase in phases if steps[phase]):
        update_s, step_s, alone_s = timed[phase.mode]
        counted_s, done = min(update_s, alone_s), steps[phase].start * config.env.action_repeat
        seconds += updates[phase] * counted_s + len(steps[phase]) * step_s
        parts.append(f"{phase.dir_name}{f' from frame {done}' if done else ''}: {updates[phase]} updates at "
                     f"{counted_s * 1e3:.1f} ms and {len(steps[phase])} agent steps at {step_s * 1e3:.1f} ms")
        if alone_s * BUSY_RATIO < update_s:
            busy = (f"; this CPU is busy: an update took {update_s * 1e3:.0f} ms on {run_threads} threads "
                    f"and {alone_s * 1e3:.1f} ms on one, so runtime.threads=1 runs faster beside the other work")
    compiled = config.runtime.compile_update  # timed uncompiled: the estimate is no longer a lower bound
    estimate = (f"{'' if compiled else 'at least '}{duration_text(seconds)} on this machine's "
                f"{'GPU' if device.type == 'cuda' else 'CPU'} ({'; '.join(parts)}, timed here"
                f"{', uncompiled (runtime.compile_update runs the update faster)' if compiled else ''}; "
                f"evaluations, analyses and logging not counted){busy}")
    if config.runtime.max_hours is not None and seconds > config.runtime.max_hours * HOUR_S:
        raise ConfigError(f"this run would take {estimate}, more than runtime.max_hours={config.runtime.max_hours:g}: "
                          "fewer frames (pretrain_frames, finetune_frames) or a smaller preset shorten it "
                          "(protorl-train alone, the main job, and preset=small run in minutes on a CPU; on a GPU "
                          "the paper's settings take hours); to start this run anyway, add runtime.max_hours=null")
    log.info("estimated wall time: %s", estimate)
    return seconds


def _steps_done(config: Config, phase: PlannedPhase) -> int:
    """The agent steps of `phase` that its run directory holds and the run continues from: all once it completed,
    else its newest checkpoint's (by the file's name); none where the run starts over."""
    out_dir, total = Path(config.run_dir) / phase.dir_name, phase.frames // config.env.action_repeat
    if config.start_over:
        return 0
    if is_complete(out_dir):
        return total
    checkpoints = list_checkpoints(out_dir / "checkpoints")
    return min(total, checkpoint_frames(checkpoints[-1]) // config.env.action_repeat) if checkpoints else 0


def duration_text(seconds: float) -> str:
    """`seconds` as a person says it: "40 minutes", "7.5 hours", "3.1 days"."""
    if seconds < HOUR_S:
        return f"{max(1, round(seconds / 60))} minutes"
    if seconds < 48 * HOUR_S:
        return f"{seconds / HOUR_S:.1f} hours"
    return f"{seconds / (24 * HOUR_S):.1f} days"


def _check_replay(config: Config, phase: PlannedPhase, env: Env, device: torch.device,
                  pretrained: dict | None) -> None:
    """`ConfigError` if `phase`'s replay buffer does not fit this machine's memory (or its frames the GPU's)."""
    states = env.physical_state_shape if config.keeps_physical_states(phase.phase) else None
    slot = ReplayBuffer(env.frame_shape, env.frame_dtype, env.action_shape, capacity=1, frame_stack=1,
                        physical_state_shape=states).nbytes
    frames_bytes = config.replay.capacity * math.prod(env.frame_shape) * env.frame_dtype.itemsize
    if frames_device(device, frames_bytes, config.replay.on_device) is not None:
        free = torch.cuda.mem_get_info(device)[0]
        if frames_bytes > free:
            raise ConfigError(f"replay.on_device: the replay's frames need {frames_bytes / GIB:.1f} GiB of {device} "
                              f"and {free / GIB:.1f} GiB are free there; set replay.on_device=false or lower "
                              "replay.capacity")
    memory = _meminfo()
    if not memory:  # the operating system does not say
        return
    reservable = memory["MemTotal"] + memory.get("SwapTotal", 0)
    if config.replay.capacity * slot > reservable:
        raise ConfigError(f"invalid config value replay.capacity={config.replay.capacity}: the buffer would reserve "
                          f"{config.replay.capacity * slot / GIB:.1f} GiB and this machine has {reservable / GIB:.1f} "
                          "GiB of memory and swap; lower replay.capacity")
    written = min(config.replay.capacity, 2 * (phase.frames // config.env.action_repeat) + 1)  # a slot per step
    copied = (config.checkpoints.every_frames or config.checkpoints.every_minutes  # and per episode's first frame
              or (phase.mode == "pretrain" and config.snapshots.with_replay))
    needed = (2 if copied else 1) * written * slot
    if phase.mode == "frozen" and config.replay.pretrain_data_share > 0:  # the snapshot's replay, relabelled
        needed += payload_bytes(pretrained.get("replay", {})) if pretrained is not None else 2 * written * slot
    if needed > memory["MemAvailable"]:
        raise ConfigError(f"this run's replay would need about {needed / GIB:.1f} GiB ({phase.dir_name}) and "
                          f"{memory['MemAvailable'] / GIB:.1f} GiB are available; lower replay.capacity or the "
                          "frames")


def _time_phase(config: Config, phase: PlannedPhase, env: Env, time_step, device: torch.device
                ) -> tuple[float, float, float]:
    """(seconds per update, seconds per agent step: the policy's action and the environment's step, seconds per
    update on one CPU thread where the CPU is busy, else the first figure again) of `phase`, in `env` from its first
    `time_step`."""
    agent_cfg = agent_config(config.agent)
    agent = make_agent(agent_cfg, env.obs_type, env.obs_shape, env.action_shape, device, phase.mode)
    started = time.perf_counter()
    for _ in range(TIMED_ENV_STEPS):
        time_step = env.step(agent.act(time_step.obs, sample=True))
    step_s = (time.perf_counter() - started) / TIMED_ENV_STEPS
    size, dtype = agent_cfg.batch_size, torch.uint8 if env.obs_type == "pixels" else torch.float32
    obs = [torch.randint(0, 256, (size, *env.obs_shape), device=device).to(dtype) for _ in range(2)]
    batch = Batch(obs=obs[0], action=torch.rand(size, *env.action_shape, device=device) * 2 - 1,
                  reward=torch.rand(size, 1, device=device), discount=torch.ones(size, 1, device=device),
                  next_obs=obs[1])
    agent.update(batch, 0)  # builds what a first update builds
    update_s = _time_updates(agent, batch, device)
    threads = torch.get_num_threads()
    if device.type == "cuda" or threads == 1 or not _cpu_busy(threads):
        return update_s, step_s, update_s
    torch.set_num_threads(1)
    try:
        return update_s, step_s, _time_updates(agent, batch, device)
    finally:
        torch.set_num_threads(threads)


def _time_updates(agent, batch: Batch, device: torch.device) -> float:
    """Seconds per update of `agent` on `batch`, over `TIMED_UPDATES` consecutive ones."""
    _synchronize(device)
    started = time.perf_counter()
    for step in range(1, 1 + TIMED_UPDATES):
        agent.update(batch, step)
    _synchronize(device)
    return (time.perf_counter() - started) / TIMED_UPDATES


def _cpu_busy(threads: int) -> bool:
    """Whether other work, a core's worth at least, leaves this process fewer free cores than `threads`, by the last
    minute's load average (True where the operating system does not say)."""
    try:
        others = os.getloadavg()[0] - 1  # this process is one of the load
    except (AttributeError, OSError):
        return True
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return others >= 1 and others + threads > cores


def _meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes ({} where there is none)."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return {}
    info = {key: int(value.split()[0]) * 1024 for key, _, value in (line.partition(":") for line in lines)
            if value.split() and value.split()[0].isdigit()}
    return info if "MemAvailable" in info and "MemTotal" in info else {}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
