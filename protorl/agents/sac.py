"""Soft Actor-Critic on encoder features (appendix A): the RL core shared by every agent.

SAC never sees pixels: it takes encoder outputs. Detached ones by default, so its losses cannot reach the
representation (Proto-RL, APT, every frozen downstream agent); only when the caller passes the encoder's
optimiser (DrQ and the agents built on it) does the critic loss also train the encoder.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from protorl.agents.networks import Actor, Critic, log_prob_sum, soft_update
from protorl.agents.optim import Adam, gradient_step
from protorl.config import AgentConfig

# what `SAC.update` returns; "actor_drift" downstream from a pre-trained actor only
SAC_METRICS = ("critic_loss", "critic_q", "actor_loss", "alpha", "actor_entropy", "actor_drift")
Metrics = dict[str, torch.Tensor]  # an update's metrics: 0-d tensors on the agent's device, read back when logged


class Encoding(NamedTuple):
    """An encoder that the critic's loss trains too (DrQ's rule), with its optimiser."""

    module: nn.Module
    optimizer: Adam


class Temperature(nn.Module):
    """SAC's learned entropy temperature alpha = exp(log_alpha)."""

    def __init__(self, init_temperature: float):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(np.log(init_temperature)))  # float64, as the temperature always was

    def forward(self) -> torch.Tensor:
        return self.log_alpha.exp()


class UpdateParts(NamedTuple):
    """Which parts of one agent update run, decided on the host from the update's count, so that the update has no
    branch on its data and each combination compiles once."""

    actor: bool  # the actor's and the temperature's steps
    critic_target: bool  # the EMA of the critic's target
    anchor: torch.Tensor | None  # downstream: the penalty's coefficient toward the pre-trained actor (0-d); None: off
    ssl: bool = False  # agents with a representation loss: its step
    encoder_target: bool = False  # agents with target encoders: their EMA


