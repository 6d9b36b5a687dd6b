"""Helpers for tests that build agents directly (tiny sizes, each agent's config at those sizes, one update) and a
tiny run's config for the Python API.

Not a test module: tests import it (`from tests.agents import ...`) instead of importing each other.
"""

from __future__ import annotations

import dataclasses

import torch

from protorl.agents import BUILT_IN, Agent
from protorl.config import GROUPS, AgentConfig, Config
from protorl.replay import ReplayBuffer

IMAGE_SIZE = 32
FRAME_STACK = 3
PIXEL_OBS_SHAPE = (3 * FRAME_STACK, IMAGE_SIZE, IMAGE_SIZE)
POINT_MASS_ACTION_SHAPE = (2,)
CPU = torch.device("cpu")

# sizes at which one update takes milliseconds on a CPU: batch 8, 16 prototypes of dimension 16
TINY_SHARED = {"batch_size": 8, "hidden_dim": 32, "feature_dim": 16, "state_hidden_dim": 32}
TINY_OWN = {
    "proto": {"num_prototypes": 16, "candidates_per_prototype": 2, "proj_dim": 16, "pred_hidden_dim": 32},
    "icm": {"model_hidden_dim": 32},
    "apt": {"knn_k": 3},  # APT's neighbours come from the batch of 8
}


def tiny_config(name: str = "proto", **overrides) -> AgentConfig:
    """Agent `name`'s config class at the tiny sizes (its paper values otherwise), with `overrides`."""
    fields = {"name": name, **TINY_SHARED, **TINY_OWN.get(name, {}), **overrides}
    return BUILT_IN[name].config_class(**fields)


def tiny_agent(name: str, mode: str, cfg: AgentConfig | None = None, seed: int | None = None,
               obs_type: str = "pixels", obs_shape: tuple[int, ...] = PIXEL_OBS_SHAPE,
               device: torch.device = CPU) -> Agent:
    """Agent `name` for `mode` on point_mass-sized observations, on `device` (its tiny config unless `cfg`)."""
    if seed is not None:
        torch.manual_seed(seed)
    cfg = cfg if cfg is not None else tiny_config(name)
    return BUILT_IN[name](obs_type, obs_shape, POINT_MASS_ACTION_SHAPE, cfg, device, mode)


def update(agent: Agent, replay: ReplayBuffer, step: int) -> dict[str, torch.Tensor]:
    """Sample a batch of the agent's size and run one update, as the trainer does."""
    return agent.update(replay.sample(agent.cfg.batch_size, agent.device), step)


# the tiny run of `tiny`: top-level keys, and in each group the keys it sets (the others keep their defaults)
TINY_RUN = {
    "task": "point_mass_easy", "pretrain_frames": 1000, "finetune_frames": 1000,
    "env": {"obs": "states", "action_repeat": 8},
    "training": {"seed_transitions": 20},
    "replay": {"capacity": 2000},
    "evaluation": {"episodes": 1, "every_frames": 1000},
    "analyses": {"every_frames": None},
    "snapshots": {"at_frames": []},
    "logging": {"progress_bar": False, "tensorboard": False},
    "runtime": {"threads": 1, "fast_malloc": False},
}
GROUP_CLASSES = {item.name: item.default_factory for item in dataclasses.fields(Config) if item.name in GROUPS}


def config_of(settings: dict, **fields) -> Config:
    """The `Config` of `settings` (top-level keys, and groups as dicts of some of their keys) with `fields` on top.
    A group in `fields` given as a dict changes only those of its keys (`env={"obs": "pixels"}`); given as its
    dataclass, it replaces the whole group."""
    merged = dict(settings)
    for key, value in fields.items():
        merged[key] = {**merged.get(key, {}), **value} if key in GROUPS and isinstance(value, dict) else value
    groups = {name: GROUP_CLASSES[name](**merged[name]) for name in GROUPS if isinstance(merged.get(name), dict)}
    return Config(**{**merged, **groups})


def tiny(run_dir, **fields) -> Config:
    """A tiny run from states on point_mass_easy: 1000-frame episodes of 125 agent steps (`config_of` says how
    `fields` change it)."""
    return config_of({**TINY_RUN, "agent": tiny_config("proto"), "run_dir": str(run_dir)}, **fields)
