"""What a training phase does besides its loop (evaluation, snapshots, logs, analyses, checkpoints): callbacks.

The Trainer calls each hook of its callbacks, in their order, at the moment the hook names; a checkpoint holds
every callback's entries beside the Trainer's own. Those that run every so often share one schedule, `Every`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from protorl.envs import TimeStep


class Callback:
    """Base class: every hook does nothing; a callback overrides those it needs."""

    def on_phase_start(self, frames: int) -> None:
        """The loop starts, `frames` into the phase: 0, or where a resumed checkpoint left off."""

    def before_step(self, frames: int) -> None:
        """The agent is about to act, `frames` into the phase."""

    def on_time_step(self, time_step: TimeStep) -> None:
        """The environment returned `time_step`: an episode's first, or the result of an action."""

    def on_episode_end(self, frames: int) -> None:
        """An episode ended, `frames` into the phase (the environment is not reset yet)."""

    def on_phase_end(self, frames: int) -> None:
        """The loop reached the phase's budget of `frames`; the phase's result is written next."""

    def close(self) -> None:
        """The loop has stopped, at the phase's end or not (Ctrl-C, an error): release what it holds open."""

    def state_dict(self) -> dict:
        """Its entries of a checkpoint (tensors and plain data)."""
        return {}

    def load_state_dict(self, checkpoint: dict) -> None:
        """Continue from its entries of `checkpoint`; raise `CheckpointError` if this run cannot."""

    def reset(self) -> None:
        """The phase starts with no checkpoint: drop what an earlier attempt of it wrote."""


class Every:
    """A schedule in any unit (environment frames, episodes): due at the first count at or past each multiple of
    `n`, from `first` (default `n`) on; never if `n` is None."""

    def __init__(self, n: int | None, first: int | None = None):
        self.n = n
        self.next = n if first is None else first  # the count at which it is next due

    def due(self, count: int) -> bool:
        """Whether it is due at `count`; if so, it is next due at the first multiple of `n` past `count`."""
        if self.n is None or count < self.next:
            return False
        self.advance(count)
        return True

    def advance(self, count: int) -> None:
        """Next due at the first multiple of `n` past `count` (after something ran at `count` for another reason)."""
        if self.n is not None:
            self.next = (count // self.n + 1) * self.n
