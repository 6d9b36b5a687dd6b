"""The state-coverage analysis: how evenly the phase's policy has visited the domain's coverage cells.

- `coverage/entropy`, `coverage/visited_fraction`: of the cumulative histogram of every state visited (`Visits`);
- `coverage/replay_entropy`: of the states in the replay buffer now, the paper's reading of section 5.6 (differs
  from the cumulative one once the buffer has wrapped);
- `coverage/random_entropy`, `coverage/random_visited_fraction`: the same for a uniform-random policy over the
  same number of frames (`analyses.random_reference`; `protorl.exploration.random_reference`).
"""

from __future__ import annotations

from protorl.exploration.analysis import Analysis, AnalysisContext, LoggedRun, Moment, Report
from protorl.exploration.coverage import coverage_entropy, histogram, visited_fraction
from protorl.exploration.random_reference import RandomPolicyCoverage
from protorl.plots import Curve, Panel, has, plot_curves, series

CURVES = {  # column -> (legend, line format)
    "coverage/entropy": ("agent: normalised entropy of the visited states", "o-"),
    # the same as the visited states' until the buffer wraps: a line without markers, so both stay visible
    "coverage/replay_entropy": ("agent: normalised entropy of the replay buffer", "--"),
    "coverage/visited_fraction": ("agent: fraction of cells visited", "^-"),
    "coverage/random_entropy": ("uniform-random policy: normalised entropy", "o:"),
    "coverage/random_visited_fraction": ("uniform-random policy: fraction of cells visited", "^:"),
}
AGENT_FIGURES = ("coverage/entropy", "coverage/replay_entropy", "coverage/visited_fraction")  # the summary's
RANDOM_FIGURES = ("coverage/random_entropy", "coverage/random_visited_fraction")


class Coverage(Analysis):
    """State coverage of the phase so far, of its replay buffer, and of a uniform-random policy; nothing for a
    domain without coverage coordinates."""

    columns = ("coverage/entropy", "coverage/visited_fraction", "coverage/replay_entropy",
               "coverage/random_entropy", "coverage/random_visited_fraction")
    outputs = ("coverage.png",)

    def __init__(self, context: AnalysisContext):
        super().__init__(context)
        spec, env = context.visits.spec, context.env
        self.random_policy = (RandomPolicyCoverage(env.task, env.action_repeat, spec, context.seed)
                              if spec is not None and context.cfg.random_reference else None)

    def measure(self, moment: Moment) -> dict[str, float]:
        visits, row = self.context.visits, {}
        if visits.spec is not None:
            replay_counts = histogram(self.context.replay.stored_physical_states(), visits.spec)
            row.update({"coverage/entropy": coverage_entropy(visits.counts),
                        "coverage/visited_fraction": visited_fraction(visits.counts),
                        "coverage/replay_entropy": coverage_entropy(replay_counts)})
        if self.random_policy is not None:
            random_counts = self.random_policy.counts_at(moment.frames)
            row.update({"coverage/random_entropy": coverage_entropy(random_counts),
                        "coverage/random_visited_fraction": visited_fraction(random_counts)})
        return row

    def state_dict(self) -> dict:
        return {"random_policy": None if self.random_policy is None else self.random_policy.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self.random_policy is not None and state.get("random_policy") is not None:  # else rolled again
            self.random_policy.load_state_dict(state["random_policy"])

    @classmethod
    def report(cls, run: LoggedRun) -> Report:
        """coverage.png (coverage over frames, next to a uniform-random policy's) and the last figures."""
        rows, missing, written, lines = run.rows, run.missing(cls.columns), [], []
        curves = [Curve(*series(rows, key), label, fmt) for key, (label, fmt) in CURVES.items() if has(rows, key)]
        if curves:
            path = run.out_dir / "coverage.png"
            plot_curves([Panel("state coverage during pre-training,\nagainst a uniform-random policy over the same "
                               "frames", "coverage (higher: explored more)", curves, ylim=(0.0, 1.0))], [path])
            written.append(path)
        last = rows[-1] if rows else {}
        if all(key in last for key in AGENT_FIGURES):
            first = next(row for row in rows if "coverage/entropy" in row)
            lines.append(f"  coverage at {last['frames']:.0f} frames: normalised entropy "
                         f"{last['coverage/entropy']:.3f} (replay buffer {last['coverage/replay_entropy']:.3f}), "
                         f"{100 * last['coverage/visited_fraction']:.1f}% of cells visited; "
                         f"at {first['frames']:.0f} frames: {first['coverage/entropy']:.3f}")
        elif rows and not set(AGENT_FIGURES) & set(missing):
            lines.append("  coverage: not defined for this domain (protorl/exploration/coverage.py, COVERAGE_DIMS)")
        if all(key in last for key in RANDOM_FIGURES):
            lines.append(f"  uniform-random policy over the same {last['frames']:.0f} frames: normalised entropy "
                         f"{last['coverage/random_entropy']:.3f}, "
                         f"{100 * last['coverage/random_visited_fraction']:.1f}% of cells visited")
        return Report(lines, written, missing)
