"""A toy agent in a package of its own, written the way the docs' "Adding an agent" says: an `Agent` subclass and
its config class, added to protorl by the entry point in pyproject.toml next to this package. Its reward: how far
the frozen random features move in a step."""

from __future__ import annotations

from dataclasses import dataclass

from protorl.agents.base import Agent, frozen_features, reward_metrics
from protorl.agents.sac import Metrics, UpdateParts
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

    def update_pretrain(self, batch: Batch, parts: UpdateParts) -> Metrics:
        obs, next_obs = self.augmented(batch)
        features, next_features = frozen_features(self.encoder, obs, next_obs)  # (B, R) each
        reward = self.cfg.reward_scale * (next_features - features).norm(dim=1, keepdim=True)  # (B, 1)
        metrics = self.sac.update(features, batch.action, reward, batch.discount, next_features, parts)
        return {**metrics, **reward_metrics("intr_reward", reward)}
