"""DeepMind Control tasks with action repeat, 84x84 pixel frames and frame stacking (appendix C.1).

An environment returns a `TimeStep` holding both the newest single `frame` (what the replay buffer
stores) and the stacked `obs` (what the agent acts on), plus the simulator's `physical_state` at that
frame (for analyses only, e.g. state coverage). Episodes end on the suite's time limit; the
discount stays 1 there, so learning bootstraps through it.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np

from protorl.envs.actions import to_action_range
from protorl.envs.frame_stack import FrameStack
from protorl.envs.names import GYMNASIUM_PREFIX
from protorl.envs.time_step import TimeStep
from protorl.errors import did_you_mean


def _suite():
    """Import dm_control's suite, choosing headless EGL rendering unless the user chose a backend."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    if os.environ["MUJOCO_GL"] == "egl" and importlib.util.find_spec("triton") is not None:
        # Triton (which CUDA builds of torch install) crashes the process when first imported after Mesa's EGL has
        # loaded (seen with torch 2.15.0 on a CPU): imported first, both work. torch imports it on its first
        # optimiser or compiled module.
        import triton  # noqa: F401
    from dm_control import suite

    return suite


@dataclass(frozen=True)
class ExtraTask:
    """A task beyond the suite's (e.g. the paper's U-maze): `load(seed)` builds its dm_control env."""

    domain: str
    load: Callable[[int], object]
    camera_id: int | None = None  # None: the suite's rule (2 for quadruped, else 0)
    description: str = ""  # what earns its reward, in a few words (protorl-tasks)


EXTRA_TASKS: dict[str, ExtraTask] = {}


def register_task(name: str, task: ExtraTask) -> None:
    """Make `name` valid for `make_env` and `task=`; its domain decides which snapshots it accepts."""
    EXTRA_TASKS[name] = task


def _task_table() -> dict[str, tuple[str, str]]:
    suite_tasks = {f"{domain}_{task}": (domain, task) for domain, task in _suite_tasks()}
    extra = {name: (task.domain, name) for name, task in EXTRA_TASKS.items()}
    return {**suite_tasks, **extra}


@cache
def _suite_tasks() -> tuple[tuple[str, str], ...]:
    return tuple(_suite().ALL_TASKS)


def list_tasks() -> list[str]:
    """All task names accepted by `make_env`, e.g. `walker_walk`, `point_mass_easy`."""
    return sorted(_task_table())


def dmc_task(name: str) -> tuple[str, str]:
    """`'point_mass_easy'` -> `('point_mass', 'easy')`: the suite's domain and task of `name` (or an extra task's
    domain and name); `ValueError` listing the valid names if it is none of them."""
    table = _task_table()
    if name not in table:
        raise ValueError(f"unknown task {name!r}{did_you_mean(name, list_tasks())}: protorl-tasks lists every "
                         f"task by domain, and {GYMNASIUM_PREFIX}<id> names a Gymnasium environment")
    return table[name]


