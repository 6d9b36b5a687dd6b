"""protorl's tasks as Gymnasium environments (needs the `gym` extra: `pip install -e ".[gym]"`).

    import gymnasium
    import protorl.gym  # registers "protorl/<task>-v0" for every task `protorl-tasks` lists
    env = gymnasium.make("protorl/point_mass_maze_explore-v0", obs="pixels")

or, without the import, `gymnasium.make("protorl.gym:protorl/walker_walk-v0")`. Each is protorl's own environment
(`protorl.envs.DMCEnv`) behind Gymnasium's API: the same frames, frame stack, action repeat and time limit.
Observations are (frame_stack * 3, H, W) uint8 pixels or the suite's flattened float32 state; actions lie in
[-1, 1]. An episode ends truncated at the task's time limit, or terminated where the task ends it (discount 0).
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from protorl.envs import DMCEnv, TimeStep, list_tasks

ENV_ID = "protorl/{task}-v0"


class ProtorlEnv(gymnasium.Env):
    """One protorl task: `DMCEnv`'s arguments, plus Gymnasium's `render_mode` ("rgb_array" or None) and the size
    of its renders."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 50}

    def __init__(self, task: str, obs: str = "pixels", image_size: int = 84, frame_stack: int = 3,
                 action_repeat: int = 2, camera_id: int | None = None, seed: int = 0,
                 render_mode: str | None = None, render_size: int = 256):
        self.env = DMCEnv(task, obs=obs, image_size=image_size, frame_stack=frame_stack,
                          action_repeat=action_repeat, camera_id=camera_id, seed=seed)
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        self.render_mode, self.render_size = render_mode, render_size
        if obs == "pixels":
            self.observation_space = spaces.Box(0, 255, self.env.obs_shape, np.uint8)
        else:
            self.observation_space = spaces.Box(-np.inf, np.inf, self.env.obs_shape, np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, self.env.action_shape, np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        """A new episode; `seed` reseeds the task's random state (initial states, noise) first."""
        super().reset(seed=seed)
        if seed is not None:
            self.env.seed(seed)
        time_step = self.env.reset()
        return time_step.obs, self._info(time_step)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """`action_repeat` physics control steps; the reward is their sum."""
        time_step = self.env.step(action)
        terminated = time_step.last and time_step.discount == 0.0
        truncated = time_step.last and not terminated
        return time_step.obs, float(time_step.reward), terminated, truncated, self._info(time_step)

    def render(self) -> np.ndarray | None:
        """An RGB (render_size, render_size, 3) image of the observation camera in "rgb_array" mode."""
        return self.env.render(self.render_size) if self.render_mode == "rgb_array" else None

    @staticmethod
    def _info(time_step: TimeStep) -> dict[str, Any]:
        return {"discount": time_step.discount, "physical_state": time_step.physical_state}


def register_all() -> None:
    """Register `protorl/<task>-v0` for every task of `protorl.envs.list_tasks()` (again: a no-op)."""
    for task in list_tasks():
        env_id = ENV_ID.format(task=task)
        if env_id not in gymnasium.registry:
            gymnasium.register(env_id, entry_point=ProtorlEnv, kwargs={"task": task})


register_all()
