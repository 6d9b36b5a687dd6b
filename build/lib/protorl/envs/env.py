"""What protorl asks of an environment, as protocols: DeepMind Control tasks (`DMCEnv`) and Gymnasium ones
(`protorl.envs.gymnasium_env.GymnasiumEnv`) implement `Env`; only a MuJoCo simulation is also `Simulated`."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from protorl.envs.time_step import TimeStep


class Env(Protocol):
    """One task with action repeat and frame stacking: what training, evaluation and snapshots use."""

    task: str  # its name, e.g. "walker_walk" or "gym:Pendulum-v1"
    domain: str  # tasks of one domain share a snapshot
    obs_type: str  # "pixels" or "states"
    frame_stack: int
    action_repeat: int  # environment frames per agent step
    action_shape: tuple[int, ...]

    @property
    def frame_shape(self) -> tuple[int, ...]:
        """One frame: (3, H, W) pixels or (S,) states."""

    @property
    def frame_dtype(self) -> np.dtype:
        """uint8 pixels or float32 states."""

    @property
    def obs_shape(self) -> tuple[int, ...]:
        """One observation: `frame_stack` frames stacked on the first axis."""

    @property
    def physical_state_shape(self) -> tuple[int, ...]:
        """The shape of `TimeStep.physical_state`: (0,) where there is none."""

    def spec(self) -> dict:
        """What a snapshot must match to be used on this environment."""

    def reset(self) -> TimeStep:
        """An episode's first time step."""

    def step(self, action: np.ndarray) -> TimeStep:
        """Apply `action` in [-1, 1]^|A| `action_repeat` times (fewer if the episode ends)."""

    def render(self, size: int) -> np.ndarray:
        """An RGB (size, size, 3) image, for videos."""

    def rng_state(self) -> dict:
        """Its random state, for checkpoints."""

    def set_rng_state(self, state: dict) -> None:
        """Continue from `rng_state()`."""

    def close(self) -> None:
        """Free what it holds."""


@runtime_checkable
class Simulated(Protocol):
    """A MuJoCo simulation: its physics (the analyses' coverage and walls), cameras, states to place it in and the
    task's reward there."""

    physics: Any  # dm_control's Physics
    num_cameras: int  # valid `camera_id`s are 0 to num_cameras - 1

    def observe_at(self, physical_state: np.ndarray) -> np.ndarray:
        """The observation of a motionless system in `physical_state`."""

    def reward_at(self, physical_state: np.ndarray, action: np.ndarray) -> float:
        """The task's reward of one control step that applied `action` and ended in `physical_state`."""