class DMCEnv(FrameStack):
    """A suite task with action repeat and (for pixels) a stack of the last `frame_stack` frames."""

    def __init__(self, task: str, obs: str = "pixels", image_size: int = 84, frame_stack: int = 3,
                 action_repeat: int = 2, camera_id: int | None = None, seed: int = 0):
        domain, task_name = dmc_task(task)
        if obs not in ("pixels", "states"):
            raise ValueError(f"obs must be 'pixels' or 'states', got {obs!r}")
        self.task, self.domain = task, domain
        self.obs_type = obs
        self.image_size = image_size
        self.frame_stack = frame_stack if obs == "pixels" else 1
        self.action_repeat = action_repeat
        extra = EXTRA_TASKS.get(task)
        if camera_id is None:
            camera_id = extra.camera_id if extra is not None and extra.camera_id is not None else (
                2 if domain == "quadruped" else 0)
        self.camera_id = camera_id
        if extra is not None:
            self._env = extra.load(seed)
        else:
            self._env = _suite().load(domain, task_name, task_kwargs={"random": seed})
        spec = self._env.action_spec()
        # bounds of the action's shape (a spec may give one bound for every dimension)
        self._action_low, self._action_high = (np.broadcast_to(bound, spec.shape).astype(np.float64)
                                               for bound in (spec.minimum, spec.maximum))
        self.action_shape: tuple[int, ...] = tuple(spec.shape)
        self._start_stack()

    # -- specs ------------------------------------------------------------------------------------
    @property
    def frame_shape(self) -> tuple[int, ...]:
        if self.obs_type == "pixels":
            return (3, self.image_size, self.image_size)
        return (sum(int(np.prod(v.shape)) for v in self._env.observation_spec().values()),)

    @property
    def num_cameras(self) -> int:
        """Cameras of the task's model: valid `camera_id`s are 0 to num_cameras - 1."""
        return int(self.physics.model.ncam)

    @property
    def physical_state_shape(self) -> tuple[int, ...]:
        """(nq + nv + na,): the shape of `TimeStep.physical_state`."""
        return self.physics.get_state().shape

    def spec(self) -> dict:
        """What a snapshot must match to be used on this environment."""
        return {"domain": self.domain, "obs_type": self.obs_type, "obs_shape": list(self.obs_shape),
                "action_shape": list(self.action_shape), "action_repeat": self.action_repeat}

    @property
    def physics(self):
        return self._env.physics

    # -- dynamics ---------------------------------------------------------------------------------
    def reset(self) -> TimeStep:
        dm_step = self._env.reset()
        frame = self._frame(dm_step.observation)
        return TimeStep(frame, self._first_stack(frame), 0.0, 1.0, first=True, last=False,
                        physical_state=self.physics.get_state())

    def step(self, action: np.ndarray) -> TimeStep:
        """Apply `action` in [-1, 1]^|A| for `action_repeat` physics control steps."""
        scaled = to_action_range(action, self._action_low, self._action_high)
        reward, discount = 0.0, 1.0
        for _ in range(self.action_repeat):
            dm_step = self._env.step(scaled)
            reward += dm_step.reward or 0.0
            discount *= dm_step.discount
            if dm_step.last():
                break
        frame = self._frame(dm_step.observation)
        return TimeStep(frame, self._push(frame), reward, discount, first=False, last=dm_step.last(),
                        physical_state=self.physics.get_state())

    def seed(self, seed: int) -> None:
        """Reseed the task's random state (initial states, noise)."""
        self._random().seed(seed)

    def rng_state(self) -> dict:
        """The task's random state (initial states, noise) as plain data, for checkpoints."""
        _, keys, pos, has_gauss, gauss = self._random().get_state()
        return {"keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss), "gauss": float(gauss)}

    def set_rng_state(self, state: dict) -> None:
        keys = np.asarray(state["keys"], dtype=np.uint32)
        self._random().set_state(("MT19937", keys, state["pos"], state["has_gauss"], state["gauss"]))

    def _random(self) -> np.random.RandomState:
        composer_random = getattr(self._env, "random_state", None)  # composer (manipulation) environments
        return composer_random if composer_random is not None else self._env.task.random

    def observe_at(self, physical_state: np.ndarray) -> np.ndarray:
        """The observation of a motionless system in `physical_state` (S,): its frame repeated `frame_stack`
        times, as at an episode's start. Moves this environment's physics there: use an environment of its own."""
        with self.physics.reset_context():
            self.physics.set_state(physical_state)
        frame = self._frame(self._env.task.get_observation(self.physics) if self.obs_type == "states" else None)
        return np.concatenate([frame] * self.frame_stack, axis=0)

    def reward_at(self, physical_state: np.ndarray, action: np.ndarray) -> float:
        """The task's reward of one control step that applied `action` in [-1, 1]^|A| and ended in
        `physical_state` (S,). Moves this environment's physics there: use an environment of its own."""
        with self.physics.reset_context():
            self.physics.set_state(physical_state)
            self.physics.set_control(to_action_range(action, self._action_low, self._action_high))
        return float(self._env.task.get_reward(self.physics) or 0.0)

    def close(self) -> None:
        """Free the physics and its rendering context; call it from the thread that rendered
        (`protorl.envs.thread.EnvThread`)."""
        self.physics.free()

    def render(self, size: int) -> np.ndarray:
        """An RGB (size, size, 3) image from the observation camera, for videos."""
        return self._env.physics.render(size, size, camera_id=self.camera_id)

    def _frame(self, observation: dict | None) -> np.ndarray:
        """Pixels: a render of the physics now; states: the suite's observation dict, flattened."""
        if self.obs_type == "pixels":
            image = self._env.physics.render(self.image_size, self.image_size, camera_id=self.camera_id)
            return np.ascontiguousarray(image.transpose(2, 0, 1))  # (3, H, W) uint8
        return np.concatenate([np.asarray(v, dtype=np.float32).ravel() for v in observation.values()])
