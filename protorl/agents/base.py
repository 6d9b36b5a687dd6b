"""What every agent shares: an encoder, the SAC core, acting, augmentation, the update's dispatch and persistence.

An agent runs in one of two phases (appendix C.5):
- "pretrain": task-agnostic. The representation learns by the agent's own rule; SAC learns from an
  intrinsic reward (the environment's reward is never read).
- "finetune": the task reward. With `train_representation=False` (downstream from a snapshot) the
  representation is frozen and only a SAC agent learns on its features; with `train_representation=True`
  (no pre-training: DrQ, figure 14) the representation keeps learning by the agent's rule.

Subclasses say which modules form the representation (`representation_modules`) and implement the
updates they support; everything else lives here, once.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from protorl.agents.sac import SAC
from protorl.augment import random_shift
from protorl.config import AgentConfig
from protorl.networks import make_encoder
from protorl.replay import ReplayBuffer

PHASES = ("pretrain", "finetune")


class Agent:
    """Base class: subclasses add modules in `build` and override `update_pretrain` / `update_online`."""

    name = "base"
    pretrains = True  # has a task-agnostic phase
    learns_online = False  # can learn its representation from the task reward (no pre-training)
    loads_pretrained_actor = False  # downstream starts from the exploration actor (Proto-RL, appendix C.6)

    def __init__(self, obs_type: str, obs_shape: tuple[int, ...], action_shape: tuple[int, ...],
                 cfg: AgentConfig, device: torch.device, phase: str = "pretrain",
                 train_representation: bool | None = None):
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
        self.cfg, self.device, self.phase, self.obs_type = cfg, device, phase, obs_type
        self.action_shape = action_shape
        if train_representation is None:  # learnt in pre-training; downstream frozen, unless nothing pre-trains it
            train_representation = phase == "pretrain" or not self.pretrains
        self.train_representation = train_representation
        if phase == "pretrain" and not self.pretrains:
            raise ValueError(f"agent {self.name!r} has no task-agnostic pre-training phase")
        if phase == "finetune" and self.train_representation and not self.learns_online:
            raise ValueError(f"agent {self.name!r} cannot learn its representation from the task reward: "
                             "fine-tune it from a pre-training snapshot")
        self.encoder = make_encoder(obs_type, obs_shape, cfg.state_hidden_dim).to(device)
        self.sac = SAC(self.encoder.repr_dim, action_shape[0], cfg, device)
        self.build()
        if not self.train_representation:
            self.freeze_representation()

    # -- what the subclass defines ----------------------------------------------------------------------
    def build(self) -> None:
        """Create the agent's own modules and optimisers; `self.encoder` and `self.sac` exist already."""

    def representation_modules(self) -> dict[str, nn.Module]:
        """The networks a snapshot carries and downstream freezes (state_dict-able objects)."""
        return {"encoder": self.encoder}

    def representation_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Optimisers of the representation; checkpoints carry them while `train_representation`."""
        return {}

    def update_pretrain(self, obs, action, discount, next_obs, step: int) -> dict[str, float]:
        """One task-agnostic update on augmented batch tensors; defined by agents that pre-train."""
        raise TypeError(f"agent {self.name!r} defines no task-agnostic update")

    def update_online(self, obs, action, reward, discount, next_obs, step: int) -> dict[str, float]:
        """One update that also trains the representation on the task reward; defined by `learns_online` agents."""
        raise TypeError(f"agent {self.name!r} cannot learn its representation from the task reward")

    # -- acting -------------------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, obs: np.ndarray, sample: bool) -> np.ndarray:
        """One observation -> one action in [-1, 1]: a policy sample (training) or its mean (eval)."""
        obs_t = torch.as_tensor(obs, device=self.device).unsqueeze(0)
        return self.sac.act(self.encoder(obs_t), sample)[0].cpu().numpy()

    # -- learning -----------------------------------------------------------------------------------
    def augment(self, obs: torch.Tensor) -> torch.Tensor:
        """Random shift of pixels (DrQ); states pass unchanged."""
        if self.obs_type != "pixels":
            return obs
        return random_shift(obs, self.cfg.augment_pad)

    def update(self, replay: ReplayBuffer, step: int) -> dict[str, float]:
        """Sample a batch and run one update of the current phase; `step` counts agent updates."""
        batch = replay.sample(self.cfg.batch_size, self.device)
        obs, next_obs = self.augment(batch.obs), self.augment(batch.next_obs)
        if self.phase == "pretrain":
            return self.update_pretrain(obs, batch.action, batch.discount, next_obs, step)
        if self.train_representation:
            return self.update_online(obs, batch.action, batch.reward, batch.discount, next_obs, step)
        return self.update_frozen(obs, batch.action, batch.reward, batch.discount, next_obs, step)

    def update_frozen(self, obs, action, reward, discount, next_obs, step: int) -> dict[str, float]:
        """Downstream on a frozen encoder: a SAC update on the task reward (baselines, appendix C.4)."""
        with torch.no_grad():
            features, next_features = self.encoder(torch.cat([obs, next_obs])).chunk(2)  # (B, R) each
        metrics = self.sac.update(features, action, reward, discount, next_features, step)
        metrics["extr_reward_mean"] = reward.mean().item()
        return metrics

    def update_sac_through_encoder(self, obs, action, reward, discount, next_obs, step: int,
                                   encoder_optimizer: torch.optim.Optimizer) -> dict[str, float]:
        """DrQ's rule: the critic loss also trains the encoder; targets and the actor use detached features."""
        features = self.encoder(obs)  # (B, R), with gradient
        with torch.no_grad():
            next_features = self.encoder(next_obs)  # (B, R)
        return self.sac.update(features, action, reward, discount, next_features, step,
                               encoder_optimizer=encoder_optimizer)

    # -- phases and persistence -----------------------------------------------------------------------
    def freeze_representation(self) -> None:
        """Downstream: the representation never changes again."""
        for module in self.representation_modules().values():
            if isinstance(module, nn.Module):
                module.requires_grad_(False).eval()  # eval: normalisation statistics stay as they are
        self.train_representation = False

    def representation_state(self) -> dict:
        """Everything a downstream agent takes from pre-training (a snapshot's `agent` entry)."""
        state = {name: module.state_dict() for name, module in self.representation_modules().items()}
        state["actor"] = self.sac.actor.state_dict()
        return state

    def state_dict(self) -> dict:
        """Every network, target, optimiser and statistic: what a checkpoint needs to resume exactly."""
        state = {**self.representation_state(), "sac": self.sac.state_dict()}
        if self.train_representation:
            state["optimizers"] = {name: opt.state_dict() for name, opt in self.representation_optimizers().items()}
        return state

    def load_state_dict(self, state: dict) -> None:
        self._load_representation(state)
        self.sac.load_state_dict(state["sac"])
        if self.train_representation:
            for name, optimizer in self.representation_optimizers().items():
                optimizer.load_state_dict(state["optimizers"][name])

    def load_pretrained(self, state: dict) -> None:
        """Start downstream from a snapshot: its representation, frozen; a fresh critic and temperature."""
        self._load_representation(state)
        if self.loads_pretrained_actor:
            self.sac.actor.load_state_dict(state["actor"])
        self.freeze_representation()

    def _load_representation(self, state: dict) -> None:
        modules = self.representation_modules()
        missing = sorted(set(modules) - set(state))
        if missing:
            raise KeyError(f"the saved state has no {', '.join(missing)}: it was not written by agent {self.name!r}")
        for name, module in modules.items():
            module.load_state_dict(state[name])
