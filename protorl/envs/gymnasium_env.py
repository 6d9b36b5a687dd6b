"""Any Gymnasium environment with a Box action space as a protorl task: `task=gym:<id>` (needs the `gym` extra).

Observed as its vector state (`env.obs=states`, a Box observation flattened to float32) or as pixels rendered to
`image_size` x `image_size` (`env.obs=pixels`, stacked like DeepMind Control's frames). Actions in [-1, 1] are
scaled to the action space's bounds and repeated `action_repeat` times. An episode ends at the environment's termination
(discount 0) or truncation, e.g. its registered time limit (discount 1). There is no physical state: analyses that
need one (coverage, maps) find none, and the reward-variance analysis still runs.
"""

from __future__ import annotations

import weakref

import numpy as np

from protorl.envs.actions import to_action_range
from protorl.envs.frame_stack import FrameStack
from protorl.envs.names import gymnasium_id
from protorl.envs.time_step import TimeStep
from protorl.errors import ConfigError

NO_PHYSICAL_STATE = np.zeros(0)


def _gymnasium():
    try:
        import gymnasium
    except ImportError as error:
        raise ValueError("task=gym:<id> needs Gymnasium: pip install -e \".[gym]\"") from error
    return gymnasium


def check_gymnasium_task(task: str) -> None:
    """Raise `ValueError` if `task` (`gym:<id>`) names no registered Gymnasium environment."""
    gymnasium = _gymnasium()
    if gymnasium_id(task) not in gymnasium.registry:
        raise ValueError(f"unknown Gymnasium environment {gymnasium_id(task)!r} (task={task}); registered ids are "
                         "listed by gymnasium.pprint_registry()")


class GymnasiumEnv(FrameStack):
    """`protorl.envs.DMCEnv`'s interface over a Gymnasium environment."""

    def __init__(self, task: str, obs: str = "pixels", image_size: int = 84, frame_stack: int = 3,
                 action_repeat: int = 2, seed: int = 0):
        gymnasium = _gymnasium()
        self.task = self.domain = task  # a snapshot serves this environment only
        self.obs_type, self.image_size, self.action_repeat = obs, image_size, action_repeat
        self.frame_stack = frame_stack if obs == "pixels" else 1
        kwargs = {"render_mode": "rgb_array", "width": image_size, "height": image_size} if obs == "pixels" else {}
        try:
            self._env = gymnasium.make(gymnasium_id(task), **kwargs)
        except TypeError:  # an environment that does not take a render size: its renders are resized
            self._env = gymnasium.make(gymnasium_id(task), render_mode="rgb_array")
        weakref.finalize(self, self._env.close)  # rendering contexts go before the interpreter tears down
        space = self._env.action_space
        if not isinstance(space, gymnasium.spaces.Box) or not np.isfinite([space.low, space.high]).all():
            raise ValueError(f"task={task}: protorl needs a bounded Box action space, got {space}")
        if obs == "states" and not isinstance(self._env.observation_space, gymnasium.spaces.Box):
            raise ValueError(f"task={task} env.obs=states: needs a Box observation space, got "
                             f"{self._env.observation_space}")
        self._action_low, self._action_high = space.low.astype(np.float64), space.high.astype(np.float64)
        self.action_shape: tuple[int, ...] = tuple(space.shape)
        self._seed: int | None = seed  # the first reset's; later resets continue the environment's generator
        self._start_stack()

    # -- specs ------------------------------------------------------------------------------------
    @property
    def frame_shape(self) -> tuple[int, ...]:
        if self.obs_type == "pixels":
            return (3, self.image_size, self.image_size)
        return (int(np.prod(self._env.observation_space.shape)),)

    @property
    def physical_state_shape(self) -> tuple[int, ...]:
        return NO_PHYSICAL_STATE.shape

    def spec(self) -> dict:
        """What a snapshot must match to be used on this environment."""
        return {"domain": self.domain, "obs_type": self.obs_type, "obs_shape": list(self.obs_shape),
                "action_shape": list(self.action_shape), "action_repeat": self.action_repeat}

    # -- dynamics ---------------------------------------------------------------------------------
    def reset(self) -> TimeStep:
        observation, _ = self._env.reset(seed=self._seed)
        self._seed = None
        frame = self._frame(observation)
        return TimeStep(frame, self._first_stack(frame), 0.0, 1.0, first=True, last=False,
                        physical_state=NO_PHYSICAL_STATE)

    def step(self, action: np.ndarray) -> TimeStep:
        """Apply `action` in [-1, 1]^|A| `action_repeat` times (fewer if the episode ends)."""
        scaled = to_action_range(action, self._action_low, self._action_high)
        reward, terminated, truncated = 0.0, False, False
        for _ in range(self.action_repeat):
            observation, step_reward, terminated, truncated, _ = self._env.step(scaled.astype(np.float32))
            reward += float(step_reward)
            if terminated or truncated:
                break
        frame = self._frame(observation)
        return TimeStep(frame, self._push(frame), reward, 0.0 if terminated else 1.0, first=False,
                        last=terminated or truncated, physical_state=NO_PHYSICAL_STATE)

    def seed(self, seed: int) -> None:
        """Reseed: the next reset starts the environment's generator from `seed`."""
        self._seed = seed

    def rng_state(self) -> dict:
        """The environment's generator (initial states, noise) as plain data, for checkpoints."""
        return {"bit_generator": self._env.unwrapped.np_random.bit_generator.state, "seed": self._seed}

    def set_rng_state(self, state: dict) -> None:
        self._env.unwrapped.np_random.bit_generator.state = state["bit_generator"]
        self._seed = state["seed"]

    def render(self, size: int) -> np.ndarray:
        """An RGB (size, size, 3) image, for videos."""
        return _resized(self._rendered(), size)

    def close(self) -> None:
        self._env.close()

    def _frame(self, observation: np.ndarray) -> np.ndarray:
        """Pixels: a render now, (3, H, W) uint8; states: the observation flattened to float32."""
        if self.obs_type == "pixels":
            return np.ascontiguousarray(_resized(self._rendered(), self.image_size).transpose(2, 0, 1))
        return np.asarray(observation, dtype=np.float32).ravel()

    def _rendered(self) -> np.ndarray:
        """The environment's render; a package it renders with that is not installed is one line (`ConfigError`)."""
        try:
            return self._env.render()
        except _gymnasium().error.DependencyNotInstalled as error:
            raise ConfigError(f"task={self.task} env.obs=pixels: {error}") from None



def _resized(image: np.ndarray, size: int) -> np.ndarray:
    """An RGB (H, W, 3) uint8 image as (size, size, 3), bilinear (unchanged if already that size)."""
    if image.shape[:2] == (size, size):
        return image
    from PIL import Image

    return np.asarray(Image.fromarray(image).resize((size, size), Image.BILINEAR))
