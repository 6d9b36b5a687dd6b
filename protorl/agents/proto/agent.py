"""The Proto-RL agent: prototypical representation learning + entropy-driven SAC (section 4, appendix D).

`update_pretrain` is the paper's training routine (appendix D's pseudo-code), one step per call:
    r_t = compute_rewards(x_{t+1})          enqueue M prototype-balanced candidates, k-NN distance to the queue
    update_representations(x_t, x_{t+1})    L_SSL: online assignments p_t against Sinkhorn targets q_{t+1}
    xi = tau * xi + (1 - tau) * theta       EMA of the target encoder and projector
    update_rl(y_t, a_t, r_t, y_{t+1})       SAC on detached features: no RL gradient reaches the representation
Prototypes are unit-norm whenever they are used: normalised at creation, after every SSL step and on loading
(the paper's code normalises them at the start of each SSL step instead, to the same effect).

Downstream ("frozen", from a snapshot): encoder, projector and prototypes frozen; SAC learns from
r + alpha * r_intr, and the queue keeps being refreshed from downstream batches. Without pre-training
("online", appendix H, figure 14): the pre-training update, with SAC on r + alpha * r_intr from the first step.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from protorl.agents.base import Agent, Metrics, frozen_features, intrinsic_share, reward_metrics
from protorl.agents.diagnostics import (
    PROJECTION_METRICS,
    PROTOTYPE_METRICS,
    collapse_message,
    projection_diagnostics,
    sinkhorn_entropy,
)
from protorl.agents.networks import soft_update
from protorl.agents.optim import Adam, gradient_step
from protorl.agents.proto.math import (
    ANTI_COLLAPSE,
    REWARD_SPACES,
    CandidateQueue,
    ProtoHead,
    cluster_assignment_loss,
    knn_reward,
    sample_candidates,
    sinkhorn,
)
from protorl.agents.sac import UpdateParts
from protorl.config import AgentConfig, architecture, in_unit_interval, invalid, positive
from protorl.replay import Batch

log = logging.getLogger("protorl")


@dataclass
class ProtoConfig(AgentConfig):
    """Proto-RL's own hyper-parameters; the defaults are the paper's (table 1, appendix C.2-C.3)."""

    name: str = "proto"
    # Prototypical representation (appendix C.2)
    proj_dim: int = architecture(128)
    pred_hidden_dim: int = architecture(512)
    num_prototypes: int = architecture(512)
    temperature: float = 0.1  # softmax temperature of the assignments (the paper's tau in section 4, temp in D)
    sinkhorn_iters: int = 3
    ssl_update_every: int = 1  # an L_SSL step every N agent updates (the paper's text: 1; its code: 2)
    encoder_target_update_every: int = 2
    encoder_target_tau: float = 0.05  # EMA rate of the target encoder and projector
    # between the linear projector and the L2 normalisation: "none" (the paper), or a departure that keeps
    # the projections from collapsing, "center" (subtract the mean) or "batchnorm" (math.py, Projector)
    anti_collapse: str = architecture("none")
    anti_collapse_momentum: float = 0.1  # of its running statistics (BatchNorm's default)
    # Entropy-based intrinsic reward (appendix C.3)
    candidates_per_prototype: int = architecture(4)  # T: queue size is num_prototypes * T
    knn_k: int = 3
    # false (the paper): enqueue a batch's candidates, then score it, so at small batches a frame's k nearest
    # include copies of itself; true: score against the candidates of earlier batches, then enqueue
    reward_before_enqueue: bool = False
    # where the k-NN distances are measured: "sphere" (the paper: L2-normalised projections) or "raw" (the
    # projections before L2 normalisation over their running RMS spread; needed with anti_collapse != none)
    reward_space: str = architecture("sphere")
    intr_coef: float = 0.2  # downstream alpha in r + alpha * r_intr

    def check(self) -> None:
        super().check()
        positive("agent", self, "proj_dim", "pred_hidden_dim", "num_prototypes", "sinkhorn_iters",
                 "ssl_update_every", "encoder_target_update_every", "candidates_per_prototype", "knn_k")
        in_unit_interval("agent", self, "encoder_target_tau", "anti_collapse_momentum")
        if self.anti_collapse not in ANTI_COLLAPSE:
            raise invalid("agent.anti_collapse", self.anti_collapse, f"one of {', '.join(ANTI_COLLAPSE)}")
        if self.reward_space not in REWARD_SPACES:
            raise invalid("agent.reward_space", self.reward_space, f"one of {', '.join(REWARD_SPACES)}")
        if self.anti_collapse == "batchnorm" and self.batch_size < 2:
            raise invalid("agent.batch_size", self.batch_size, "at least 2 with agent.anti_collapse=batchnorm")
        if self.temperature <= 0:
            raise invalid("agent.temperature", self.temperature, "a positive number")
        if self.intr_coef < 0:
            raise invalid("agent.intr_coef", self.intr_coef, "a number >= 0")
        if self.knn_k > self.num_prototypes:
            raise invalid("agent.knn_k", self.knn_k, f"at most agent.num_prototypes={self.num_prototypes} "
                          "(the candidates in the queue after the first update)")


class ProtoAgent(Agent):
    """Proto-RL: the prototypical representation and the k-NN exploration reward over prototype-balanced
    candidates, in its three modes (pre-training, downstream on the frozen representation, online)."""

    name = "proto"
    title = "Proto-RL"
    config_class = ProtoConfig
    # intr_reward_share (downstream and online): the intrinsic part of the batch's reward (`intrinsic_share`)
    metrics = ("repr_loss", "intr_reward_mean", "intr_reward_std", "extr_reward_mean", "intr_reward_share",
               *PROTOTYPE_METRICS, *PROJECTION_METRICS)
    loads_pretrained_actor = True
    cfg: ProtoConfig

    def build(self) -> None:
        cfg, device = self.cfg, self.device
        self.head = ProtoHead(self.encoder.repr_dim, cfg.proj_dim, cfg.pred_hidden_dim, cfg.num_prototypes,
                              cfg.anti_collapse, cfg.anti_collapse_momentum).to(device)
        if cfg.anti_collapse != "none" and cfg.reward_space == "sphere":
            log.warning("agent.anti_collapse=%s with agent.reward_space=sphere: centred projections on the sphere "
                        "reward the frames projected near their mean, where the agent has been most "
                        "(docs/collapse.md); agent.reward_space=raw avoids it", cfg.anti_collapse)
        self.encoder_target = copy.deepcopy(self.encoder).requires_grad_(False)
        self.projector_target = copy.deepcopy(self.head.projector).requires_grad_(False).eval()  # batch stats only
        self.queue = CandidateQueue(cfg.num_prototypes * cfg.candidates_per_prototype, cfg.proj_dim, device)
        self.repr_optimizer = Adam({"encoder": self.encoder, "head": self.head}, cfg.lr)

    # -- learning -----------------------------------------------------------------------------------
    def parts(self, step: int) -> UpdateParts:
        return self.sac.parts(step)._replace(ssl=step % self.cfg.ssl_update_every == 0,
                                             encoder_target=step % self.cfg.encoder_target_update_every == 0)

    def steady(self) -> bool:
        """The queue is full and, while the representation learns, the projector's momentum has settled."""
        return self.queue.full and (self.mode == "frozen" or self.head.projector.settled)

    def update_pretrain(self, batch: Batch, parts: UpdateParts) -> Metrics:
        return self._update_with_ssl(batch, parts, extr_reward=None)

    def update_online(self, batch: Batch, parts: UpdateParts) -> Metrics:
        return self._update_with_ssl(batch, parts, extr_reward=batch.reward)

    def _update_with_ssl(self, batch: Batch, parts: UpdateParts, extr_reward: torch.Tensor | None) -> Metrics:
        """One step of appendix D's routine; SAC's reward is r_intr (pre-training) or r + alpha * r_intr."""
        cfg = self.cfg
        obs, next_obs = self.augmented(batch)  # x_t, x_{t+1}: (B, *obs_shape) each
        metrics: Metrics = {}

        # r_t = compute_rewards(x_{t+1}), with this step's online encoder, before its SSL update. The same
        # forward of x_{t+1} gives SAC its next features y_{t+1} (the paper's code runs it twice).
        next_features = self.encoder(next_obs)  # y_{t+1}: (B, R)
        next_linear = self.head.projector.linear(next_features)  # (B, D)
        next_raw = self.head.projector.anti_collapse_step(next_linear)  # z_{t+1} before L2 normalisation
        intr_reward = self.enqueue_and_score(next_raw)  # (B, 1)

        # update_representations(x_t, x_{t+1}): an L_SSL step every `ssl_update_every` updates; its forward of
        # x_t gives SAC its features y_t (the paper's code runs it again without gradient).
        if parts.ssl:
            repr_loss, (features, target_q, linear, projected) = gradient_step(
                self.ssl_loss, (obs, next_obs), self.repr_optimizer)
            self.head.projector.update_statistics(linear, projected)
            self.head.normalize_prototypes_()  # C = normalize(C): unit-norm until the next SSL step
            metrics.update({"repr_loss": repr_loss, "repr/target_entropy": sinkhorn_entropy(target_q)})
        else:
            features = self.encoder(obs)
        # xi = tau * xi + (1 - tau) * theta, on its own schedule, after this update's SGD step if any
        if parts.encoder_target:
            soft_update(self.encoder, self.encoder_target, cfg.encoder_target_tau)
            soft_update(self.head.projector, self.projector_target, cfg.encoder_target_tau)

        # update_rl(y_t, a_t, r_t, y_{t+1}): SAC on detached features
        reward = intr_reward if extr_reward is None else extr_reward + cfg.intr_coef * intr_reward
        metrics.update(self.sac.update(features, batch.action, reward, batch.discount, next_features, parts))
        metrics.update(**reward_metrics("intr_reward", intr_reward),
                       **projection_diagnostics(next_linear, next_raw, self.head.prototypes))
        if extr_reward is not None:
            metrics["extr_reward_mean"] = extr_reward.mean()
            metrics["intr_reward_share"] = intrinsic_share(cfg.intr_coef, metrics["intr_reward_mean"],
                                                           metrics["extr_reward_mean"])
        return metrics

    def update_frozen(self, batch: Batch, parts: UpdateParts) -> Metrics:
        """Downstream from a snapshot: SAC on the frozen features with r + alpha * r_intr."""
        obs, next_obs = self.augmented(batch)
        features, next_features = frozen_features(self.encoder, obs, next_obs)  # (B, R) each
        intr_reward = self.enqueue_and_score(self.head.projector(next_features))  # (B, 1)
        reward = batch.reward + self.cfg.intr_coef * intr_reward
        metrics = self.sac.update(features, batch.action, reward, batch.discount, next_features, parts)
        metrics.update(**reward_metrics("intr_reward", intr_reward), extr_reward_mean=batch.reward.mean())
        metrics["intr_reward_share"] = intrinsic_share(self.cfg.intr_coef, metrics["intr_reward_mean"],
                                                       metrics["extr_reward_mean"])
        return metrics

    def ssl_loss(self, obs: torch.Tensor, next_obs: torch.Tensor):
        """L_SSL of x_t, x_{t+1} (B, *obs_shape) each, for `gradient_step`: the loss, and what the update uses after
        the step: the features y_t (B, R), the Sinkhorn targets q (B, M), the projector's linear outputs and
        projections of x_t (B, D) each (its running statistics)."""
        features = self.encoder(obs)  # y_t: (B, R)
        loss, target_q, linear, projected = self.representation_loss(features, next_obs)
        return loss, (features, target_q, linear, projected)

    def representation_loss(self, features: torch.Tensor, next_obs: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """L_SSL between online assignments p_t of x_t and Sinkhorn targets q_{t+1} of x_{t+1}.

        features: (B, R) online encoding of x_t; next_obs: (B, *obs_shape). Returns the loss, q (B, M), and the
        projector's linear outputs and projections of x_t (B, D) each. Both projections use this batch's
        statistics (anti-collapse step; the paper has none).
        """
        prototypes, temperature = self.head.prototypes, self.cfg.temperature  # C: (M, D)
        linear = self.head.projector.linear(features)  # (B, D)
        projected = self.head.projector.anti_collapse_step(linear, batch_stats=True)  # (B, D)
        u = F.normalize(self.head.predictor(projected), dim=1)  # (B, D)
        log_p = F.log_softmax(u @ prototypes.t() / temperature, dim=1)  # (B, M)
        with torch.no_grad():
            z_target = F.normalize(self.projector_target(self.encoder_target(next_obs), batch_stats=True), dim=1)
            q = sinkhorn(z_target @ prototypes.t() / temperature, self.cfg.sinkhorn_iters)  # (B, M)
        return cluster_assignment_loss(log_p, q), q, linear.detach(), projected.detach()

    # -- the intrinsic reward -------------------------------------------------------------------------
    def reward_points(self, raw: torch.Tensor) -> torch.Tensor:
        """Projections before L2 normalisation (B, D) -> points of the k-NN reward's space (`agent.reward_space`)."""
        return self.head.reward_embedding(raw, self.cfg.reward_space)

    @torch.no_grad()
    def candidates(self, raw: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """M prototype-balanced candidates (M, D) in the reward space, from projections before L2
        normalisation raw (B, D): drawn by the normalised projections' similarity to the prototypes."""
        return sample_candidates(F.normalize(raw, dim=1), self.head.prototypes, generator,
                                 points=self.reward_points(raw))

    @property
    def prototypes(self) -> torch.Tensor:
        """The M unit-norm prototypes C (M, D)."""
        return self.head.prototypes

    @property
    def can_score(self) -> bool:
        """Whether the queue holds the k candidates a reward needs."""
        return self.queue.size >= self.cfg.knn_k

    @torch.no_grad()
    def score(self, raw: torch.Tensor) -> torch.Tensor:
        """The reward of projections raw (B, D) against the queue as it is: distance to the k-th nearest, (B, 1)."""
        return knn_reward(self.reward_points(raw), self.queue.filled(), self.cfg.knn_k)

    @torch.no_grad()
    def enqueue_and_score(self, raw: torch.Tensor) -> torch.Tensor:
        """Refresh the queue with M prototype-balanced candidates of this batch and score the batch: (B, 1).

        The paper enqueues first, so at B < M x k each frame finds copies of itself among its k nearest and scores
        ~0; `reward_before_enqueue` scores against the candidates of earlier batches only (from the first update
        on which the queue holds k of them).
        """
        candidates = self.candidates(raw)  # (M, D)
        if self.cfg.reward_before_enqueue and self.can_score:
            reward = self.score(raw)
            self.queue.enqueue(candidates)
            return reward
        self.queue.enqueue(candidates)
        return self.score(raw)

    @torch.no_grad()
    def embed(self, obs: torch.Tensor) -> torch.Tensor:
        """Observations (N, *obs_shape), unaugmented -> projections before L2 normalisation (N, D), with the
        running statistics, in chunks of the batch size: what the analyses place and score."""
        chunk = self.cfg.batch_size
        return torch.cat([self.head.projector(self.encoder(obs[i:i + chunk])) for i in range(0, len(obs), chunk)])

    def collapse_message(self, row: dict) -> str | None:
        return collapse_message(row, self.cfg.num_prototypes)

    # -- phases and persistence -----------------------------------------------------------------------
    def representation_modules(self) -> dict[str, nn.Module]:
        return {"encoder": self.encoder, "head": self.head, "encoder_target": self.encoder_target,
                "projector_target": self.projector_target}

    def representation_statistics(self) -> dict[str, Any]:
        return {"queue": self.queue}

    def representation_optimizers(self) -> dict[str, Adam]:
        return {"repr": self.repr_optimizer}

    def load_pretrained(self, state: dict) -> None:
        """Start downstream from a snapshot: its representation, queue and actor; the critic and the SAC
        temperature stay freshly initialised (appendix C.6)."""
        super().load_pretrained(state)
        self.head.normalize_prototypes_()  # once: frozen from here on
