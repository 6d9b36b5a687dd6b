"""k-nearest-neighbour distances between embeddings: the particle-based entropy estimate behind the intrinsic
rewards of Proto-RL (eq. 2) and APT."""

from __future__ import annotations

import torch


def nearest_distances(z: torch.Tensor, candidates: torch.Tensor, k: int) -> torch.Tensor:
    """L2 distances from each row of z to its k nearest candidates, nearest first: (B, D), (N, D) -> (B, k).

    Uses `torch.cdist` in its matrix-multiply form (no (B, N, D) broadcast) on inputs centred on the
    candidates' mean: distances do not change, but the form's cancellation error then scales with the
    spread of the points instead of their norm, so nearby embeddings (common early in training, when all
    frames look alike) get accurate distances rather than float32 noise.
    """
    if candidates.shape[0] < k:
        raise ValueError(f"the k-NN search needs at least k={k} candidates, got {candidates.shape[0]}")
    center = candidates.mean(dim=0, keepdim=True)  # (1, D)
    distances = torch.cdist(z - center, candidates - center)  # (B, N)
    return torch.topk(distances, k, dim=1, largest=False).values  # (B, k), ascending
