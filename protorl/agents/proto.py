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
import logging

import torch
import torch.nn.functional as F
from torch import nn

from protorl.agents.base import Agent
from protorl.diagnostics import projection_diagnostics, sinkhorn_entropy
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

log = logging.getLogger("protorl")


class ProtoAgent(Agent):
    name = "proto"
    learns_online = True
    loads_pretrained_actor = True

    def build(self) -> None:
        cfg, device = self.cfg, self.device
        self.head = ProtoHead(self.encoder.repr_dim, cfg.proj_dim, cfg.pred_hidden_dim, cfg.num_prototypes,
                              cfg.anti_collapse, cfg.anti_collapse_momentum).to(device)
        if cfg.anti_collapse != "none" and cfg.reward_space == "sphere":
            log.warning("agent.anti_collapse=%s with agent.reward_space=sphere: centred projections on the sphere "
                        "reward the frames projected near their mean, where the agent has been most (README, "
                        "'Keeping the prototypes alive'); agent.reward_space=raw avoids it", cfg.anti_collapse)
        self.encoder_target = copy.deepcopy(self.encoder).requires_grad_(False)
        self.projector_target = copy.deepcopy(self.head.projector).requires_grad_(False).eval()  # batch stats only
        self.queue = CandidateQueue(cfg.num_prototypes * cfg.candidates_per_prototype, cfg.proj_dim, device)
        self.repr_optimizer = make_adam([*self.encoder.parameters(), *self.head.parameters()], cfg.lr)

    # -- learning -----------------------------------------------------------------------------------
    def update_pretrain(self, obs, action, discount, next_obs, step: int) -> dict[str, float]:
        return self._update_with_ssl(obs, action, None, discount, next_obs, step)

    def update_online(self, obs, action, reward, discount, next_obs, step: int) -> dict[str, float]:
        return self._update_with_ssl(obs, action, reward, discount, next_obs, step)

    def _update_with_ssl(self, obs, action, extr_reward, discount, next_obs, step: int) -> dict[str, float]:
        """An L_SSL step (every `ssl_update_every` updates), then SAC on detached features with r_intr
        (pre-training) or r + alpha * r_intr."""
        cfg = self.cfg
        metrics: dict[str, float] = {}
        with torch.no_grad():
            # RL features and reward come from this step's online encoder, before its SSL update:
            # one shared forward of x_{t+1} (the paper's code runs two) and the x_t forward below is
            # reused for RL (the paper's code runs it again).
            next_features = self.encoder(next_obs)  # (B, R)
            next_linear = self.head.projector.linear(next_features)  # (B, D)
            next_raw = self.head.projector.anti_collapse_step(next_linear)  # (B, D), before L2 normalisation
            intr_reward = self.intrinsic_reward(next_raw)  # (B, 1)
        if step % cfg.ssl_update_every == 0:
            features = self.encoder(obs)  # (B, R), with gradient for L_SSL
            repr_loss, target_q = self.representation_loss(features, next_obs)
            self.repr_optimizer.zero_grad(set_to_none=True)
            repr_loss.backward()
            self.repr_optimizer.step()
            self.head.normalize_prototypes_()  # prototypes stay unit-norm between updates
            features = features.detach()
            metrics.update(repr_loss=repr_loss.item(), **{"repr/target_entropy": sinkhorn_entropy(target_q)})
        else:
            with torch.no_grad():
                features = self.encoder(obs)
        if step % cfg.encoder_target_update_every == 0:  # EMA on its own schedule, after this update's SGD step if any
            soft_update(self.encoder, self.encoder_target, cfg.encoder_target_tau)
            soft_update(self.head.projector, self.projector_target, cfg.encoder_target_tau)

        reward = intr_reward if extr_reward is None else extr_reward + cfg.intr_coef * intr_reward
        metrics.update(self.sac.update(features, action, reward, discount, next_features, step))
        metrics.update(intr_reward_mean=intr_reward.mean().item(), intr_reward_std=intr_reward.std(correction=0).item(),
                       **projection_diagnostics(next_linear, next_raw, self.head.prototypes))
        if extr_reward is not None:
            metrics["extr_reward_mean"] = extr_reward.mean().item()
        return metrics

    def update_frozen(self, obs, action, extr_reward, discount, next_obs, step: int) -> dict[str, float]:
        with torch.no_grad():
            features, next_features = self.encoder(torch.cat([obs, next_obs])).chunk(2)  # (B, R) each
            intr_reward = self.intrinsic_reward(self.head.projector(next_features))
            reward = extr_reward + self.cfg.intr_coef * intr_reward
        metrics = self.sac.update(features, action, reward, discount, next_features, step)
        metrics.update(intr_reward_mean=intr_reward.mean().item(), intr_reward_std=intr_reward.std(correction=0).item(),
                       extr_reward_mean=extr_reward.mean().item())
        return metrics

    def representation_loss(self, features: torch.Tensor, next_obs: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        """L_SSL between online assignments p_t of x_t and Sinkhorn targets q_{t+1} of x_{t+1}.

        features: (B, R) online encoding of x_t; next_obs: (B, *obs_shape). Returns the loss and q (B, M).
        Both projections use this batch's statistics (anti-collapse step; the paper has none).
        """
        prototypes = self.head.prototypes  # (M, D)
        tau = self.cfg.temperature
        u = F.normalize(self.head.predictor(self.head.projector(features, batch_stats=True)), dim=1)  # (B, D)
        log_p = F.log_softmax(u @ prototypes.t() / tau, dim=1)  # (B, M)
        with torch.no_grad():
            z_target = F.normalize(self.projector_target(self.encoder_target(next_obs), batch_stats=True), dim=1)
            q = sinkhorn(z_target @ prototypes.t() / tau, self.cfg.sinkhorn_iters)  # (B, M)
        return cluster_assignment_loss(log_p, q), q

    def reward_points(self, raw: torch.Tensor) -> torch.Tensor:
        """Projections before L2 normalisation (B, D) -> points of the k-NN reward's space (`agent.reward_space`)."""
        return self.head.reward_embedding(raw, self.cfg.reward_space)

    @torch.no_grad()
    def candidates(self, raw: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """M prototype-balanced candidates (M, D) in the reward space, from projections before L2
        normalisation raw (B, D): drawn by the normalised projections' similarity to the prototypes."""
        return sample_candidates(F.normalize(raw, dim=1), self.head.prototypes, generator,
                                 points=self.reward_points(raw))

    @torch.no_grad()
    def intrinsic_reward(self, raw: torch.Tensor) -> torch.Tensor:
        """Refresh the queue with M prototype-balanced candidates and score the batch against it.

        raw: (B, D) projections of x_{t+1} before L2 normalisation -> reward (B, 1), the distance to the k-th
        nearest queue entry in the reward space. The paper enqueues first, so at B < M x k each frame finds
        copies of itself among its k nearest and scores ~0; `reward_before_enqueue` scores against the
        candidates of earlier batches only (from the first update on which the queue holds k of them).
        """
        points = self.reward_points(raw)  # (B, D)
        candidates = self.candidates(raw)  # (M, D)
        score_first = self.cfg.reward_before_enqueue and self.queue.size >= self.cfg.knn_k
        if not score_first:
            self.queue.enqueue(candidates)
        reward = knn_reward(points, self.queue.filled(), self.cfg.knn_k)
        if score_first:
            self.queue.enqueue(candidates)
        return reward

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
