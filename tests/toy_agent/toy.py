"""A toy agent, written the way the README's "Adding an agent" says: this module, a YAML (conf/agent/toy.yaml
next to it) and one registry entry (`register`). Its reward: how far the frozen random features move in a step."""

from __future__ import annotations

from dataclasses import dataclass

from protorl.agents import AGENTS
from protorl.agents.base import Agent, frozen_features, reward_metrics
from protorl.config import AgentConfig, invalid
from protorl.replay import Batch


@dataclass
class ToyConfig(AgentConfig):
    name: str = "toy"
    reward_scale: float = 1.0  # r_intr = reward_scale * ||y_{t+1} - y_t||

    def check(self) -> None:
        super().check()
        if self.reward_scale <= 0:
            raise invalid("agent.reward_scale", self.reward_scale, "a positive number")


class ToyAgent(Agent):
    name = "toy"
    config_class = ToyConfig
    metrics = ("intr_reward_mean", "intr_reward_std")

    def update_pretrain(self, batch: Batch, step: int) -> dict[str, float]:
        obs, next_obs = self.augmented(batch)
        features, next_features = frozen_features(self.encoder, obs, next_obs)  # (B, R) each
        reward = self.cfg.reward_scale * (next_features - features).norm(dim=1, keepdim=True)  # (B, 1)
        metrics = self.sac.update(features, batch.action, reward, batch.discount, next_features, step)
        return {**metrics, **reward_metrics("intr_reward", reward)}


def register() -> None:
    """The registry entry: in protorl/agents/__init__.py it is one more class in `AGENTS`."""
    AGENTS[ToyAgent.name] = ToyAgent


def run_command(command: str) -> None:
    """Register the toy agent, then run protorl-<command> as its console script does."""
    register()
    from protorl import cli

    getattr(cli, command)()


if __name__ == "__main__":
    import sys

    run_command(sys.argv.pop(1))
