"""Curiosity (ICM, Pathak et al. 2017) as adapted in appendix C.4: DrQ plus forward and inverse dynamics
models on a 50-d linear projection of the encoder's features.

Pre-training: the ICM loss (forward + inverse prediction errors) trains the projection, both models and
the encoder; DrQ's critic loss also trains the encoder ("we augment DrQ with the ICM module"). The
intrinsic reward is the forward prediction error, divided by a running estimate of its standard
deviation, then log(1 + x). Downstream: a fresh SAC agent on the frozen encoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from protorl.agents.base import EncoderTrainedByCritic, Metrics, critic_through_encoder, reward_metrics
from protorl.agents.diagnostics import PROJECTION_METRICS, projection_diagnostics
from protorl.agents.inplace import InPlaceTensors
from protorl.agents.networks import mlp, orthogonal_init
from protorl.agents.optim import Adam, gradient_step
from protorl.agents.sac import UpdateParts
from protorl.config import AgentConfig, architecture, positive
from protorl.replay import Batch


@dataclass
class ICMConfig(AgentConfig):
    """Curiosity's own constants (appendix C.4)."""

    name: str = "icm"
    proj_dim: int = architecture(50)  # linear projection phi of the encoder's features
    model_hidden_dim: int = architecture(1024)  # forward and inverse models: 2-layer MLPs with ReLU

    def check(self) -> None:
        super().check()
        positive("agent", self, "proj_dim", "model_hidden_dim")


class RunningMeanStd:
    """Mean and population standard deviation of every value seen so far, merged batch by batch (Chan et al.).

    Kept in float64 tensors of one element, not 0-d ones: torch.compile (2.13) drops in-place writes to 0-d float64
    tensors it reads from an object's attributes, which would freeze the statistics of a compiled update.
    """

    def __init__(self, device: torch.device | str = "cpu"):
        zero = lambda: torch.zeros(1, dtype=torch.float64, device=device)  # noqa: E731
        self.tensors = InPlaceTensors(mean=zero(), var=zero(), count=zero())  # count: an integer, on the device

    @property
    def mean(self) -> torch.Tensor:
        return self.tensors.mean

    @property
    def var(self) -> torch.Tensor:
        return self.tensors.var

    @property
    def count(self) -> torch.Tensor:
        return self.tensors.count

    def update(self, values: torch.Tensor) -> None:
        values = values.detach().double().flatten()
        n = values.numel()
        batch_mean, batch_var = values.mean(), values.var(correction=0)
        total = self.count + n
        delta = batch_mean - self.mean
        self.var.copy_((self.var * self.count + batch_var * n + delta.square() * self.count * n / total) / total)
        self.mean.copy_(self.mean + delta * n / total)
        self.count.copy_(total)

    @property
    def std(self) -> torch.Tensor:
        return self.var.sqrt()

    def state_dict(self) -> dict:
        count = 0 if self.count.is_meta else int(self.count)  # the meta device (a snapshot's check) holds no values
        return {"mean": self.mean.reshape(()).clone(), "var": self.var.reshape(()).clone(), "count": count}

    def load_state_dict(self, state: dict) -> None:
        self.mean.copy_(state["mean"].reshape(1))
        self.var.copy_(state["var"].reshape(1))
        self.count.fill_(int(state["count"]))


def normalized_curiosity(error: torch.Tensor, stats: RunningMeanStd, eps: float = 1e-8) -> torch.Tensor:
    """Fold a batch of forward errors (B, 1) into `stats`, then reward = log(1 + error / running std)."""
    stats.update(error)
    return torch.log1p(error / (stats.std.to(error.dtype) + eps))


