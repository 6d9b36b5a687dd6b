"""APT (Liu and Abbeel 2021): contrastive representation learning plus a particle-based entropy reward.

Pre-training: a SimCLR contrastive loss (NT-Xent between two random shifts of each observation) trains
the encoder and a projection head; SAC learns on detached features, as in Proto-RL. The reward of x_{t+1}
is log(1 + mean distance to its k nearest neighbours among the other projections of the same batch),
a batch drawn uniformly from the replay buffer: no prototypes, no queue. Downstream: a fresh SAC agent on
the frozen encoder (the paper freezes APT's encoder for a fair comparison, appendix C.4).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from protorl.agents.base import Agent, Metrics, reward_metrics
from protorl.agents.diagnostics import PROJECTION_METRICS, projection_diagnostics
from protorl.agents.knn import nearest_distances
from protorl.agents.networks import orthogonal_init
from protorl.agents.optim import Adam, gradient_step
from protorl.agents.sac import UpdateParts
from protorl.config import AgentConfig, architecture, invalid, positive
from protorl.replay import Batch


@dataclass
class APTConfig(AgentConfig):
    """APT's own constants."""

    name: str = "apt"
    proj_dim: int = architecture(128)  # contrastive projection head: Linear -> ReLU -> Linear
    contrastive_temperature: float = 0.5  # NT-Xent temperature (SimCLR's default)
    knn_k: int = 12  # neighbours averaged in the particle-based reward, within the batch

    def check(self) -> None:
        super().check()
        positive("agent", self, "proj_dim", "knn_k")
        if self.knn_k >= self.batch_size:
            raise invalid("agent.knn_k", self.knn_k, f"less than agent.batch_size={self.batch_size} "
                          "(the neighbours come from the same batch)")
        if not self.contrastive_temperature > 0:
            raise invalid("agent.contrastive_temperature", self.contrastive_temperature, "a positive number")


def nt_xent_loss(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """SimCLR's loss: each of the 2B L2-normalised views (B, D) must pick its twin among the other 2B - 1."""
    z = torch.cat([z1, z2])  # (2B, D)
    logits = z @ z.t() / temperature  # (2B, 2B)
    logits.fill_diagonal_(float("-inf"))  # a view is not its own candidate
    batch_size = z1.shape[0]
    twins = torch.cat([torch.arange(batch_size, 2 * batch_size), torch.arange(batch_size)]).to(z.device)
    return F.cross_entropy(logits, twins)


def particle_entropy_reward(z: torch.Tensor, k: int) -> torch.Tensor:
    """APT's reward log(1 + mean distance to the k nearest other rows of the batch): (B, D) -> (B, 1)."""
    distances = nearest_distances(z, z, k + 1)[:, 1:]  # (B, k): the nearest "neighbour" is the point itself
    return torch.log1p(distances.mean(dim=1, keepdim=True))


class APTAgent(Agent):
    """APT (Liu and Abbeel 2021): a SimCLR contrastive loss trains the encoder and projector; the reward is the
    particle-based k-NN distance within the batch."""

    name = "apt"
    title = "APT"
    config_class = APTConfig
    metrics = ("repr_loss", "intr_reward_mean", "intr_reward_std", *PROJECTION_METRICS)

    def build(self) -> None:
        cfg = self.cfg
        self.projector = nn.Sequential(nn.Linear(self.encoder.repr_dim, cfg.proj_dim), nn.ReLU(),
                                       nn.Linear(cfg.proj_dim, cfg.proj_dim)).to(self.device)
        self.projector.apply(orthogonal_init)
        self.repr_optimizer = Adam({"encoder": self.encoder, "projector": self.projector}, cfg.lr)

    def representation_modules(self) -> dict[str, nn.Module]:
        return {"encoder": self.encoder, "projector": self.projector}

    def representation_optimizers(self) -> dict[str, Adam]:
        return {"repr": self.repr_optimizer}

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """(B, repr) -> L2-normalised projections (B, D): the space of the contrastive loss and the reward."""
        return F.normalize(self.projector(features), dim=1)

    def update_pretrain(self, batch: Batch, parts: UpdateParts) -> Metrics:
        """Two views of x_t for the contrastive loss, one of x_{t+1} for the reward."""
        view, other_view = self.augment(batch.obs), self.augment(batch.obs)
        next_obs = self.augment(batch.next_obs)
        next_features = self.encoder(next_obs)  # (B, R)
        next_raw = self.projector(next_features)  # (B, D), before L2 normalisation
        intr_reward = particle_entropy_reward(F.normalize(next_raw, dim=1), self.cfg.knn_k)  # (B, 1)
        contrastive_loss, features = gradient_step(self.contrastive_loss, (view, other_view), self.repr_optimizer)

        metrics = self.sac.update(features, batch.action, intr_reward, batch.discount, next_features, parts)
        metrics.update(repr_loss=contrastive_loss, **reward_metrics("intr_reward", intr_reward),
                       **projection_diagnostics(next_raw))
        return metrics

    def contrastive_loss(self, view: torch.Tensor, other_view: torch.Tensor):
        """SimCLR's loss between two views of x_t, for `gradient_step`; with it, the first view's features (B, R)."""
        features, other_features = self.encoder(torch.cat([view, other_view])).chunk(2)  # (B, R) each
        loss = nt_xent_loss(self.project(features), self.project(other_features), self.cfg.contrastive_temperature)
        return loss, features
