"""Actions as every agent of protorl gives them, in [-1, 1]^|A|, mapped to an environment's own range."""

from __future__ import annotations

import numpy as np


def to_action_range(action: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """`action` in [-1, 1]^|A| (clipped there) -> the same point of [low, high], float64; `ValueError` for another
    shape than the range's."""
    action = np.asarray(action, dtype=np.float64)
    if action.shape != low.shape:
        raise ValueError(f"action shape {action.shape} != {low.shape}")
    return low + (np.clip(action, -1.0, 1.0) + 1.0) * 0.5 * (high - low)
