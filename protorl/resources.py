"""A run's peak memory, estimated from its config before anything is allocated, and the check that refuses a run
this machine cannot hold.

The estimate of a phase is the sum of
- what this process holds (the interpreter, PyTorch, the simulator with its renderer, the plotting and logging
  libraries a run loads: loaded first, then read from the operating system),
- the replay buffer as far as the phase fills it, twice where a checkpoint or a snapshot copies it out,
- the pre-training's data a fine-tuning learns from (`pretrain_data_share`: the snapshot's replay and its
  relabelled copy),
- the agent at its peak in an update: the agent built and updated on PyTorch's meta device (shapes, no values),
  counting every tensor it holds at once: parameters, buffers, gradients, Adam's state and the activations.

The run's estimate is its largest phase. Measured against the peak resident memory of tiny runs:
docs/runs.md ("Memory").
"""

from __future__ import annotations

import logging
import os
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from protorl.agents import agent_class, make_agent
from protorl.config import Config, ConfigError, downstream_tasks
from protorl.envs import make_env
from protorl.replay import Batch, ReplayBuffer
from protorl.runtime import resolve_device

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

    @property
    def total(self) -> int:
        return self.process + self.replay + self.pretrain_data + self.agent


def estimate_memory(cfg: Config, command: str, pretrained: dict | None = None) -> MemoryEstimate:
    """The largest phase `command` runs with `cfg`; `pretrained`: the snapshot a fine-tuning starts from."""
    agent = agent_class(cfg.agent.name)
    pretrains = agent.supports("pretrain")
    phases = []  # (name, agent mode, task, frames)
    if command in ("pretrain", "train") and pretrains and cfg.pretrain_frames > 0:
        phases.append(("pretrain", "pretrain", cfg.pretrain_env or cfg.env, cfg.pretrain_frames))
    if command in ("finetune", "train"):
        from_snapshot = pretrained is not None or (command == "train" and bool(phases))
        if from_snapshot:
            phases.append(("finetune", "frozen", downstream_tasks(cfg)[0], cfg.finetune_frames))
        if not from_snapshot or (cfg.compare_without_pretraining and agent.supports("online")):
            phases.append(("scratch", "online", downstream_tasks(cfg)[0], cfg.finetune_frames))
    process = 0
    pretrain_replay = 0
    estimates = []
    for name, mode, task, frames in phases:
        env = make_env(task, cfg, seed=0)
        try:
            env.reset()  # from pixels, its renderer starts
            _load_libraries(cfg)
            process = max(process, resident_bytes())
            slot = _replay_bytes_per_slot(env, keeps_states=(name == "pretrain"))
            agent_bytes = _agent_peak_bytes(cfg, env, mode)
        finally:
            env.close()
        # at most a slot per agent step and one per episode start
        written = min(cfg.replay_capacity, 2 * (frames // cfg.action_repeat) + 1)
        copies = 2 if cfg.checkpoint_every_frames or cfg.checkpoint_every_minutes or cfg.snapshot_replay else 1
        replay = copies * written * slot
        if name == "pretrain":
            pretrain_replay = written * slot
        data = 0
        if name == "finetune" and cfg.pretrain_data_share > 0:
            data = 2 * (_nbytes(pretrained["replay"]) if pretrained and "replay" in pretrained else pretrain_replay)
        estimates.append(MemoryEstimate(name, process, replay, data, agent_bytes, cfg.replay_capacity * slot))
    return max(estimates, key=lambda estimate: estimate.total)


def check_memory(cfg: Config, command: str, pretrained: dict | None = None) -> MemoryEstimate:
    """Raise `ConfigError` if the run's estimate exceeds the memory available now (the host's; on a GPU, the agent
    goes to the GPU's free memory), or its replay buffer the memory this machine has; the estimate otherwise.
    The host's side is skipped where the operating system does not say how much memory there is."""
    estimate = estimate_memory(cfg, command, pretrained)
    device = resolve_device(cfg.device)
    on_device = estimate.agent if device.type == "cuda" else 0
    if on_device:
        free = torch.cuda.mem_get_info(device)[0]
        if on_device > free:
            raise ConfigError(f"the agent would need about {on_device / GIB:.1f} GiB of {device} at its peak "
                              f"({estimate.phase}) and {free / GIB:.1f} GiB are free there; lower agent.batch_size "
                              "or the agent's sizes (its networks, prototypes, queue)")
    memory = _meminfo()
    if not memory:
        return estimate
    reservable = memory["MemTotal"] + memory.get("SwapTotal", 0)
    if estimate.replay_reserved > reservable:
        raise ConfigError(f"invalid config value replay_capacity={cfg.replay_capacity}: the buffer would reserve "
                          f"{estimate.replay_reserved / GIB:.1f} GiB and this machine has "
                          f"{reservable / GIB:.1f} GiB of memory and swap; lower replay_capacity")
    parts = (f"{estimate.process / GIB:.1f} GiB already held, replay {estimate.replay / GIB:.1f}, pre-training "
             f"data {estimate.pretrain_data / GIB:.1f}, agent {(estimate.agent - on_device) / GIB:.1f}")
    host = estimate.total - on_device
    if host > memory["MemAvailable"]:
        largest = max(("replay", estimate.replay), ("pretrain_data", estimate.pretrain_data),
                      ("agent", estimate.agent - on_device), key=lambda item: item[1])[0]
        advice = {"replay": "lower replay_capacity or the frames", "pretrain_data": "lower pretrain_data_share to 0",
                  "agent": "lower agent.batch_size or the agent's sizes (its networks, prototypes, queue)"}[largest]
        raise ConfigError(f"this run would need about {host / GIB:.1f} GiB at its peak ({estimate.phase}: {parts}) "
                          f"and {memory['MemAvailable'] / GIB:.1f} GiB are available; {advice}")
    log.debug("memory at the peak, estimated: %.2f GiB of the host's (%s), %.2f GiB of %s", host / GIB, parts,
              on_device / GIB, device)
    return estimate


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


def _load_libraries(cfg: Config) -> None:
    """Import what a run loads on its way (its plots, TensorBoard), so that the memory it holds is counted."""
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401
    if cfg.tensorboard:
        import torch.utils.tensorboard  # noqa: F401


def _replay_bytes_per_slot(env, keeps_states: bool) -> int:
    """Bytes of one slot of the replay buffer the trainer builds for `env` (physical states kept or not)."""
    one_slot = ReplayBuffer(env.frame_shape, env.frame_dtype, env.action_shape, capacity=1, frame_stack=1,
                            physical_state_shape=env.physical_state_shape if keeps_states else None)
    return one_slot.nbytes


def _nbytes(tree) -> int:
    """Bytes of every tensor in a nested dict or list."""
    return sum(leaf.nbytes for leaf in torch.utils._pytree.tree_leaves(tree) if isinstance(leaf, torch.Tensor))


def _agent_peak_bytes(cfg: Config, env, mode: str) -> int:
    """The most bytes the agent holds at once over its build and two updates (the first creates Adam's state),
    all run on the meta device."""
    meta = torch.device("meta")
    dtype = torch.uint8 if env.obs_type == "pixels" else torch.float32
    with torch.device(meta), _LiveBytes() as live:
        agent = make_agent(cfg.agent, env.obs_type, env.obs_shape, env.action_shape, meta, mode)
        size = cfg.agent.batch_size
        batch = Batch(obs=torch.empty(size, *env.obs_shape, dtype=dtype), action=torch.empty(size, *env.action_shape),
                      reward=torch.empty(size, 1), discount=torch.empty(size, 1),
                      next_obs=torch.empty(size, *env.obs_shape, dtype=dtype))
        for step in (1, 2):
            agent.update(batch, step)
    return live.peak


class _LiveBytes(TorchDispatchMode):
    """Counts the bytes of the storages that operators allocate while it is active, and their peak; a storage
    counts until it is freed."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        returns = func._schema.returns
        if not returns:
            return out
        if len(returns) == 1:  # one tensor, or one list of them (e.g. the _foreach_ operators)
            pairs = [(returns[0], tensor) for tensor in (out if isinstance(out, (tuple, list)) else (out,))]
        else:
            pairs = list(zip(returns, out, strict=True))
        for returned, tensor in pairs:
            if isinstance(tensor, torch.Tensor) and returned.alias_info is None:  # a new storage, not a view
                storage = tensor.untyped_storage()
                self._count(storage.nbytes())
                weakref.finalize(storage, self._count, -storage.nbytes())
        return out

    def _count(self, nbytes: int) -> None:
        self.live += nbytes
        self.peak = max(self.peak, self.live)
