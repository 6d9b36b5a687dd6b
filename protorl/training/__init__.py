"""Training: the loop of one phase (`Trainer`), its callbacks and its result."""

from protorl.errors import TrainingDiverged
from protorl.runtime import prepare_process
from protorl.training.loop import Trainer
from protorl.training.result import PhaseResult

__all__ = ["PhaseResult", "Trainer", "TrainingDiverged", "prepare_process"]
