"""A replay buffer that stores every rendered frame once and rebuilds frame stacks when sampling.

Slot `i` of a ring holds the frame seen after one agent step plus that step's action, reward and
discount. A transition is (stack ending at slot i-1, action, reward, discount, stack ending at slot i).
Stacks never reach back past their episode's first frame: like the environment at reset, they repeat
it instead. At 9x84x84 pixels a transition costs one 3x84x84 frame (~21.2 KB) instead of two 9x84x84
stacks (~127 KB). The ring holds `capacity` frames; each stored episode's first frame takes a slot,
so it holds `capacity` minus (episodes in the buffer) transitions.

With `device` (an accelerator), a copy of the frames also lives in its memory: batches are then gathered and
stacked there, and only their indices cross from the host. Otherwise batches are gathered on the host, in
pinned memory when they go to an accelerator, and copied without blocking.

Optionally each slot also keeps the simulator's physical state when its frame was rendered
(`physics.get_state()`: qpos, qvel, act), for analyses such as state coverage; agents never see it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Batch:
    obs: torch.Tensor  # (B, *obs_shape), the frames' dtype (uint8 for pixels)
    action: torch.Tensor  # (B, |A|) float32
    reward: torch.Tensor  # (B, 1) float32, the environment's reward
    discount: torch.Tensor  # (B, 1) float32
    next_obs: torch.Tensor  # (B, *obs_shape)


class ReplayBuffer:
    """Ring buffer of frames; samples transitions uniformly among those whose stacks are complete."""

    def __init__(self, frame_shape: tuple[int, ...], frame_dtype: np.dtype, action_shape: tuple[int, ...],
                 capacity: int, frame_stack: int, seed: int = 0,
                 physical_state_shape: tuple[int, ...] | None = None, device: torch.device | str | None = None):
        """`physical_state_shape`: (S,) to keep each frame's physical state too; None keeps none. `device`: also
        keep the frames there and sample from that copy; None: the host's frames only."""
        self.capacity = capacity
        self.frame_stack = frame_stack
        self.frames = np.zeros((capacity, *frame_shape), dtype=frame_dtype)
        self.actions = np.zeros((capacity, *action_shape), dtype=np.float32)
        self.rewards = np.zeros((capacity,), dtype=np.float32)
        self.discounts = np.zeros((capacity,), dtype=np.float32)
        self.episode_start = np.zeros((capacity,), dtype=np.int64)  # absolute index of the episode's 1st frame
        self.is_first = np.ones((capacity,), dtype=bool)
        self.physical_states = (None if physical_state_shape is None else
                                np.zeros((capacity, *physical_state_shape), dtype=np.float64))
        self.device_frames = None if device is None else torch.tensor(self.frames, device=device)  # a copy
        self.num_written = 0  # absolute index of the next slot to write
        self._current_episode_start = -1
        # absolute indices of the episode-first frames from `_oldest_sampleable` on, where no transition ends
        self._firsts_in_range: deque[int] = deque()
        self._rng = np.random.default_rng(seed)

    # -- writing ----------------------------------------------------------------------------------
    def add_first(self, frame: np.ndarray, physical_state: np.ndarray | None = None) -> None:
        """Start a new episode with its first frame (no transition ends here)."""
        self._current_episode_start = self.num_written
        self._write(frame, 0.0, 0.0, 1.0, True, physical_state)

    def add(self, frame: np.ndarray, action: np.ndarray, reward: float, discount: float,
            physical_state: np.ndarray | None = None) -> None:
        """Append the frame reached by taking `action`; completes one transition."""
        if self._current_episode_start < 0:
            raise RuntimeError("call add_first() with the episode's first frame before add()")
        self._write(frame, action, reward, discount, False, physical_state)

    def _write(self, frame, action, reward, discount, first: bool, physical_state) -> None:
        slot = self.num_written % self.capacity
        if (physical_state is None) != (self.physical_states is None):
            raise ValueError("pass a physical state with every frame if and only if the buffer keeps them")
        if physical_state is not None:
            self.physical_states[slot] = physical_state
        self.frames[slot] = frame
        if self.device_frames is not None:
            self.device_frames[slot].copy_(_pinned(torch.from_numpy(self.frames[slot])), non_blocking=True)
        self.actions[slot] = action
        self.rewards[slot] = reward
        self.discounts[slot] = discount
        self.is_first[slot] = first
        self.episode_start[slot] = self._current_episode_start
        if first:
            self._firsts_in_range.append(self.num_written)
        self.num_written += 1
        while self._firsts_in_range and self._firsts_in_range[0] < self._oldest_sampleable:
            self._firsts_in_range.popleft()

    # -- reading ----------------------------------------------------------------------------------
    @property
    def _oldest_sampleable(self) -> int:
        """Smallest absolute index a transition may end at: its whole stack is still in the ring."""
        return max(self.num_written - self.capacity + self.frame_stack, 1)

    def __len__(self) -> int:
        """Number of transitions that `sample` can return."""
        return max(self.num_written - self._oldest_sampleable, 0) - len(self._firsts_in_range)

    def _frame_indices(self, ends: np.ndarray, count: int) -> np.ndarray:
        """Slots of the `count` frames up to absolute indices `ends` (N,), oldest first, never reaching back past
        their episode's first frame (repeated instead) -> (N, count)."""
        offsets = np.arange(count - 1, -1, -1)
        starts = self.episode_start[ends % self.capacity]
        return np.maximum(ends[:, None] - offsets[None, :], starts[:, None]) % self.capacity

    def _frames_ending_at(self, ends: np.ndarray, count: int) -> np.ndarray:
        """The frames of `_frame_indices` -> (N, count, *frame_shape)."""
        return self.frames[self._frame_indices(ends, count)]

    def stack_at(self, ends: np.ndarray) -> np.ndarray:
        """Stacked observations ending at absolute indices `ends` (N,) -> (N, frame_stack * C, ...)."""
        frames = self._frames_ending_at(ends, self.frame_stack)
        return frames.reshape(len(ends), -1, *self.frames.shape[2:])

    def sample_indices(self, batch_size: int, rng: np.random.Generator | None = None) -> np.ndarray:
        """Absolute indices of `batch_size` transition ends, uniform over sampleable transitions.

        `rng`: draw with this generator instead of the buffer's own (which training's batches use).
        """
        lo, hi = self._oldest_sampleable, self.num_written
        if len(self) == 0:
            raise RuntimeError("the replay buffer holds no complete transition yet")
        rng = self._rng if rng is None else rng
        chosen = np.empty((0,), dtype=np.int64)
        while len(chosen) < batch_size:  # rejection of episode-first slots keeps the draw uniform
            draw = rng.integers(lo, hi, size=2 * batch_size)
            chosen = np.concatenate([chosen, draw[~self.is_first[draw % self.capacity]]])
        return chosen[:batch_size]

    def sample(self, batch_size: int, device: torch.device | str = "cpu") -> Batch:
        ends = self.sample_indices(batch_size)
        slots = ends % self.capacity

        def to_device(array: np.ndarray | torch.Tensor) -> torch.Tensor:
            """Host arrays through pinned memory, without waiting for the copy."""
            return _pinned(torch.as_tensor(array)).to(device, non_blocking=True)

        # obs and next_obs share all but one frame: gather frame_stack + 1 frames once
        indices = self._frame_indices(ends, self.frame_stack + 1)  # (B, fs + 1) slots
        if self.device_frames is not None:
            index = _pinned(torch.from_numpy(indices)).to(self.device_frames.device, non_blocking=True)
            frames = self.device_frames[index]  # (B, fs + 1, *frame_shape), where the copy lives
        else:
            frames = torch.from_numpy(self.frames[indices])  # (B, fs + 1, *frame_shape)
        stack_shape = (batch_size, -1, *self.frames.shape[2:])
        return Batch(
            obs=to_device(frames[:, :-1].reshape(stack_shape)),
            action=to_device(self.actions[slots]),
            reward=to_device(self.rewards[slots, None]),
            discount=to_device(self.discounts[slots, None]),
            next_obs=to_device(frames[:, 1:].reshape(stack_shape)),
        )

    def stored_physical_states(self) -> np.ndarray:
        """The physical states of every frame in the ring, in slot order: (min(written, capacity), S)."""
        if self.physical_states is None:
            raise RuntimeError("this replay buffer keeps no physical states")
        return self.physical_states[: min(self.num_written, self.capacity)]

    # -- sampling's random state ----------------------------------------------------------------------
    def reseed(self, seed: int | list[int]) -> None:
        """Draw the next batches from a generator seeded with `seed`."""
        self._rng = np.random.default_rng(seed)

    def rng_state(self) -> dict:
        """The sampling generator's state, as plain data."""
        return self._rng.bit_generator.state

    def set_rng_state(self, state: dict) -> None:
        self._rng.bit_generator.state = state

    # -- persistence (checkpoints) ---------------------------------------------------------------------
    @property
    def _arrays(self) -> tuple[str, ...]:
        names = ("frames", "actions", "rewards", "discounts", "episode_start", "is_first")
        return names if self.physical_states is None else (*names, "physical_states")

    def state_dict(self) -> dict:
        """Contents, write position and sampling RNG, as tensors and plain data."""
        filled = min(self.num_written, self.capacity)
        arrays = {name: torch.from_numpy(getattr(self, name)[:filled].copy()) for name in self._arrays}
        return {"arrays": arrays, "num_written": self.num_written,
                "current_episode_start": self._current_episode_start, "rng": self.rng_state()}

    def load_state_dict(self, state: dict) -> None:
        for name in self._arrays:
            values = state["arrays"][name].numpy()
            getattr(self, name)[: len(values)] = values
        self.num_written = int(state["num_written"])
        self._current_episode_start = int(state["current_episode_start"])
        self.set_rng_state(state["rng"])
        if self.device_frames is not None:
            self.device_frames.copy_(torch.from_numpy(self.frames))
        ends = np.arange(self._oldest_sampleable, self.num_written)
        self._firsts_in_range = deque(ends[self.is_first[ends % self.capacity]].tolist())

    @property
    def nbytes(self) -> int:
        """Bytes held by all arrays of the buffer."""
        return sum(getattr(self, name).nbytes for name in self._arrays)

    @property
    def bytes_per_transition(self) -> float:
        return self.nbytes / self.capacity


def _pinned(tensor: torch.Tensor) -> torch.Tensor:
    """A host tensor in page-locked memory when CUDA is present (copies from it to the GPU need not wait), else
    the tensor itself."""
    return tensor.pin_memory() if torch.cuda.is_available() and tensor.device.type == "cpu" else tensor


def frames_device(device: torch.device, frames_nbytes: int, wanted: bool | None) -> torch.device | None:
    """Where a replay buffer also keeps its frames (`ReplayBuffer(device=...)`): on `device` if `wanted`; for
    None, if it is a CUDA device whose free memory is over twice the frames' size; else nowhere (None)."""
    if wanted is None:
        wanted = device.type == "cuda" and frames_nbytes * 2 < torch.cuda.mem_get_info(device)[0]
    return device if wanted else None
