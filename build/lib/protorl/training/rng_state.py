"""The random state of a phase as plain data: every generator a resumed run must continue exactly."""

from __future__ import annotations

import random

import numpy as np
import torch

from protorl.envs import Env


def capture_rngs(trainer_rng: np.random.Generator, env: Env, eval_env: Env) -> dict:
    """The Trainer's generator, torch's (CPU, and each CUDA device's where CUDA is available), NumPy's and Python's
    global ones, and both environments'."""
    return {"trainer": trainer_rng.bit_generator.state, "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": _numpy_global_state(), "python": _python_state(),
            "env": env.rng_state(), "eval_env": eval_env.rng_state()}


def restore_rngs(state: dict, trainer_rng: np.random.Generator, env: Env, eval_env: Env) -> None:
    """Set every generator `capture_rngs` captured back to `state`."""
    trainer_rng.bit_generator.state = state["trainer"]
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda") or []  # written where CUDA was available; restored where the same devices are
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    np.random.set_state(("MT19937", np.asarray(state["numpy"]["keys"], dtype=np.uint32), *state["numpy"]["rest"]))
    random.setstate((state["python"]["version"], tuple(state["python"]["state"]), None))
    env.set_rng_state(state["env"])
    eval_env.set_rng_state(state["eval_env"])


def _numpy_global_state() -> dict:
    _, keys, *rest = np.random.get_state()
    return {"keys": keys.tolist(), "rest": [int(rest[0]), int(rest[1]), float(rest[2])]}


def _python_state() -> dict:
    version, state, _ = random.getstate()
    return {"version": version, "state": list(state)}
