"""Observations as the last `frame_stack` frames, stacked on the first axis: what every environment of protorl
shares (appendix C.1's frame stacking; from states the stack is one frame)."""

from __future__ import annotations

from collections import deque

import numpy as np


class FrameStack:
    """The frame stack of an environment whose `frame_shape` is one (3, H, W) uint8 or (S,) float32 frame."""

    obs_type: str
    frame_stack: int
    frame_shape: tuple[int, ...]  # the environment's own: (3, H, W) or (S,)

    def _start_stack(self) -> None:
        self._frames: deque[np.ndarray] = deque(maxlen=self.frame_stack)

    @property
    def frame_dtype(self) -> np.dtype:
        return np.dtype(np.uint8) if self.obs_type == "pixels" else np.dtype(np.float32)

    @property
    def obs_shape(self) -> tuple[int, ...]:
        first, *rest = self.frame_shape
        return (first * self.frame_stack, *rest)

    def _first_stack(self, frame: np.ndarray) -> np.ndarray:
        """An episode's first observation: its first frame repeated `frame_stack` times."""
        for _ in range(self.frame_stack):
            self._frames.append(frame)
        return self._stacked()

    def _push(self, frame: np.ndarray) -> np.ndarray:
        """The observation after `frame`: the stack with the oldest frame dropped."""
        self._frames.append(frame)
        return self._stacked()

    def _stacked(self) -> np.ndarray:
        if self.frame_stack == 1:
            return self._frames[-1]
        return np.concatenate(list(self._frames), axis=0)
