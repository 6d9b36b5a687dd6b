"""Shared fixtures: a tiny agent configuration, replay buffers and agent factories; the test tiers.

Everything is sized so that one agent update takes milliseconds on a CPU: 32x32 pixel frames, batch 8,
16 prototypes of dimension 16.

Tiers (pyproject.toml's markers): `pytest -m "not slow"` runs the unit tests; `slow` marks the tests that run
protorl's commands or real training; `research` marks those that check a research outcome at a tiny size, and
is slow too; `pytest` runs everything.
"""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from protorl.agents import ProtoAgent  # noqa: E402
from protorl.agents.proto.agent import ProtoConfig  # noqa: E402
from protorl.replay import ReplayBuffer  # noqa: E402
from tests.agents import (  # noqa: E402
    FRAME_STACK,
    IMAGE_SIZE,
    PIXEL_OBS_SHAPE,
    POINT_MASS_ACTION_SHAPE,
    tiny_agent,
    tiny_config,
)

# The tensors here are tiny: one intra-op thread is faster, and avoids OpenMP spin-waiting slowing the
# suite ~10x when another process is using the CPU.
torch.set_num_threads(1)

@pytest.fixture
def tiny_cfg() -> ProtoConfig:
    """A fresh tiny ProtoConfig (paper values for everything but the sizes)."""
    return tiny_config("proto")


@pytest.fixture
def make_cfg():
    """Factory: the tiny ProtoConfig with some fields overridden."""
    return lambda **overrides: tiny_config("proto", **overrides)


@pytest.fixture(scope="package")  # the tests package: one collection of data for all of them
def point_mass_env_data():
    """(replay, env spec) from 70 random-action steps of a real point_mass_easy at 32x32 pixels.

    Two episodes' worth of boundaries are included by starting a second episode part way through.
    """
    from protorl.envs import DMCEnv

    env = DMCEnv("point_mass_easy", obs="pixels", image_size=IMAGE_SIZE, frame_stack=FRAME_STACK,
                 action_repeat=2, seed=0)
    replay = ReplayBuffer(env.frame_shape, env.frame_dtype, env.action_shape, capacity=200,
                          frame_stack=env.frame_stack, seed=0)
    rng = np.random.default_rng(0)
    for episode_len in (40, 30):
        time_step = env.reset()
        replay.add_first(time_step.frame)
        for _ in range(episode_len):
            action = rng.uniform(-1.0, 1.0, size=env.action_shape).astype(np.float32)
            time_step = env.step(action)
            replay.add(time_step.frame, action, time_step.reward, time_step.discount)
    assert env.obs_shape == PIXEL_OBS_SHAPE and env.action_shape == POINT_MASS_ACTION_SHAPE
    return replay, env.spec()


@pytest.fixture
def replay(point_mass_env_data) -> ReplayBuffer:
    """A private copy (frames and sampling RNG state) of the point_mass replay buffer."""
    return copy.deepcopy(point_mass_env_data[0])


@pytest.fixture
def point_mass_spec(point_mass_env_data) -> dict:
    return copy.deepcopy(point_mass_env_data[1])


@pytest.fixture
def random_replay() -> ReplayBuffer:
    """A replay buffer of random uint8 frames and rewards, for tests that need no environment."""
    rng = np.random.default_rng(123)
    replay = ReplayBuffer((3, IMAGE_SIZE, IMAGE_SIZE), np.dtype(np.uint8), POINT_MASS_ACTION_SHAPE,
                          capacity=100, frame_stack=FRAME_STACK, seed=1)
    replay.add_first(rng.integers(0, 256, (3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8))
    for _ in range(50):
        replay.add(rng.integers(0, 256, (3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8),
                   rng.uniform(-1, 1, 2).astype(np.float32), float(rng.uniform()), 1.0)
    return replay


@pytest.fixture
def build_agent(tiny_cfg):
    """Factory: a pixel ProtoAgent for point_mass (9x32x32 observations, 2-d actions) on the CPU."""

    def factory(mode: str = "pretrain", cfg: ProtoConfig | None = None, seed: int | None = None) -> ProtoAgent:
        return tiny_agent("proto", mode, cfg or tiny_cfg, seed)

    return factory


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A research-outcome test is in the slow tier too."""
    for item in items:
        if item.get_closest_marker("research") is not None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def mount():
    """mount(path, options): a tmpfs at `path` (root only; skips elsewhere), unmounted at the end."""
    mounted = []

    def make(path: Path, options: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                                               capture_output=True).returncode != 0:
            pytest.skip("needs to mount a tmpfs (root)")
        mounted.append(path)
        return path

    yield make
    for path in reversed(mounted):  # lazily: a file a failed test left open would keep it mounted
        subprocess.run(["umount", "--lazy", str(path)], check=False)
