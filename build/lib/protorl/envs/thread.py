"""One environment's steps on a thread of their own, so that physics and rendering overlap the agent's update.

A rendering context (EGL, OSMesa) belongs to the thread that first renders with it, so every call that may render
(`reset`, `step`, `close`) goes to that thread. The training loop's update at agent step t never reads transition t,
so `env.step(a_t)` can run while it does: results are the same as one after the other.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from protorl.envs.env import Env
from protorl.envs.time_step import TimeStep


def _run_now(fn: Callable[..., Any], *args) -> Future:
    """`fn(*args)` called in the caller, as a completed future (what `ThreadPoolExecutor.submit` returns)."""
    future: Future = Future()
    try:
        future.set_result(fn(*args))
    except Exception as error:  # re-raised by future.result(), as from the thread
        future.set_exception(error)
    return future


class EnvThread:
    """`reset`, `step` and `close` of `env`: on a thread of their own if `threaded`, else in the caller."""

    def __init__(self, env: Env, threaded: bool):
        self.env = env
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="protorl-env") if threaded else None

    def _call(self, fn: Callable[..., Any], *args) -> Future:
        return _run_now(fn, *args) if self._pool is None else self._pool.submit(fn, *args)

    def reset(self) -> TimeStep:
        return self._call(self.env.reset).result()

    def step(self, action: np.ndarray) -> Future:
        """Start `env.step(action)`; the future's result is its `TimeStep`."""
        return self._call(self.env.step, action)

    def close(self) -> None:
        """With a thread: free the environment (it must not be used again) on it, then stop it. Without one,
        nothing: the environment is freed with the process, on the thread that rendered."""
        if self._pool is not None:
            self._pool.submit(self.env.close).result()
            self._pool.shutdown()
