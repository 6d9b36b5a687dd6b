"""Agents: the SAC core and the base class shared by every method, Proto-RL and the paper's baselines."""

from __future__ import annotations

import torch

from protorl.agents.apt import APTAgent
from protorl.agents.base import Agent
from protorl.agents.drq import DrQAgent
from protorl.agents.icm import ICMAgent
from protorl.agents.proto import ProtoAgent
from protorl.agents.random_policy import RandomAgent
from protorl.agents.sac import SAC
from protorl.config import AgentConfig

AGENTS: dict[str, type[Agent]] = {cls.name: cls for cls in (ProtoAgent, RandomAgent, ICMAgent, APTAgent, DrQAgent)}


def make_agent(obs_type: str, obs_shape: tuple[int, ...], action_shape: tuple[int, ...], cfg: AgentConfig,
               device: torch.device, phase: str, train_representation: bool | None = None) -> Agent:
    """The agent named `cfg.name` (one of `AGENTS`) for `phase`."""
    if cfg.name not in AGENTS:
        raise ValueError(f"unknown agent {cfg.name!r}; valid agents: {', '.join(AGENTS)}")
    return AGENTS[cfg.name](obs_type, obs_shape, action_shape, cfg, device, phase, train_representation)


__all__ = ["AGENTS", "SAC", "APTAgent", "Agent", "DrQAgent", "ICMAgent", "ProtoAgent", "RandomAgent", "make_agent"]
