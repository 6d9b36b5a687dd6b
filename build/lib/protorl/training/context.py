"""What the callbacks of a phase share with its loop, without holding the loop: which phase it is, its clock and
the one read-back of the update metrics."""

from __future__ import annotations

import time
from pathlib import Path

from protorl.errors import TrainingDiverged
from protorl.logs.logger import Logger
from protorl.storage.checkpoints import list_checkpoints


class PhaseContext:
    """One phase (pre-training or fine-tuning on `task`) as its callbacks see it."""

    def __init__(self, phase: str, task: str, logger: Logger, checkpoint_dir: Path):
        self.phase, self.task = phase, task
        self.logger, self.checkpoint_dir = logger, checkpoint_dir
        self.elapsed_before = 0.0  # wall time of the phase's earlier attempts, before a resume
        self._start = time.time()

    def start_clock(self) -> None:
        """The loop (re)starts now."""
        self._start = time.time()

    def elapsed(self) -> float:
        """Wall time of the phase so far in seconds, resumed runs' earlier attempts included."""
        return self.elapsed_before + time.time() - self._start

    def check_finite(self, frames: int) -> None:
        """`TrainingDiverged` if an update metric since the last check is NaN or infinite. Run at every episode
        end and before an evaluation or a snapshot: the one read-back of the metrics there is their only one."""
        bad = self.logger.flush()
        if bad:
            raise TrainingDiverged(f"{self.phase} stopped at frame {frames}: non-finite "
                                   f"{', '.join(sorted(bad))} in the updates since the last check "
                                   f"({', '.join(f'{k}={bad[k]}' for k in sorted(bad))}); {self.last_checkpoint()}")

    def last_checkpoint(self) -> str:
        """Where a diverged phase can be resumed from, as a clause of its error message."""
        checkpoints = list_checkpoints(self.checkpoint_dir)
        return f"the last good checkpoint is {checkpoints[-1]}" if checkpoints else "no checkpoint was written"
