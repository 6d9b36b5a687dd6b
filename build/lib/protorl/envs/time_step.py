"""What every environment's reset and step return."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class TimeStep:
    frame: np.ndarray  # newest frame: (3, H, W) uint8 for pixels, (S,) float32 for states
    obs: np.ndarray  # what the agent sees: (3 * frame_stack, H, W) uint8, or (S,) float32
    reward: float  # summed over the action repeat
    discount: float  # product over the action repeat: 1.0 except at true terminations
    first: bool
    last: bool
    physical_state: np.ndarray | None = None  # (S,) float64 physics.get_state(): qpos, qvel, act

    @property
    def rewarded(self) -> bool:
        """Whether the step earned a positive reward: an episode with one is a success on a sparse task."""
        return self.reward > 0
