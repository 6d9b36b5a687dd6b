"""What an analysis of a pre-training is: a class with a small interface, run on the phase's analysis schedule.

The training callback `protorl.training.callbacks.exploration.AnalysisMonitor` builds one of each analysis
(`analysis_classes`: the four built in, then those registered with `register_analysis`), in that order, and at each
scheduled moment (every `analyses.every_frames` frames, at the next episode end, and at the phase's end) writes
one row of `analysis.csv` (and TensorBoard) with what each measured. An analysis

- names its columns (`columns`, a class attribute: `analysis.csv` has every analysis's, empty where one measured
  nothing);
- measures at a `Moment` (`measure`), drawing any randomness from the moment's generator in its turn, so that a
  resumed run draws what a straight one does; an analysis that does not apply to a run (another domain, an agent
  without prototypes) measures nothing;
- may write a figure as it measures, and finish one at the phase's end (`finish`);
- keeps what it must carry over a resume in `state_dict()` (tensors and plain data, keys of its own);
- says what `protorl-analyze RUN_DIR` shows of it (`report`, from what the run logged: `LoggedRun`): lines of the
  summary, and the figures it writes into `RUN_DIR/analysis/` (named in `outputs`).

The states visited in the phase (`Visits`) are shared by the analyses that read them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from protorl.errors import CheckpointError
from protorl.exploration.coverage import CoverageSpec, histogram
from protorl.plots import Rows

if TYPE_CHECKING:
    from protorl.config import AnalysesConfig, EnvConfig
    from protorl.envs import Env
    from protorl.logs.logger import Logger
    from protorl.replay import ReplayBuffer


class Visits:
    """Every physical state visited in the phase, as a cumulative histogram over `spec`'s cells (unlike the replay's
    ring, it never forgets): a time step's state is kept, and the episode's are binned at its end. Without a
    `spec` (a domain with no coverage coordinates) it keeps nothing."""

    def __init__(self, spec: CoverageSpec | None):
        self.spec = spec
        self.counts = None if spec is None else np.zeros(spec.shape, dtype=np.int64)
        self.pending: list[np.ndarray] = []  # this episode's physical states

    def add(self, physical_state: np.ndarray) -> None:
        self.pending.append(physical_state)

    def end_episode(self) -> None:
        if self.counts is not None and self.pending:
            self.counts += histogram(np.stack(self.pending), self.spec).reshape(self.spec.shape)
        self.pending.clear()

    def state_dict(self) -> dict:
        pending = np.stack(self.pending) if self.pending else np.zeros((0, 0))
        return {"counts": None if self.counts is None else torch.from_numpy(self.counts.copy()),
                "pending": torch.from_numpy(pending)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state_dict()`; `CheckpointError` if it was binned over other cells."""
        saved_shape = None if state["counts"] is None else tuple(state["counts"].shape)
        if saved_shape is None and self.counts is not None:
            raise CheckpointError("checkpoint kept no coverage histogram (written before this domain had coverage "
                                  f"coordinates), this run's has shape {self.counts.shape}: the coverage of the "
                                  "frames before it cannot be counted; start over with start_over=true")
        if saved_shape != (None if self.counts is None else self.counts.shape):
            raise CheckpointError(f"checkpoint's coverage histogram has shape {saved_shape}, this run's "
                                  f"{None if self.counts is None else self.counts.shape}: resume with the run's "
                                  "own analyses.coverage_bins, or start over with start_over=true")
        if self.counts is not None:
            self.counts[...] = state["counts"].numpy()
        self.pending = list(state["pending"].numpy())


@dataclass
class AnalysisContext:
    """What an analysis of one pre-training phase may read: its settings, the phase's environment (read only),
    agent, replay, visited states and logger, and where its files go."""

    cfg: AnalysesConfig
    env_cfg: EnvConfig  # how the training environment was made: for an analysis's own environment
    seed: int
    downstream_tasks: list[str]  # the tasks the pre-training is for (the maps mark their targets)
    total_frames: int  # the phase's budget
    env: Env
    agent: object
    replay: ReplayBuffer
    visits: Visits
    logger: Logger
    out_dir: Path


class Projections(Protocol):
    """The replay's projections before L2 normalisation (`protorl.exploration.reward_variance.ReplayProjections`)."""

    def at(self, ends: np.ndarray) -> torch.Tensor:
        """Projections (N, D) of the observations ending at absolute replay indices `ends` (N,)."""


@dataclass
class Moment:
    """One scheduled analysis: `frames` into the phase, the generator the analyses draw from in their order
    (seeded by the run's seed and `frames`), and the replay's projections for an agent with prototypes (each
    observation encoded once, shared by the analyses of this moment), else None."""

    frames: int
    rng: np.random.Generator
    projections: Projections | None


@dataclass
class LoggedRun:
    """What a pre-training logged, as `protorl-analyze` hands it to each analysis's `report`."""

    rows: Rows  # analysis.csv: per row, its non-empty values (frames included)
    columns: list[str]  # analysis.csv's header; empty for a file whose header never reached the disk
    phase_dir: Path  # the pre-training's directory
    out_dir: Path  # RUN_DIR/analysis/, where the figures go
    config: Any  # the run's config.yaml (an OmegaConf DictConfig), or None
    verified: Callable[[Path], Path]  # a path to read, checked to lie inside the run directory

    def missing(self, keys: Iterable[str]) -> list[str]:
        """Those of `keys` that analysis.csv has no column for (an older run); none where it has no header."""
        return [key for key in keys if key not in self.columns] if self.columns else []


@dataclass
class Report:
    """An analysis's part of what protorl-analyze shows."""

    lines: list[str] = field(default_factory=list)  # of the summary, indented by two spaces
    written: list[Path] = field(default_factory=list)  # its figures
    missing: list[str] = field(default_factory=list)  # the columns it reads that analysis.csv lacks


class Analysis:
    """Base class: measures nothing, keeps nothing, reports nothing. An analysis overrides `columns` and `measure`,
    and what else it needs."""

    columns: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()  # the files its `report` writes into RUN_DIR/analysis/

    def __init__(self, context: AnalysisContext):
        self.context = context

    def measure(self, moment: Moment) -> dict[str, float]:
        """Its columns' values at `moment` (some or none of them)."""
        return {}

    def finish(self, frames: int) -> None:
        """The phase ended at `frames`, after its last analysis: complete a figure drawn along the way."""

    def reset(self) -> None:
        """The phase starts with no checkpoint: drop the files an earlier attempt of it wrote."""

    def state_dict(self) -> dict:
        """Its entries of the analyses' part of a checkpoint, under keys of its own."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Continue from its entries of `state`."""

    @classmethod
    def report(cls, run: LoggedRun) -> Report:
        """What `protorl-analyze` shows of it for `run`: lines of the summary, figures in `run.out_dir`."""
        return Report()


_registered: list[type[Analysis]] = []


def register_analysis(cls: type[Analysis]) -> type[Analysis]:
    """Run `cls` in every pre-training from now on, after the built-in analyses and those registered before it;
    usable as a class decorator."""
    if cls not in _registered:
        _registered.append(cls)
    return cls


def unregister_analysis(cls: type[Analysis]) -> None:
    """Stop running `cls` (registered with `register_analysis`)."""
    _registered.remove(cls)


def registered_analyses() -> list[type[Analysis]]:
    """The analyses registered with `register_analysis`, in their order."""
    return list(_registered)
