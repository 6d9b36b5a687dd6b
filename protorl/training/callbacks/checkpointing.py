"""Checkpoints on a schedule: the whole phase, at the first episode end past each `checkpoint_every_frames`
frames or `checkpoint_every_minutes` minutes."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from protorl.config import Config
from protorl.storage.checkpoints import save_checkpoint
from protorl.training.callbacks import Callback, Every


class Checkpoints(Callback):
    """Writes `state()` to `directory`/checkpoint_<frames>.pt when one is due, keeping the newest
    `checkpoint_keep`."""

    def __init__(self, cfg: Config, directory: Path, state: Callable[[], dict]):
        """`state`: everything needed to continue the phase (`Trainer.state_dict`)."""
        self.cfg, self.directory, self.state = cfg, directory, state
        self.schedule = Every(cfg.checkpoint_every_frames)
        self._last_time = time.time()

    def on_phase_start(self, frames: int) -> None:
        self._last_time = time.time()

    def on_episode_end(self, frames: int) -> None:
        minutes = self.cfg.checkpoint_every_minutes
        if self.schedule.due(frames) or (minutes is not None and time.time() - self._last_time >= 60 * minutes):
            self.save(frames)

    def save(self, frames: int) -> Path:
        self.schedule.advance(frames)
        self._last_time = time.time()
        return save_checkpoint(self.state(), self.directory, frames, self.cfg.checkpoint_keep)

    def state_dict(self) -> dict:
        return {"next_checkpoint_frames": self.schedule.next}

    def load_state_dict(self, checkpoint: dict) -> None:
        self.schedule.next = checkpoint["next_checkpoint_frames"]
