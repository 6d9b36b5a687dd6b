"""A run's peak memory, estimated from its config before anything is allocated, and the check that refuses a run
this machine cannot hold.

The estimate of a phase is the sum of
- what this process holds (the interpreter, PyTorch, the simulator with its renderer, the plotting and logging
  libraries a run loads: loaded first, then read from the operating system),
- the replay buffer as far as the phase fills it, twice where a checkpoint or a snapshot copies it out,
- the pre-training's data a fine-tuning learns from (`replay.pretrain_data_share`: the snapshot's replay, unless already
  loaded, and its relabelled copy),
- the agent at its peak in an update: the agent built and updated on PyTorch's meta device (shapes, no values),
  counting the tensors it holds at once: parameters, buffers, gradients, Adam's state and the activations. The
  gradients of activations that a backward pass holds for a moment are not counted: at the paper's pixel sizes they
  add nothing to Proto-RL's peak and 15% to APT's (batch 1024).

Each phase is checked; a run's estimate is its largest phase. Measured against the peak resident memory of tiny runs:
docs/runs.md ("Memory").
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from protorl.agents import agent_config, make_agent
from protorl.config import AgentConfig, Config, ConfigError, keeps_physical_states
from protorl.envs import Env, make_env
from protorl.replay import Batch, ReplayBuffer, frames_device
from protorl.runtime import resolve_device
from protorl.storage.atomic import payload_bytes
from protorl.training.phases import PlannedPhase, planned_phases

GIB = 2**30
log = logging.getLogger("protorl")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a phase needs at its peak, by what holds them."""

    phase: str  # "pretrain", "finetune" (from a snapshot) or "scratch" (no pre-training)
    process: int  # held by this process before the run starts
    replay: int  # the replay buffer's filled part, and its copy in a checkpoint or snapshot
    pretrain_data: int  # the pre-training's replay a fine-tuning learns from, and its relabelled copy
    agent: int  # the agent at its peak in an update
    replay_reserved: int  # the whole replay buffer, which the operating system must agree to reserve
    device_frames: int  # the replay's frames, which a run on a GPU also keeps there (`replay.on_device`)

    @property
    def total(self) -> int:
        """Every byte of the phase, wherever it lives."""
        return self.process + self.replay + self.pretrain_data + self.agent


def estimate_memory(config: Config, command: str, pretrained: dict | None = None) -> MemoryEstimate:
    """The estimate of the largest phase `command` runs with `config`; `pretrained`: the snapshot a fine-tuning
    starts from, already loaded."""
    phases = planned_phases(config, command, pretrained is not None)
    return max(phase_estimates(config, phases, pretrained), key=lambda estimate: estimate.total)


