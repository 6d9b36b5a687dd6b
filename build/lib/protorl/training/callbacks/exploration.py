"""The pre-training analyses on a schedule: a training callback that runs every analysis and writes their rows.

Every time step's physical state is kept and, at the episode's end, binned into the phase's visits
(`protorl.exploration.analysis.Visits`). Every `analyses.every_frames`, at the next episode end, and once at the
end of the phase, each analysis (`analysis_classes`: state coverage, reward variance, the state probe, the
visitation map, then any registered with `protorl.exploration.analysis.register_analysis`) measures, in that
order, and one row goes to `analysis.csv` and TensorBoard, with `analysis/time_s`, the time they took.

Each moment's analyses draw from one generator seeded by (seed, frames), and the visits, each analysis's state, the
schedule and the CSV position are in `state_dict()`: a resumed run logs the same rows as a straight one.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from protorl.agents.capabilities import Prototypes
from protorl.config import AnalysesConfig, EnvConfig
from protorl.envs import Env, Simulated, TimeStep
from protorl.errors import CheckpointError
from protorl.exploration.analysis import Analysis, AnalysisContext, Moment, Visits, registered_analyses
from protorl.exploration.coverage import coverage_spec
from protorl.exploration.maps import VisitationMap
from protorl.exploration.probe import StateProbe
from protorl.exploration.reward_variance import ReplayProjections, RewardVariance
from protorl.exploration.state_coverage import Coverage
from protorl.logs.logger import CSVFile, Logger
from protorl.replay import ReplayBuffer
from protorl.training.callbacks import Callback, Every

BUILT_IN = (Coverage, RewardVariance, StateProbe, VisitationMap)  # in the order they measure (and draw)
# why a checkpoint is refused when it was written with analyses on or off and this run has them the other way
OTHER_SETTINGS = ("checkpoint was written with analyses {}: resume with the run's own analyses.every_frames, or "
                  "start over with start_over=true")


def analysis_classes() -> list[type[Analysis]]:
    """The analyses a pre-training runs, in order: the built-in ones, then the registered ones."""
    return [*BUILT_IN, *registered_analyses()]


def analysis_columns() -> list[str]:
    """The columns of `analysis.csv`: frames, every analysis's, and the time they took."""
    return ["frames", *(column for cls in analysis_classes() for column in cls.columns), "analysis/time_s"]


class AnalysisMonitor(Callback):
    """Every analysis of one pre-training phase, on its schedule, written into `out_dir`."""

    def __init__(self, cfg: AnalysesConfig, env_cfg: EnvConfig, seed: int, downstream_tasks: list[str],
                 total_frames: int, env: Env, agent, replay: ReplayBuffer, logger: Logger, out_dir: Path):
        """`env_cfg`, `seed`: how the training environment was made, for the analyses' own environments;
        `downstream_tasks`: the targets marked on the maps; `total_frames`: the phase's budget."""
        self.seed, self.agent, self.replay, self.logger = seed, agent, replay, logger
        self.schedule = Every(cfg.every_frames)
        self.last_frames = -1  # frames of the latest analysis
        spec = coverage_spec(env.domain, env.physics, cfg.coverage_bins) if isinstance(env, Simulated) else None
        self.visits = Visits(spec)
        context = AnalysisContext(cfg, env_cfg, seed, downstream_tasks, total_frames, env, agent, replay,
                                  self.visits, logger, out_dir)
        self.analyses = [cls(context) for cls in analysis_classes()]
        self.csv = CSVFile(out_dir / "analysis.csv", analysis_columns())

    def on_time_step(self, time_step: TimeStep) -> None:
        self.visits.add(time_step.physical_state)

    def on_episode_end(self, frames: int) -> None:
        """Bin the episode's states; analyse if an analysis is due."""
        self.visits.end_episode()
        if self.schedule.due(frames):
            self.analyze(frames)

    def on_phase_end(self, frames: int) -> None:
        """A last analysis (unless one just ran), and what each analysis completes at the end."""
        self.on_episode_end(frames)
        if self.last_frames != frames:
            self.analyze(frames)
        for analysis in self.analyses:
            analysis.finish(frames)
        self.csv.close()

    def analyze(self, frames: int) -> dict[str, float]:
        """Let every analysis measure at `frames`; write and log their row."""
        started = time.time()
        # the replay's projections, each observation encoded once for every analysis of this moment
        projections = ReplayProjections(self.agent, self.replay) if isinstance(self.agent, Prototypes) else None
        moment = Moment(frames, np.random.default_rng([self.seed, frames]), projections)
        row: dict[str, float] = {"frames": frames}
        for analysis in self.analyses:
            row.update(analysis.measure(moment))
        row["analysis/time_s"] = time.time() - started
        self.csv.write(row)
        self.logger.log_scalars(row)
        self.last_frames = frames
        return row

    # -- checkpoints -------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Drop the rows and files an earlier attempt of this phase wrote without leaving a checkpoint."""
        self.csv.reset()
        for analysis in self.analyses:
            analysis.reset()

    def state_dict(self) -> dict:
        self.csv.sync()
        state = {"next_frames": self.schedule.next, "last_frames": self.last_frames, "csv": self.csv.tell(),
                 **self.visits.state_dict()}
        for analysis in self.analyses:
            state.update(analysis.state_dict())
        return {"monitor": state}

    def load_state_dict(self, checkpoint: dict) -> None:
        """Continue from `state_dict()`; rows written after it are dropped from `analysis.csv`."""
        state = checkpoint["monitor"]
        if state is None:
            raise CheckpointError(OTHER_SETTINGS.format("off"))
        self.visits.load_state_dict(state)
        self.schedule.next, self.last_frames = int(state["next_frames"]), int(state["last_frames"])
        self.csv.truncate(state["csv"])
        for analysis in self.analyses:
            analysis.load_state_dict(state)


class NoAnalyses(Callback):
    """A phase without analyses: its checkpoints say so, and one written with analyses is refused."""

    def state_dict(self) -> dict:
        return {"monitor": None}

    def load_state_dict(self, checkpoint: dict) -> None:
        if checkpoint["monitor"] is not None:
            raise CheckpointError(OTHER_SETTINGS.format("on"))
