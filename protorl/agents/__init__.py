"""The agents: Proto-RL and the paper's baselines, each in its own module with its own config class.

Adding an agent (docs, "Adding an agent"): an `Agent` subclass and, if it has hyper-parameters of its own, an
`AgentConfig` subclass. Another installed package adds it with no edit to protorl, through the entry-point group
`protorl.agents` of its pyproject.toml:

    [project.entry-points."protorl.agents"]
    my_agent = "my_package.my_module:MyAgent"

after which `agent=my_agent` selects it, with its config class's defaults.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from importlib.metadata import entry_points

import torch

from protorl.agents.apt import APTAgent
from protorl.agents.base import MODES, Agent
from protorl.agents.drq import DrQAgent
from protorl.agents.icm import ICMAgent
from protorl.agents.proto.agent import ProtoAgent
from protorl.agents.random_policy import RandomAgent
from protorl.agents.sac import SAC
from protorl.config import AgentConfig, Config, ConfigError, invalid
from protorl.errors import did_you_mean

BUILT_IN: dict[str, type[Agent]] = {cls.name: cls for cls in (ProtoAgent, RandomAgent, ICMAgent, APTAgent, DrQAgent)}
ENTRY_POINT_GROUP = "protorl.agents"


@cache
def registered_agents() -> dict[str, type[Agent]]:
    """Every agent by name: protorl's own, then those installed packages add through `ENTRY_POINT_GROUP`."""
    agents = dict(BUILT_IN)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        where = f"entry point {entry.name} = {entry.value!r} of group {ENTRY_POINT_GROUP!r}"
        try:
            cls = entry.load()
        except Exception as error:  # noqa: BLE001 -- an installed package's import error, reported in one line
            raise ConfigError(f"{where}: cannot be loaded ({type(error).__name__}: {error})") from None
        if not (isinstance(cls, type) and issubclass(cls, Agent)):
            raise ConfigError(f"{where}: names {cls!r}, not a subclass of protorl.agents.Agent")
        if entry.name in BUILT_IN or entry.name != cls.name:
            raise ConfigError(f"{where}: its name must be the class's `name` ({cls.name!r}) and not one of "
                              f"protorl's own agents ({', '.join(BUILT_IN)})")
        if callable(getattr(cls, "steps", None)) and cls.parts is Agent.parts:  # its override would not be called
            raise ConfigError(f"{where}: defines steps(step), which protorl now calls parts(step) (returning "
                              "protorl.agents.sac.UpdateParts, formerly UpdateSteps): rename it")
        agents[entry.name] = cls
    return agents


def agent_class(name: str) -> type[Agent]:
    """The agent registered as `name`; `ConfigError` listing the registered ones otherwise."""
    agents = registered_agents()
    if name not in agents:
        raise invalid("agent", name, f"one of {', '.join(agents)} (set with agent=NAME){did_you_mean(name, agents)}")
    return agents[name]


def agent_config(cfg: AgentConfig) -> AgentConfig:
    """`cfg` as an instance of its agent's config class (a plain `AgentConfig` gets that class's defaults for the
    agent's own fields)."""
    config_class = agent_class(cfg.name).config_class
    if type(cfg) is config_class:
        return cfg
    shared = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(AgentConfig)}
    return config_class(**shared)


def pretrains(config: Config) -> bool:
    """Whether a run of `config` has a task-agnostic pre-training: its agent has one and `pretrain_frames` > 0."""
    return agent_class(config.agent.name).supports("pretrain") and config.pretrain_frames > 0


def make_agent(cfg: AgentConfig, obs_type: str, obs_shape: tuple[int, ...], action_shape: tuple[int, ...],
               device: torch.device, mode: str) -> Agent:
    """The agent named `cfg.name` for `mode` (one of `MODES`)."""
    return agent_class(cfg.name)(obs_type, obs_shape, action_shape, agent_config(cfg), device, mode)


__all__ = ["BUILT_IN", "ENTRY_POINT_GROUP", "MODES", "SAC", "APTAgent", "Agent", "DrQAgent", "ICMAgent", "ProtoAgent",
           "RandomAgent", "agent_class", "agent_config", "make_agent", "pretrains", "registered_agents"]
