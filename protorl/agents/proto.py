"""The Proto-RL agent: prototypical representation learning + entropy-driven SAC (section 4).

- "pretrain": task-agnostic. The encoder, projector, predictor and prototypes learn from L_SSL only;
  SAC learns from the intrinsic reward on detached features. Prototypes are kept unit-norm (normalised
  at creation and after every SSL step), which is the paper's "normalise before every use".
- "finetune" from a snapshot: the encoder, projector and prototypes are frozen; SAC learns from
  r + alpha * r_intr, and the candidate queue keeps being refreshed from downstream batches.
- "finetune" without pre-training (appendix H, figure 14): the pre-training update, with SAC on
  r + alpha * r_intr from the first step.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from protorl.agents.base import Agent
from protorl.networks import soft_update
from protorl.proto import (
    CandidateQueue,
    ProtoHead,
    cluster_assignment_loss,
    knn_reward,
    sample_candidates,
    sinkhorn,
)
from protorl.utils import make_adam


class ProtoAgent(Agent):
    name = "proto"
    learns_online = True
    loads_pretrained_actor = True

    def build(self) -> None:
        cfg, device = self.cfg, self.device
        self.head = ProtoHead(self.encoder.repr_dim, cfg.proj_dim, cfg.pred_hidden_dim, cfg.num_prototypes).to(device)
        self.encoder_target = copy.deepcopy(self.encoder).requires_grad_(False)
        self.projector_target = copy.deepcopy(self.head.projector).requires_grad_(False)
        self.queue = CandidateQueue(cfg.num_prototypes * cfg.candidates_per_prototype, cfg.proj_dim, device)
        self.repr_optimizer = make_adam([*self.encoder.parameters(), *self.head.parameters()], cfg.lr)

    # -- learning -----------------------------------------------------------------------------------
    def update_pretrain(self, obs, action, discount, next_obs, step: int) -> dict[str, float]:
        return self._update_with_ssl(obs, action, None, discount, next_obs, step)

    def update_online(self, obs, action, reward, discount, next_obs, step: int) -> dict[str, float]:
        return self._update_with_ssl(obs, action, reward, discount, next_obs, step)

    def _update_with_ssl(self, obs, action, extr_reward, discount, next_obs, step: int) -> dict[str, float]:
        """One L_SSL step, then SAC on detached features with r_intr (pretrain) or r + alpha * r_intr."""
        with torch.no_grad():
            # RL features and reward come from this step's online encoder, before its SSL update:
            # one shared forward of x_{t+1} (the paper's code runs two) and the x_t forward below is
            # reused for RL (the paper's code runs it again).
            next_features = self.encoder(next_obs)  # (B, R)
            intr_reward = self.intrinsic_reward(next_features)  # (B, 1)
        features = self.encoder(obs)  # (B, R), with gradient for L_SSL
        repr_loss = self.representation_loss(features, next_obs)
        self.repr_optimizer.zero_grad(set_to_none=True)
        repr_loss.backward()
        self.repr_optimizer.step()
        self.head.normalize_prototypes_()  # prototypes stay unit-norm between updates
        if step % self.cfg.encoder_target_update_every == 0:  # EMA after the SGD step (appendix D)
            soft_update(self.encoder, self.encoder_target, self.cfg.encoder_target_tau)
            soft_update(self.head.projector, self.projector_target, self.cfg.encoder_target_tau)

        reward = intr_reward if extr_reward is None else extr_reward + self.cfg.intr_coef * intr_reward
        metrics = self.sac.update(features.detach(), action, reward, discount, next_features, step)
        metrics.update(repr_loss=repr_loss.item(), intr_reward_mean=intr_reward.mean().item(),
                       intr_reward_std=intr_reward.std(correction=0).item())
        if extr_reward is not None:
            metrics["extr_reward_mean"] = extr_reward.mean().item()
        return metrics

    def update_frozen(self, obs, action, extr_reward, discount, next_obs, step: int) -> dict[str, float]:
        with torch.no_grad():
            features, next_features = self.encoder(torch.cat([obs, next_obs])).chunk(2)  # (B, R) each
            intr_reward = self.intrinsic_reward(next_features)
            reward = extr_reward + self.cfg.intr_coef * intr_reward
        metrics = self.sac.update(features, action, reward, discount, next_features, step)
        metrics.update(intr_reward_mean=intr_reward.mean().item(), intr_reward_std=intr_reward.std(correction=0).item(),
                       extr_reward_mean=extr_reward.mean().item())
        return metrics

    def representation_loss(self, features: torch.Tensor, next_obs: torch.Tensor) -> torch.Tensor:
        """L_SSL between online assignments p_t of x_t and Sinkhorn targets q_{t+1} of x_{t+1}.

        features: (B, R) online encoding of x_t; next_obs: (B, *obs_shape).
        """
        prototypes = self.head.prototypes  # (M, D)
        tau = self.cfg.temperature
        u = F.normalize(self.head.predictor(self.head.projector(features)), dim=1)  # (B, D)
        log_p = F.log_softmax(u @ prototypes.t() / tau, dim=1)  # (B, M)
        with torch.no_grad():
            z_target = F.normalize(self.projector_target(self.encoder_target(next_obs)), dim=1)  # (B, D)
            q = sinkhorn(z_target @ prototypes.t() / tau, self.cfg.sinkhorn_iters)  # (B, M)
        return cluster_assignment_loss(log_p, q)

    @torch.no_grad()
    def intrinsic_reward(self, next_features: torch.Tensor) -> torch.Tensor:
        """Enqueue M prototype-balanced candidates, then reward = distance to the k-th nearest one.

        next_features: (B, R) online encoding of x_{t+1} -> (B, 1).
        """
        z = self.head.project(next_features)  # (B, D), L2-normalised
        self.queue.enqueue(sample_candidates(z, self.head.prototypes))
        return knn_reward(z, self.queue.filled(), self.cfg.knn_k)

    # -- phases and persistence -----------------------------------------------------------------------
    def representation_modules(self) -> dict[str, nn.Module]:
        return {"encoder": self.encoder, "head": self.head, "encoder_target": self.encoder_target,
                "projector_target": self.projector_target, "queue": self.queue}

    def representation_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"repr": self.repr_optimizer}

    def load_pretrained(self, state: dict) -> None:
        """Start downstream from a snapshot: its representation, queue and actor; the critic and the SAC
        temperature stay freshly initialised (appendix C.6)."""
        super().load_pretrained(state)
        self.head.normalize_prototypes_()  # once: frozen from here on
