"""Soft Actor-Critic on encoder features (appendix A): the RL core shared by every agent.

SAC never sees pixels: it takes encoder outputs. Detached ones by default, so its losses cannot reach the
representation (Proto-RL, APT, every frozen downstream agent); only when the caller passes the encoder's
optimiser (DrQ and the agents built on it) does the critic loss also train the encoder.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F

from protorl.agents.networks import Actor, Critic, log_prob_sum, soft_update
from protorl.agents.optim import make_adam, optimizer_step
from protorl.config import AgentConfig

# what `SAC.update` returns; "actor_drift" downstream from a pre-trained actor only
SAC_METRICS = ("critic_loss", "critic_q", "actor_loss", "alpha", "actor_entropy", "actor_drift")
Metrics = dict[str, torch.Tensor]  # an update's metrics: 0-d tensors on the agent's device, read back when logged


class SAC:
    """Actor, clipped double-Q critic with an EMA target, and a learned temperature."""

    def __init__(self, repr_dim: int, action_dim: int, cfg: AgentConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.actor = Actor(repr_dim, action_dim, cfg.feature_dim, cfg.hidden_dim, cfg.hidden_depth,
                           (cfg.log_std_min, cfg.log_std_max)).to(device)
        self.critic = Critic(repr_dim, action_dim, cfg.feature_dim, cfg.hidden_dim, cfg.hidden_depth).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(np.log(cfg.init_temperature), device=device, requires_grad=True)
        self.target_entropy = -float(action_dim)
        self.actor_optimizer = make_adam(self.actor.parameters(), cfg.lr)
        self.critic_optimizer = make_adam(self.critic.parameters(), cfg.lr)
        self.alpha_optimizer = make_adam([self.log_alpha], cfg.lr)
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

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.exp()

    def act(self, features: torch.Tensor, sample: bool) -> torch.Tensor:
        """(B, repr) -> (B, |A|) actions in [-1, 1]: a policy sample, or the policy's mean."""
        dist = self.actor(features)
        return dist.sample() if sample else dist.mean

    def update(self, features: torch.Tensor, action: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor,
               next_features: torch.Tensor, step: int, encoder_optimizer: torch.optim.Optimizer | None = None
               ) -> Metrics:
        """One SAC update on encoder features y_t, y_{t+1} (B, repr); reward, discount (B, 1).

        Features must be detached unless `encoder_optimizer` is given: then `features` carries the encoder's
        graph and the critic loss steps the encoder too (DrQ). The actor always sees detached features.
        """
        if next_features.requires_grad or (features.requires_grad and encoder_optimizer is None):
            raise ValueError("SAC.update expects detached features: RL gradients must not reach the encoder")
        metrics = self.update_critic(features, action, reward, discount, next_features, encoder_optimizer)
        if step >= self.actor_held_until and step % self.cfg.actor_update_every == 0:
            metrics.update(self.update_actor_and_alpha(features.detach(), step))
        if step % self.cfg.critic_target_update_every == 0:
            soft_update(self.critic, self.critic_target, self.cfg.critic_target_tau)
        return metrics

    def update_critic(self, features: torch.Tensor, action: torch.Tensor, reward: torch.Tensor,
                      discount: torch.Tensor, next_features: torch.Tensor,
                      encoder_optimizer: torch.optim.Optimizer | None = None) -> Metrics:
        """The twin critics' soft Bellman loss on (B, 1) targets; with `encoder_optimizer`, `features` carry the
        encoder's graph and the same step trains it (DrQ's rule)."""
        with torch.no_grad():
            dist = self.actor(next_features)
            next_action = dist.rsample()
            target_q1, target_q2 = self.critic_target(next_features, next_action)
            target_v = torch.min(target_q1, target_q2) - self.alpha * log_prob_sum(dist, next_action)
            target_q = reward + discount * self.cfg.discount * target_v  # (B, 1)
        q1, q2 = self.critic(features, action)
        critic_loss = F.mse_loss(q1, target_q) + F.mse_loss(q2, target_q)
        optimizers = [self.critic_optimizer] + ([encoder_optimizer] if encoder_optimizer is not None else [])
        optimizer_step(critic_loss, *optimizers)
        with torch.no_grad():
            return {"critic_loss": critic_loss.detach(), "critic_q": q1.mean()}

    def update_actor_and_alpha(self, features: torch.Tensor, step: int) -> Metrics:
        """The actor's loss (with the penalty toward the pre-trained actor, if any), then the temperature's;
        `features` (B, R) are detached."""
        dist = self.actor(features)
        action = dist.rsample()
        log_prob = log_prob_sum(dist, action)
        self.critic.requires_grad_(False)  # the actor loss needs dQ/da only, not the critic's weight grads
        q1, q2 = self.critic(features, action)
        self.critic.requires_grad_(True)
        actor_loss = (self.alpha.detach() * log_prob - torch.min(q1, q2)).mean()
        drift = None
        if self.pretrained_actor is not None:
            with torch.no_grad():
                pretrained_mean = self.pretrained_actor(features).mean  # (B, |A|)
            drift = (dist.mean - pretrained_mean).square().sum(dim=-1)  # (B,) squared distance of mean actions
            coef = self.anchor_coef(step)
            if coef > 0:
                actor_loss = actor_loss + coef * drift.mean()
        optimizer_step(actor_loss, self.actor_optimizer)

        alpha_loss = (self.alpha * (-log_prob - self.target_entropy).detach()).mean()
        optimizer_step(alpha_loss, self.alpha_optimizer)
        with torch.no_grad():
            metrics = {"actor_loss": actor_loss.detach(), "alpha": self.alpha, "actor_entropy": -log_prob.mean()}
            if drift is not None:
                metrics["actor_drift"] = drift.sqrt().mean()  # mean L2 distance, in action units ([-1, 1] per dim)
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
