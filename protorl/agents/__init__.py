"""The agents: Proto-RL and the paper's baselines, each in its own module with its own config class.

Adding an agent: its module (an `Agent` subclass and, if it has hyper-parameters of its own, an `AgentConfig`
subclass), its YAML in protorl/conf/agent/, and one entry in `AGENTS` below (README, "Adding an agent").
"""

from __future__ import annotations

import dataclasses

import torch

from protorl.agents.apt import APTAgent
from protorl.agents.base import MODES, Agent
from protorl.agents.drq import DrQAgent
from protorl.agents.icm import ICMAgent
from protorl.agents.proto import ProtoAgent
from protorl.agents.random_policy import RandomAgent
from protorl.agents.sac import SAC
from protorl.config import AgentConfig, ConfigError

AGENTS: dict[str, type[Agent]] = {cls.name: cls for cls in (ProtoAgent, RandomAgent, ICMAgent, APTAgent, DrQAgent)}


def agent_class(name: str) -> type[Agent]:
    """The agent registered as `name`; `ConfigError` listing the registered ones otherwise."""
    if name not in AGENTS:
        raise ConfigError(f"invalid config value agent={name!r}: expected one of {', '.join(AGENTS)} "
                          "(set with agent=NAME)")
    return AGENTS[name]


def agent_config(cfg: AgentConfig) -> AgentConfig:
    """`cfg` as an instance of its agent's config class (a plain `AgentConfig` gets that class's defaults for the
    agent's own fields)."""
    config_class = agent_class(cfg.name).config_class
    if type(cfg) is config_class:
        return cfg
    shared = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(AgentConfig)}
    return config_class(**shared)


def make_agent(cfg: AgentConfig, obs_type: str, obs_shape: tuple[int, ...], action_shape: tuple[int, ...],
               device: torch.device, mode: str) -> Agent:
    """The agent named `cfg.name` for `mode` (one of `MODES`)."""
    return agent_class(cfg.name)(obs_type, obs_shape, action_shape, agent_config(cfg), device, mode)


__all__ = ["AGENTS", "MODES", "SAC", "APTAgent", "Agent", "DrQAgent", "ICMAgent", "ProtoAgent", "RandomAgent",
           "agent_class", "agent_config", "make_agent"]
