"""The coverage a uniform-random policy reaches in the same number of frames: every run's own baseline.

A second copy of the task, observed as states (the physics alone, no rendering: thousands of frames per
second), is driven by actions drawn uniformly from [-1, 1]^|A|, with the run's action repeat and episode
length, and its physical states are binned like the agent's. The rollout is a pure function of the seed,
so it is rebuilt rather than checkpointed: a resumed run reports the same figures.
"""

from __future__ import annotations

import numpy as np

from protorl.envs import DMCEnv
from protorl.exploration.coverage import CoverageSpec, histogram

REFERENCE_SEED_OFFSET = 200_000  # the reference's environment and actions never share the run's streams


class RandomPolicyCoverage:
    """Visit counts of a uniform-random policy on `task`, advanced on demand to a number of frames."""

    def __init__(self, task: str, action_repeat: int, spec: CoverageSpec, seed: int):
        self.env = DMCEnv(task, obs="states", action_repeat=action_repeat, seed=seed + REFERENCE_SEED_OFFSET)
        self.spec = spec
        self.rng = np.random.default_rng([seed, REFERENCE_SEED_OFFSET])
        self.counts = np.zeros(spec.shape, dtype=np.int64)
        self.frames = 0
        self._time_step = None

    def counts_at(self, frames: int) -> np.ndarray:
        """A copy of the visit counts (bins,) * d after `frames` environment frames (never fewer than already
        rolled)."""
        states = []
        while self.frames < frames:
            if self._time_step is None or self._time_step.last:
                self._time_step = self.env.reset()
                states.append(self._time_step.physical_state)
            action = self.rng.uniform(-1.0, 1.0, size=self.env.action_shape)
            self._time_step = self.env.step(action)
            states.append(self._time_step.physical_state)
            self.frames += self.env.action_repeat
        if states:
            self.counts += histogram(np.stack(states), self.spec).reshape(self.spec.shape)
        return self.counts.copy()
