"""What every agent shares: an encoder, the SAC core, acting, augmentation, the update of its mode and persistence.

An agent is built for one mode, and `update(batch, step)` is that mode's update, chosen once at construction
(what the update runs at this step, e.g. whether the actor steps, is decided first, on the host: `parts(step)`):
- "pretrain" (`update_pretrain`): task-agnostic. The representation learns by the agent's own rule; SAC learns
  from an intrinsic reward (the environment's reward is never read).
- "frozen" (`update_frozen`): downstream from a snapshot (appendix C.4-C.6). The representation is frozen and
  a SAC agent learns on its features from the task reward.
- "online" (`update_online`): downstream without pre-training (DrQ; Proto-RL in figure 14). The representation
  keeps learning by the agent's rule, from the task reward.
An agent supports a mode when it defines that mode's method; every agent has "frozen". A new agent subclasses
`Agent`, adds its modules in `build`, defines its updates from the helpers below, and declares its config
class, its metrics and the config keys that fix its snapshot's networks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from protorl.agents.augment import random_shift
from protorl.agents.compiled import CompiledUpdate
from protorl.agents.diagnostics import collapse_message
from protorl.agents.networks import PixelEncoder, make_encoder, micro_batch_for
from protorl.agents.optim import Adam
from protorl.agents.sac import SAC, SAC_METRICS, Encoding, Metrics, UpdateParts
from protorl.config import AgentConfig
from protorl.errors import SnapshotError
from protorl.replay import Batch

MODES = ("pretrain", "frozen", "online")


class Agent:
    """Base class: subclasses add modules in `build` and define `update_pretrain` / `update_online`."""

    name = "base"
    title = ""  # the method as the docs and figures name it, e.g. "Proto-RL"; empty: `name`
    config_class: type[AgentConfig] = AgentConfig
    metrics: tuple[str, ...] = ()  # train.csv columns of its updates beyond SAC's
    loads_pretrained_actor = False  # downstream starts from the exploration actor (Proto-RL, appendix C.6)

    def __init__(self, obs_type: str, obs_shape: tuple[int, ...], action_shape: tuple[int, ...],
                 cfg: AgentConfig, device: torch.device, mode: str = "pretrain"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not self.supports(mode):
            raise ValueError(f"agent {self.name!r} has no {mode!r} update")
        self.cfg, self.device, self.mode, self.obs_type = cfg, device, mode, obs_type
        self.action_shape = action_shape
        self.encoder = make_encoder(obs_type, obs_shape, cfg.state_hidden_dim,
                                    micro_batch_for(device, cfg.encoder_micro_batch), cfg.bf16_autocast).to(device)
        self.sac = SAC(self.encoder.repr_dim, action_shape[0], cfg, device)
        self.build()
        if cfg.compile_encoder:
            for module in self.representation_modules().values():
                if isinstance(module, PixelEncoder):
                    module.compile()  # in place: state_dict keys (snapshots, checkpoints) unchanged
        self._update = getattr(self, f"update_{mode}")
        self._compiled: CompiledUpdate | None = None
        if mode == "frozen":
            self.freeze_representation()

    @classmethod
    def supports(cls, mode: str) -> bool:
        """Whether the agent has an update for `mode` (one of `MODES`)."""
        return hasattr(cls, f"update_{mode}")

    @classmethod
    def method_title(cls, obs_type: str) -> str:
        """The method's name in figures, for a run observing `obs_type` ("pixels" or "states")."""
        return cls.title or cls.name

    @classmethod
    def metric_names(cls) -> tuple[str, ...]:
        """Every metric its updates can return: SAC's, the task reward's mean, and the agent's own."""
        return tuple(dict.fromkeys((*SAC_METRICS, "extr_reward_mean", *cls.metrics)))

    @property
    def trains_representation(self) -> bool:
        return self.mode != "frozen"

    # -- what the subclass defines ----------------------------------------------------------------------
    def build(self) -> None:
        """Create the agent's own modules and optimisers; `self.encoder` and `self.sac` exist already."""

    def representation_modules(self) -> dict[str, nn.Module]:
        """The networks a snapshot carries and downstream freezes."""
        return {"encoder": self.encoder}

    def representation_statistics(self) -> dict[str, Any]:
        """What else a snapshot carries (state_dict-able, not networks: a queue, running statistics)."""
        return {}

    def representation_optimizers(self) -> dict[str, Adam]:
        """Optimisers of the representation; checkpoints carry them while it trains."""
        return {}

    def parts(self, step: int) -> UpdateParts:
        """What update `step` (counting agent updates) runs: SAC's schedule, and the agent's own parts."""
        return self.sac.parts(step)

    def steady(self) -> bool:
        """Whether the update's host-side state (sizes, counts) has stopped changing, so that a compiled update
        runs one graph per `UpdateParts` from here on. Updates before it run eagerly."""
        return True

    # -- acting and learning -------------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, obs: np.ndarray, sample: bool) -> np.ndarray:
        """One observation -> one action in [-1, 1]: a policy sample (training) or its mean (eval)."""
        obs_t = torch.as_tensor(obs, device=self.device).unsqueeze(0)
        return self.sac.act(self.encoder(obs_t), sample)[0].cpu().numpy()

    @torch.no_grad()
    def update(self, batch: Batch, step: int) -> Metrics:
        """One update of the agent's mode on a replay batch; `step` counts agent updates. The metrics stay on the
        device: reading them back waits for the update, so the trainer reads them once per logged row."""
        parts = self.parts(step)
        if self._compiled is not None and self.steady():
            return self._compiled(batch, parts)
        return self._update(batch, parts)

    def compile_update(self, cuda_graphs: bool = False) -> None:
        """Run every update from the first steady one (`steady`) as one compiled graph per combination of
        `UpdateParts` (`protorl.agents.compiled`); with `cuda_graphs`, replayed as a CUDA graph."""
        self._compiled = CompiledUpdate(self._update, f"{self.name} {self.mode}", cuda_graphs)

    def augment(self, obs: torch.Tensor) -> torch.Tensor:
        """Random shift of pixels (DrQ); states pass unchanged."""
        if self.obs_type != "pixels":
            return obs
        return random_shift(obs, self.cfg.augment_pad)

    def augmented(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's observations x_t and x_{t+1}, each randomly shifted: (B, *obs_shape) each."""
        return self.augment(batch.obs), self.augment(batch.next_obs)

    def update_frozen(self, batch: Batch, parts: UpdateParts) -> Metrics:
        """Downstream on a frozen encoder: a SAC update on the task reward (baselines, appendix C.4)."""
        obs, next_obs = self.augmented(batch)
        features, next_features = frozen_features(self.encoder, obs, next_obs)
        metrics = self.sac.update(features, batch.action, batch.reward, batch.discount, next_features, parts)
        metrics["extr_reward_mean"] = batch.reward.mean()
        return metrics

    def collapse_message(self, row: dict) -> str | None:
        """A one-line warning if a logged train.csv row shows a collapsed representation, else None."""
        return collapse_message(row, None)

    # -- phases and persistence -----------------------------------------------------------------------
    def freeze_representation(self) -> None:
        """Downstream: the representation never changes again."""
        for module in self.representation_modules().values():
            module.requires_grad_(False).eval()  # eval: normalisation statistics stay as they are

    def representation_state(self) -> dict:
        """The representation and the exploration actor: what a downstream agent takes from pre-training."""
        parts = {**self.representation_modules(), **self.representation_statistics()}
        return {**{name: part.state_dict() for name, part in parts.items()}, "actor": self.sac.actor.state_dict()}

    def snapshot_state(self) -> dict:
        """A snapshot's `agent` entry: `representation_state` and the exploration critic (for `agent.init_critic`)."""
        return {**self.representation_state(), "critic": self.sac.critic.state_dict()}

    def state_dict(self) -> dict:
        """Every network, target, optimiser and statistic: what a checkpoint needs to resume exactly."""
        state = {**self.representation_state(), "sac": self.sac.state_dict()}
        if self.trains_representation:
            state["optimizers"] = {name: opt.state_dict() for name, opt in self.representation_optimizers().items()}
        return state

    def load_state_dict(self, state: dict) -> None:
        self._load_representation(state)
        self.sac.load_state_dict(state["sac"])
        if self.trains_representation:
            for name, optimizer in self.representation_optimizers().items():
                optimizer.load_state_dict(state["optimizers"][name])

    def load_pretrained(self, state: dict) -> None:
        """Start downstream from a snapshot: its representation, frozen; a fresh critic (the exploration critic
        with `agent.init_critic`) and temperature; a fresh actor, unless `loads_pretrained_actor`."""
        self._load_representation(state)
        if self.loads_pretrained_actor:
            self.sac.actor.load_state_dict(state["actor"])
            self.sac.start_from_pretrained_actor()
        if self.cfg.init_critic:
            if "critic" not in state:
                raise SnapshotError("agent.init_critic=true needs the exploration critic, which this snapshot does "
                                    "not hold (written by an earlier protorl): pre-train again, or drop init_critic")
            self.sac.critic.load_state_dict(state["critic"])
            self.sac.critic_target.load_state_dict(state["critic"])
        self.freeze_representation()

    def _load_representation(self, state: dict) -> None:
        parts = {**self.representation_modules(), **self.representation_statistics()}
        missing = sorted(set(parts) - set(state))
        if missing:
            raise KeyError(f"the saved state has no {', '.join(missing)}: it was not written by agent {self.name!r}")
        for name, part in parts.items():
            part.load_state_dict(state[name])


# -- the pieces agents share -------------------------------------------------------------------------------
class EncoderTrainedByCritic(Agent):
    """An agent whose encoder learns from the critic's loss (DrQ's rule), with an Adam of its own."""

    def build(self) -> None:
        self.encoder_optimizer = Adam({"encoder": self.encoder}, self.cfg.lr)

    def representation_optimizers(self) -> dict[str, Adam]:
        return {"encoder": self.encoder_optimizer}


@torch.no_grad()
def frozen_features(encoder: nn.Module, obs: torch.Tensor, next_obs: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Features of x_t and x_{t+1} without gradient, in one encoder pass: (B, R) each."""
    return encoder(torch.cat([obs, next_obs])).chunk(2)


def critic_through_encoder(encoder: nn.Module, sac: SAC, obs: torch.Tensor, action: torch.Tensor,
                           reward: torch.Tensor, discount: torch.Tensor, next_obs: torch.Tensor, parts: UpdateParts,
                           encoder_optimizer: Adam) -> Metrics:
    """DrQ's rule: the critic loss also trains the encoder; targets and the actor use detached features."""
    next_features = encoder(next_obs)  # (B, R), without gradient
    return sac.update(obs, action, reward, discount, next_features, parts, encoder=Encoding(encoder, encoder_optimizer))


def reward_metrics(prefix: str, reward: torch.Tensor) -> Metrics:
    """`<prefix>_mean` and `<prefix>_std` (population) of a batch of rewards (B, 1)."""
    reward = reward.detach()
    return {f"{prefix}_mean": reward.mean(), f"{prefix}_std": reward.std(correction=0)}


def intrinsic_share(intr_coef: float, intr_reward_mean: torch.Tensor, extr_reward_mean: torch.Tensor) -> torch.Tensor:
    """The intrinsic part of a batch's reward r + alpha * r_intr, from the batch means of r_intr and r:
    alpha * mean r_intr / (|mean r| + alpha * mean r_intr), in [0, 1] for r_intr >= 0."""
    scaled_intr = intr_coef * intr_reward_mean
    return scaled_intr / (extr_reward_mean.abs() + scaled_intr).clamp_min(1e-12)