class ICM(nn.Module):
    """Projection phi (repr -> 50), forward model (phi, a) -> phi', inverse model (phi, phi') -> a."""

    def __init__(self, repr_dim: int, action_dim: int, proj_dim: int, hidden_dim: int):
        super().__init__()
        self.projection = nn.Linear(repr_dim, proj_dim)
        # two-layer MLPs: Linear -> ReLU -> Linear
        self.forward_model = mlp(proj_dim + action_dim, hidden_dim, proj_dim, hidden_depth=1)
        self.inverse_model = nn.Sequential(mlp(2 * proj_dim, hidden_dim, action_dim, hidden_depth=1), nn.Tanh())
        self.apply(orthogonal_init)

    def errors(self, features: torch.Tensor, action: torch.Tensor, next_features: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, repr), (B, |A|), (B, repr) -> forward and inverse errors 0.5 * ||prediction - target||^2, (B, 1) each."""
        phi, next_phi = self.projection(features), self.projection(next_features)  # (B, 50) each
        predicted_next = self.forward_model(torch.cat([phi, action], dim=1))
        predicted_action = self.inverse_model(torch.cat([phi, next_phi], dim=1))
        forward_error = 0.5 * (predicted_next - next_phi).square().sum(dim=1, keepdim=True)
        inverse_error = 0.5 * (predicted_action - action).square().sum(dim=1, keepdim=True)
        return forward_error, inverse_error


class ICMAgent(EncoderTrainedByCritic):
    """Curiosity, ICM (Pathak et al. 2017): forward and inverse models beside DrQ's critic loss train the
    encoder; the reward is the forward model's prediction error."""

    name = "icm"
    title = "Curiosity (ICM)"
    config_class = ICMConfig
    metrics = ("icm_forward_loss", "icm_inverse_loss", "intr_reward_mean", "intr_reward_std", *PROJECTION_METRICS)

    def build(self) -> None:
        super().build()
        cfg, action_dim = self.cfg, self.action_shape[0]
        self.icm = ICM(self.encoder.repr_dim, action_dim, cfg.proj_dim, cfg.model_hidden_dim).to(self.device)
        self.icm_optimizer = Adam({"icm": self.icm}, cfg.lr)
        self.curiosity_stats = RunningMeanStd(self.device)

    def representation_modules(self) -> dict[str, nn.Module]:
        return {"encoder": self.encoder, "icm": self.icm}

    def representation_statistics(self) -> dict[str, Any]:
        return {"curiosity_stats": self.curiosity_stats}

    def representation_optimizers(self) -> dict[str, Adam]:
        return {**super().representation_optimizers(), "icm": self.icm_optimizer}

    def update_pretrain(self, batch: Batch, parts: UpdateParts) -> Metrics:
        obs, next_obs = self.augmented(batch)
        _, (forward_error, inverse_error, next_features) = gradient_step(
            self.icm_loss, (obs, batch.action, next_obs), self.encoder_optimizer, self.icm_optimizer)
        intr_reward = normalized_curiosity(forward_error, self.curiosity_stats)  # (B, 1)
        diagnostics = projection_diagnostics(self.icm.projection(next_features))  # of phi(x_{t+1}), (B, 50)
        metrics = critic_through_encoder(self.encoder, self.sac, obs, batch.action, intr_reward, batch.discount,
                                         next_obs, parts, self.encoder_optimizer)
        metrics.update(icm_forward_loss=forward_error.mean(), icm_inverse_loss=inverse_error.mean(),
                       **reward_metrics("intr_reward", intr_reward), **diagnostics)
        return metrics

    def icm_loss(self, obs: torch.Tensor, action: torch.Tensor, next_obs: torch.Tensor):
        """The forward and inverse models' loss on x_t, a_t, x_{t+1}, for `gradient_step`; with it, the errors (B, 1)
        each and the features of x_{t+1} (B, R), as before the step."""
        features, next_features = self.encoder(torch.cat([obs, next_obs])).chunk(2)  # (B, R) each
        forward_error, inverse_error = self.icm.errors(features, action, next_features)
        return forward_error.mean() + inverse_error.mean(), (forward_error, inverse_error, next_features)
