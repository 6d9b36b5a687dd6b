"""What the analyses and a loaded snapshot may ask of an agent beyond `Agent`: capabilities, checked by what an
agent has, not by which class it is."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from protorl.agents.proto.math import CandidateQueue


@runtime_checkable
class Prototypes(Protocol):
    """A projector, prototypes and a candidate queue (Proto-RL): what figure 1's map, the reward-variance analysis
    and `Pretrained.prototypes` / `project` use."""

    queue: CandidateQueue

    @property
    def prototypes(self) -> torch.Tensor:
        """The M unit-norm prototypes (M, D)."""

    @property
    def can_score(self) -> bool:
        """Whether the queue holds enough candidates for a k-NN reward."""

    def embed(self, obs: torch.Tensor) -> torch.Tensor:
        """Observations (N, *obs_shape) -> projections before L2 normalisation (N, D)."""

    def reward_points(self, raw: torch.Tensor) -> torch.Tensor:
        """Projections (B, D) -> points of the k-NN reward's space (B, D)."""

    def candidates(self, raw: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """M prototype-balanced candidates (M, D), in the reward's space, from projections (B, D)."""

    def score(self, raw: torch.Tensor) -> torch.Tensor:
        """The k-NN reward (B, 1) of projections (B, D) against the queue."""