class SAC:
    """Actor, clipped double-Q critic with an EMA target, and a learned temperature."""

    def __init__(self, repr_dim: int, action_dim: int, cfg: AgentConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.actor = Actor(repr_dim, action_dim, cfg.feature_dim, cfg.hidden_dim, cfg.hidden_depth,
                           (cfg.log_std_min, cfg.log_std_max)).to(device)
        self.critic = Critic(repr_dim, action_dim, cfg.feature_dim, cfg.hidden_dim, cfg.hidden_depth).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.temperature = Temperature(cfg.init_temperature).to(device)
        self.target_entropy = -float(action_dim)
        self.actor_optimizer = Adam({"actor": self.actor}, cfg.lr)
        self.critic_optimizer = Adam({"critic": self.critic}, cfg.lr)
        self.alpha_optimizer = Adam({"temperature": self.temperature}, cfg.lr)
        self.pretrained_actor: Actor | None = None  # downstream: a frozen copy of the actor it started from
        self.actor_held_until = 0  # updates before which the actor and the temperature do not learn

    def start_from_pretrained_actor(self) -> None:
        """Downstream from the exploration actor now in `self.actor`: keep a frozen copy of it (what `actor_drift`
        is measured against and `actor_anchor_coef` pulls toward) and hold the actor and the temperature for the
        first `critic_warmup_updates` updates."""
        self.pretrained_actor = copy.deepcopy(self.actor).requires_grad_(False)
        self.actor_held_until = self.cfg.critic_warmup_updates

    def anchor_coef(self, step: int) -> float:
        """The penalty toward the pre-trained actor at update `step`: `actor_anchor_coef`, decaying linearly to 0
        over `actor_anchor_updates` updates."""
        if self.pretrained_actor is None or self.cfg.actor_anchor_coef == 0:
            return 0.0
        return self.cfg.actor_anchor_coef * max(0.0, 1.0 - step / self.cfg.actor_anchor_updates)

    def parts(self, step: int) -> UpdateParts:
        """What SAC's part of update `step` runs."""
        coef = self.anchor_coef(step)
        return UpdateParts(actor=step >= self.actor_held_until and step % self.cfg.actor_update_every == 0,
                           critic_target=step % self.cfg.critic_target_update_every == 0,
                           anchor=torch.tensor(coef, device=self.device) if coef > 0 else None)

    @property
    def log_alpha(self) -> torch.Tensor:
        return self.temperature.log_alpha

    @property
    def alpha(self) -> torch.Tensor:
        return self.temperature()

    def act(self, features: torch.Tensor, sample: bool) -> torch.Tensor:
        """(B, repr) -> (B, |A|) actions in [-1, 1]: a policy sample, or the policy's mean."""
        dist = self.actor(features)
        return dist.sample() if sample else dist.mean

    @torch.no_grad()
    def update(self, features: torch.Tensor, action: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor,
               next_features: torch.Tensor, parts: UpdateParts, encoder: Encoding | None = None) -> Metrics:
        """One SAC update on encoder features y_t, y_{t+1} (B, repr); reward, discount (B, 1).

        Features must be detached. With `encoder` (DrQ's rule), `features` are observations instead: the critic
        loss encodes them and steps the encoder too; the actor sees the encoding detached.
        """
        if next_features.requires_grad or features.requires_grad:
            raise ValueError("SAC.update expects detached features: RL gradients must not reach the encoder")
        metrics, features = self.update_critic(features, action, reward, discount, next_features, encoder)
        if parts.actor:
            metrics.update(self.update_actor_and_alpha(features, parts.anchor))
        if parts.critic_target:
            soft_update(self.critic, self.critic_target, self.cfg.critic_target_tau)
        return metrics

    def update_critic(self, features: torch.Tensor, action: torch.Tensor, reward: torch.Tensor,
                      discount: torch.Tensor, next_features: torch.Tensor, encoder: Encoding | None = None
                      ) -> tuple[Metrics, torch.Tensor]:
        """The twin critics' soft Bellman loss on (B, 1) targets. With `encoder`, `features` are observations that
        the loss encodes, and the same step trains the encoder (DrQ's rule). Returns the metrics and the features
        (B, R) as the step saw them."""
        dist = self.actor(next_features)
        next_action = dist.rsample()
        target_q1, target_q2 = self.critic_target(next_features, next_action)
        target_v = torch.min(target_q1, target_q2) - self.alpha * log_prob_sum(dist, next_action)
        target_q = reward + discount * self.cfg.discount * target_v  # (B, 1)

        def critic_loss(inputs: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
            features = inputs if encoder is None else encoder.module(inputs)  # (B, R)
            q1, q2 = self.critic(features, action)
            return F.mse_loss(q1, target_q) + F.mse_loss(q2, target_q), (q1.mean(), features)

        optimizers = [self.critic_optimizer] + ([encoder.optimizer] if encoder is not None else [])
        critic_loss, (critic_q, features) = gradient_step(critic_loss, (features,), *optimizers)
        return {"critic_loss": critic_loss, "critic_q": critic_q}, features

    def update_actor_and_alpha(self, features: torch.Tensor, anchor: torch.Tensor | None = None) -> Metrics:
        """The actor's loss (with the penalty toward the pre-trained actor, coefficient `anchor`, if any), then the
        temperature's; `features` (B, R) are detached."""
        alpha = self.alpha
        pretrained_mean = None if self.pretrained_actor is None else self.pretrained_actor(features).mean  # (B, |A|)

        def actor_loss(features: torch.Tensor):
            dist = self.actor(features)
            action = dist.rsample()
            log_prob = log_prob_sum(dist, action)
            q1, q2 = self.critic(features, action)  # the actor loss needs dQ/da only
            loss = (alpha * log_prob - torch.min(q1, q2)).mean()
            if pretrained_mean is None:
                return loss, (log_prob,)
            drift = (dist.mean - pretrained_mean).square().sum(dim=-1)  # (B,) squared distance of mean actions
            if anchor is not None:
                loss = loss + anchor * drift.mean()
            return loss, (log_prob, drift)

        actor_loss, (log_prob, *drift) = gradient_step(actor_loss, (features,), self.actor_optimizer)

        def alpha_loss(log_prob: torch.Tensor) -> tuple[torch.Tensor, tuple]:
            return (self.alpha * (-log_prob - self.target_entropy)).mean(), ()

        gradient_step(alpha_loss, (log_prob,), self.alpha_optimizer)
        metrics = {"actor_loss": actor_loss, "alpha": self.alpha, "actor_entropy": -log_prob.mean()}
        if drift:
            metrics["actor_drift"] = drift[0].sqrt().mean()  # mean L2 distance, in action units ([-1, 1] per dim)
        return metrics

    # -- persistence --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = {"actor": self.actor.state_dict(), "critic": self.critic.state_dict(),
                 "critic_target": self.critic_target.state_dict(), "log_alpha": self.log_alpha.detach().clone(),
                 "actor_optimizer": self.actor_optimizer.state_dict(),
                 "critic_optimizer": self.critic_optimizer.state_dict(),
                 "alpha_optimizer": self.alpha_optimizer.state_dict()}
        if self.pretrained_actor is not None:
            state["pretrained_actor"] = self.pretrained_actor.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        if "pretrained_actor" in state:
            if self.pretrained_actor is None:
                self.start_from_pretrained_actor()
            self.pretrained_actor.load_state_dict(state["pretrained_actor"])
