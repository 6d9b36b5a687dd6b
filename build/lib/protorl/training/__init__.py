"""Training: the loop of one phase (`Trainer`), its callbacks and its result."""

from protorl.errors import TrainingDiverged
from protorl.runtime import prepare_process
from protorl.training.loop import Trainer
from protorl.training.phases import PlannedPhase, phase_of, planned_phases
from protorl.training.result import PhaseResult

__all__ = ["PhaseResult", "PlannedPhase", "Trainer", "TrainingDiverged", "phase_of", "planned_phases",
           "prepare_process"]
