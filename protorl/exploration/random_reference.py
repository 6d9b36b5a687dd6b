"""The coverage a uniform-random policy reaches in the same number of frames: every run's own baseline.

A second copy of the task, observed as states (the physics alone, no rendering), is driven by actions drawn
uniformly from [-1, 1]^|A|, with the run's action repeat and episode length, and its physical states are binned
like the agent's. The rollout is a pure function of the seed. A checkpoint keeps its state at the last episode's
end (the counts and both random streams), and a resumed run rolls on from there: the same figures as a straight
run, without rolling the frames before it again.
"""

from __future__ import annotations

import numpy as np
import torch

from protorl.envs import DMCEnv
from protorl.exploration.analysis import Visits
from protorl.exploration.coverage import CoverageSpec, histogram

REFERENCE_SEED_OFFSET = 200_000  # the reference's environment and actions never share the run's streams


class RandomPolicyCoverage:
    """Visit counts of a uniform-random policy on `task`, advanced on demand to a number of frames."""

    def __init__(self, task: str, action_repeat: int, spec: CoverageSpec, seed: int):
        self.env = DMCEnv(task, obs="states", action_repeat=action_repeat, seed=seed + REFERENCE_SEED_OFFSET)
        self.rng = np.random.default_rng([seed, REFERENCE_SEED_OFFSET])
        self.visits = Visits(spec)  # binned at each episode's end, as the agent's
        self.frames = 0  # rolled
        self._time_step = None
        self._ended = self._streams()  # at the last episode's end (at first: before the first reset)

    def counts_at(self, frames: int) -> np.ndarray:
        """The visit counts (bins,) * d after `frames` environment frames (never fewer than already rolled)."""
        while self.frames < frames:
            if self._time_step is None or self._time_step.last:
                self._time_step = self.env.reset()
                self.visits.add(self._time_step.physical_state)
            self._time_step = self.env.step(self.rng.uniform(-1.0, 1.0, size=self.env.action_shape))
            self.visits.add(self._time_step.physical_state)
            self.frames += self.env.action_repeat
            if self._time_step.last:
                self.visits.end_episode()
                self._ended = self._streams()
        spec, under_way = self.visits.spec, self.visits.pending
        return self.visits.counts + (histogram(np.stack(under_way), spec).reshape(spec.shape) if under_way else 0)

    def state_dict(self) -> dict:
        """Its state at the last episode's end, as plain data and a tensor."""
        return {**self._ended, "counts": torch.from_numpy(self.visits.counts.copy())}

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state_dict()`: the next call rolls on from that episode's end."""
        self.visits.counts[...] = state["counts"].numpy()
        self.visits.pending.clear()
        self.frames = int(state["frames"])
        self.rng.bit_generator.state = state["rng"]
        self.env.set_rng_state(state["env"])
        self._time_step = None
        self._ended = self._streams()

    def _streams(self) -> dict:
        """The frames rolled and both random streams, as plain data."""
        return {"frames": self.frames, "rng": self.rng.bit_generator.state, "env": self.env.rng_state()}
