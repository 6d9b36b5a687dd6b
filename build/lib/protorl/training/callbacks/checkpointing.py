"""Checkpoints on a schedule: the whole phase, at the first episode end past each `checkpoints.every_frames`
frames or `checkpoints.every_minutes` minutes."""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from pathlib import Path

from protorl.config import CheckpointsConfig
from protorl.storage.checkpoints import save_checkpoint
from protorl.training.callbacks import Callback, Every


class Checkpoints(Callback):
    """Writes `state()` to `directory`/checkpoint_<frames>.pt when one is due, keeping the newest
    `checkpoints.keep`."""

    def __init__(self, cfg: CheckpointsConfig, directory: Path, state: Callable[[], dict]):
        """`state`: a bound method returning everything needed to continue the phase (`Trainer.state_dict`); held
        weakly, so the phase it belongs to is freed when dropped."""
        self.cfg, self.directory, self._state = cfg, directory, weakref.WeakMethod(state)
        self.schedule = Every(cfg.every_frames)
        self._last_time = time.time()

    def on_phase_start(self, frames: int) -> None:
        self._last_time = time.time()

    def on_episode_end(self, frames: int) -> None:
        minutes = self.cfg.every_minutes
        if self.schedule.due(frames) or (minutes is not None and time.time() - self._last_time >= 60 * minutes):
            self.save(frames)

    def save(self, frames: int) -> Path:
        self.schedule.advance(frames)
        self._last_time = time.time()
        return save_checkpoint(self._state()(), self.directory, frames, self.cfg.keep)

    def state_dict(self) -> dict:
        return {"next_checkpoint_frames": self.schedule.next}

    def load_state_dict(self, checkpoint: dict) -> None:
        self.schedule.next = checkpoint["next_checkpoint_frames"]
