"""A pre-trained representation in your own code: `load_pretrained(path)` reads a snapshot into a frozen agent.

    from protorl import load_pretrained
    pretrained = load_pretrained("runs/.../pretrain/snapshots/snapshot_500000.pt")
    features = pretrained.encode(frames)          # uint8 (B, C, H, W) or one (C, H, W) -> (B, R) / (R,)
    action = pretrained.act(frame)                # the exploration actor's mean action, in [-1, 1]
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from protorl.agents import Agent
from protorl.agents.capabilities import Prototypes
from protorl.config import grouped
from protorl.errors import ConfigError, SnapshotError, first_line
from protorl.runtime import check_device
from protorl.storage.snapshots import load_snapshot, snapshot_agent


class Pretrained:
    """A snapshot's frozen representation (encoder, and for Proto-RL its projector and prototypes) and its
    exploration actor, with the environment spec it was pre-trained on and the run's `config` (plain data, on
    today's keys: `config["task"]`, `config["env"]["obs"]`)."""

    def __init__(self, agent: Agent, env_spec: dict, config: dict, frames: int):
        self.agent, self.env_spec, self.config, self.frames = agent, env_spec, config, frames
        self.device = agent.device

    @property
    def obs_shape(self) -> tuple[int, ...]:
        """One observation's shape, e.g. (9, 84, 84) for 3 stacked RGB frames."""
        return tuple(self.env_spec["obs_shape"])

    @property
    def prototypes(self) -> torch.Tensor | None:
        """The M unit-norm prototypes (M, D) of a Proto-RL snapshot; None for other agents."""
        return self.agent.prototypes.detach() if isinstance(self.agent, Prototypes) else None

    @torch.no_grad()
    def encode(self, obs: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Observations (B, *obs_shape), or one (*obs_shape), as stored by the env (uint8 pixels, float states)
        -> the frozen encoder's features (B, R), or (R,), on the snapshot's device."""
        obs = self._tensor(obs)
        features = self.agent.encoder(self._batch(obs))
        return features[0] if obs.ndim == len(self.obs_shape) else features

    @torch.no_grad()
    def project(self, obs: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Proto-RL only: observations -> L2-normalised projections z (B, D), the prototypes' space."""
        if not isinstance(self.agent, Prototypes):
            raise SnapshotError(f"a snapshot of agent {self.agent.name!r} has no projector: project() needs Proto-RL")
        obs = self._tensor(obs)
        z = torch.nn.functional.normalize(self.agent.embed(self._batch(obs)), dim=1)
        return z[0] if obs.ndim == len(self.obs_shape) else z

    def act(self, obs: np.ndarray | torch.Tensor, sample: bool = False) -> np.ndarray:
        """One observation (*obs_shape) -> the exploration actor's action in [-1, 1] (its mean, or a sample)."""
        obs = self._tensor(obs)
        if obs.ndim != len(self.obs_shape):
            raise ConfigError(f"an observation of shape {tuple(obs.shape)}: act() takes one observation "
                              f"{self.obs_shape}")
        return self.agent.act(self._batch(obs)[0], sample)

    def _tensor(self, obs: np.ndarray | torch.Tensor) -> torch.Tensor:
        """`obs` as a tensor on the snapshot's device; `ConfigError` for what is not an array of numbers."""
        try:
            return torch.as_tensor(obs, device=self.device)
        except (TypeError, ValueError, RuntimeError) as error:
            raise ConfigError(f"observations of type {type(obs).__name__}: expected an array of numbers "
                              f"({first_line(error)})") from None

    def _batch(self, obs: torch.Tensor) -> torch.Tensor:
        pixels = self.env_spec["obs_type"] == "pixels"
        if pixels and obs.dtype != torch.uint8 or not pixels and not obs.dtype.is_floating_point:
            expected = "uint8 pixels in [0, 255], as the environment renders them" if pixels else "float states"
            raise ConfigError(f"observations of dtype {str(obs.dtype).removeprefix('torch.')}: this snapshot "
                              f"expects {expected}")
        given = tuple(obs.shape)
        if obs.ndim == len(self.obs_shape):
            obs = obs.unsqueeze(0)
        if tuple(obs.shape[1:]) != self.obs_shape:
            raise ConfigError(f"observations of shape {given}: this snapshot expects (B, "
                              f"{', '.join(map(str, self.obs_shape))}) or one observation {self.obs_shape}"
                              + (" (channels first)" if pixels else ""))
        return obs


def load_pretrained(path: str | Path, device: str | torch.device = "auto") -> Pretrained:
    """Read a pre-training snapshot (`SnapshotError` if it is not one) into a frozen `Pretrained` on `device`
    ("auto": CUDA when available)."""
    if not isinstance(path, (str, Path)):
        raise SnapshotError(f"load_pretrained({path!r}): expected the path of a snapshot file")
    if isinstance(device, str):
        device = check_device(device)
    payload = load_snapshot(path)
    agent = snapshot_agent(Path(path), payload, device)
    agent.load_pretrained(payload["agent"])
    if not agent.loads_pretrained_actor:  # the snapshot's exploration actor, whatever the agent does downstream
        agent.sac.actor.load_state_dict(payload["agent"]["actor"])
    return Pretrained(agent, payload["env_spec"], grouped(payload["config"]), int(payload["frames"]))