def phase_estimates(config: Config, phases: Sequence[PlannedPhase],
                    pretrained: dict | None = None) -> list[MemoryEstimate]:
    """The estimate of each kind of phase of `phases` (a run's, in order), in that order."""
    first_of_kind = {}  # the tasks of a domain share their observation and action shapes: one phase of each kind
    for phase in phases:
        first_of_kind.setdefault(phase.kind, phase)
    phases = list(first_of_kind.values())
    process, pretrain_replay, estimates = 0, 0, []  # process: this process's memory, read as each phase loads
    for phase in phases:
        name, frames = phase.kind, phase.frames
        env = make_env(phase.task, config.env, seed=0)
        try:
            env.reset()  # from pixels, its renderer starts
            _load_libraries(config)
            process = max(process, resident_bytes())
            slot = _replay_bytes_per_slot(env, keeps_physical_states(config, phase.phase))
            device_frames = config.replay.capacity * math.prod(env.frame_shape) * env.frame_dtype.itemsize
            agent_bytes = _agent_peak_bytes(config, env, phase.agent_mode)
        finally:
            env.close()
        # a slot per agent step and one per episode's first frame: at most twice the steps
        written = min(config.replay.capacity, 2 * (frames // config.env.action_repeat) + 1)
        copied = (config.checkpoints.every_frames or config.checkpoints.every_minutes
                  or (name == "pretrain" and config.snapshots.with_replay))  # a checkpoint or snapshot copies it out
        replay = (2 if copied else 1) * written * slot
        if name == "pretrain":
            pretrain_replay = written * slot
        data = 0
        if name == "finetune" and config.replay.pretrain_data_share > 0:
            if pretrained is not None:  # loaded already (counted in `process`): its relabelled copy
                data = payload_bytes(pretrained.get("replay", {}))
            else:  # the snapshot written by the pre-training, loaded, and its relabelled copy
                data = 2 * pretrain_replay
        estimates.append(MemoryEstimate(name, 0, replay, data, agent_bytes, config.replay.capacity * slot,
                                        device_frames))
    return [dataclasses.replace(estimate, process=process) for estimate in estimates]  # with every phase loaded


def check_memory(config: Config, phases: Sequence[PlannedPhase], pretrained: dict | None = None) -> MemoryEstimate:
    """Raise `ConfigError` if the estimate of one of `phases` (a run's) exceeds the memory available now (the
    host's; on a GPU, the agent goes to the GPU's free memory), or its replay buffer the memory this machine has;
    the largest phase's estimate otherwise. The host's side is skipped where the operating system does not say how
    much memory there is."""
    estimates = phase_estimates(config, phases, pretrained)
    device = resolve_device(config.runtime.device)
    memory = _meminfo()
    for estimate in estimates:
        on_device = 0
        if device.type == "cuda":  # the agent, and the replay's frames where the run will keep them there too
            frames_there = frames_device(device, estimate.device_frames, config.replay.on_device) is not None
            on_device = estimate.agent + (estimate.device_frames if frames_there else 0)
            free = torch.cuda.mem_get_info(device)[0]
            if on_device > free:
                frames = " with the replay's frames (replay.on_device=false keeps them on the host)" \
                    if frames_there else ""
                raise ConfigError(f"the agent would need about {on_device / GIB:.1f} GiB of {device} at its peak "
                                  f"({estimate.phase}){frames} and {free / GIB:.1f} GiB are free there; lower "
                                  "agent.batch_size or the agent's sizes (its networks, prototypes, queue)")
        if not memory:
            continue
        reservable = memory["MemTotal"] + memory.get("SwapTotal", 0)
        if estimate.replay_reserved > reservable:
            raise ConfigError(f"invalid config value replay.capacity={config.replay.capacity}: the buffer would "
                              f"reserve {estimate.replay_reserved / GIB:.1f} GiB and this machine has "
                              f"{reservable / GIB:.1f} GiB of memory and swap; lower replay.capacity")
        host_agent = estimate.agent if device.type != "cuda" else 0
        host = estimate.process + estimate.replay + estimate.pretrain_data + host_agent
        parts = (f"{estimate.process / GIB:.1f} GiB already held, replay {estimate.replay / GIB:.1f}, pre-training "
                 f"data {estimate.pretrain_data / GIB:.1f}, agent {host_agent / GIB:.1f}")
        if host > memory["MemAvailable"]:
            largest = max(("replay", estimate.replay), ("pretrain_data", estimate.pretrain_data),
                          ("agent", host_agent), key=lambda item: item[1])[0]
            advice = {"replay": "lower replay.capacity or the frames",
                      "pretrain_data": "lower replay.pretrain_data_share to 0",
                      "agent": "lower agent.batch_size or the agent's sizes (its networks, prototypes, queue)"}
            raise ConfigError(f"this run would need about {host / GIB:.1f} GiB at its peak ({estimate.phase}: "
                              f"{parts}) and {memory['MemAvailable'] / GIB:.1f} GiB are available; "
                              f"{advice[largest]}")
        log.debug("memory at the peak of %s, estimated: %.2f GiB of the host's (%s)%s", estimate.phase, host / GIB,
                  parts, f", {on_device / GIB:.2f} GiB of {device}" if on_device else "")
    return max(estimates, key=lambda estimate: estimate.total)


def resident_bytes() -> int:
    """This process's resident memory now (0 where the operating system does not say)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def _meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes ({} where there is none)."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return {}
    info = {}
    for line in lines:
        key, _, value = line.partition(":")
        fields = value.split()
        if fields and fields[0].isdigit():
            info[key] = int(fields[0]) * (1024 if fields[-1] == "kB" else 1)
    return info if "MemAvailable" in info and "MemTotal" in info else {}


def _load_libraries(config: Config) -> None:
    """Import what a run loads on its way (its plots, TensorBoard), so that the memory it holds is counted."""
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401
    if config.logging.tensorboard:
        import torch.utils.tensorboard  # noqa: F401


def _replay_bytes_per_slot(env: Env, keeps_states: bool) -> int:
    """Bytes of one slot of the replay buffer the trainer builds for `env` (physical states kept or not)."""
    one_slot = ReplayBuffer(env.frame_shape, env.frame_dtype, env.action_shape, capacity=1, frame_stack=1,
                            physical_state_shape=env.physical_state_shape if keeps_states else None)
    return one_slot.nbytes


def _agent_peak_bytes(config: Config, env: Env, mode: str) -> int:
    """The most bytes the agent for `mode` holds at once over its build and two updates (the first creates Adam's
    state) that run every part of it: built and updated on the meta device, in float32 throughout."""
    agent_cfg = dataclasses.replace(agent_config(config.agent), bf16_autocast=False)  # meta has no autocast
    meta = torch.device("meta")
    dtype = torch.uint8 if env.obs_type == "pixels" else torch.float32
    with torch.device(meta), _LiveBytes() as live:
        agent = make_agent(agent_cfg, env.obs_type, env.obs_shape, env.action_shape, meta, mode)
        size = agent_cfg.batch_size
        batch = Batch(obs=torch.empty(size, *env.obs_shape, dtype=dtype), action=torch.empty(size, *env.action_shape),
                      reward=torch.empty(size, 1), discount=torch.empty(size, 1),
                      next_obs=torch.empty(size, *env.obs_shape, dtype=dtype))
        for step in steps_running_every_schedule(agent_cfg):
            agent.update(batch, step)
    return live.peak


def steps_running_every_schedule(agent_cfg: AgentConfig) -> tuple[int, int]:
    """Two update steps at which every update period of the agent (its config's fields marked `period`) falls due,
    after any critic warm-up."""
    period = math.lcm(*(getattr(agent_cfg, item.name) for item in dataclasses.fields(agent_cfg)
                        if item.metadata.get("period")))
    first = period * max(1, math.ceil(agent_cfg.critic_warmup_updates / period))
    return first, first + period


class _LiveBytes(TorchFunctionMode):
    """Counts the bytes of the storages that torch functions return while it is active, and their peak; a storage
    counts until it is freed. A backward pass counts, at its start, the gradients it will create: those of the
    leaves the loss reaches that hold none yet."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: weakref.WeakSet = weakref.WeakSet()  # the storages counted and still alive

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = []
        if func in (torch.Tensor.backward, torch.autograd.backward):
            leaves = _leaves_without_grad(args[0])
            pending = sum(leaf.untyped_storage().nbytes() for leaf in leaves)
            self.peak = max(self.peak, self.live + pending)
        elif func is torch.autograd.grad:  # the gradients it returns, counted as it starts
            inputs = args[1] if len(args) > 1 else kwargs["inputs"]
            self.peak = max(self.peak, self.live + sum(t.untyped_storage().nbytes() for t in _tensors(inputs)))
        out = func(*args, **kwargs)
        for tensor in _tensors(out) + [leaf.grad for leaf in leaves if leaf.grad is not None]:
            self._add(tensor)
        return out

    def _add(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        if storage not in self._seen:  # a new storage, not a view of one counted already
            self._seen.add(storage)
            self._count(storage.nbytes())
            weakref.finalize(storage, self._count, -storage.nbytes())

    def _count(self, nbytes: int) -> None:
        self.live += nbytes
        self.peak = max(self.peak, self.live)


def _tensors(value) -> list[torch.Tensor]:
    """The tensors in nested tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [tensor for item in value for tensor in _tensors(item)]
    if isinstance(value, dict):
        return [tensor for item in value.values() for tensor in _tensors(item)]
    return []


def _leaves_without_grad(losses) -> list[torch.Tensor]:
    """The leaf tensors the graphs of `losses` reach that hold no gradient yet."""
    stack = [loss.grad_fn for loss in _tensors(losses) if loss.grad_fn is not None]
    seen, leaves = set(), []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        leaf = getattr(node, "variable", None)  # an AccumulateGrad node holds its leaf
        if isinstance(leaf, torch.Tensor) and leaf.grad is None:
            leaves.append(leaf)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return leaves
