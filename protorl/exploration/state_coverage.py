"""The state-coverage analysis: how evenly the phase's policy has visited the domain's coverage cells.

- `coverage/entropy`, `coverage/visited_fraction`: of the cumulative histogram of every state visited (`Visits`);
- `coverage/replay_entropy`: of the states in the replay buffer now, the paper's reading of section 5.6 (differs
  from the cumulative one once the buffer has wrapped);
- `coverage/random_entropy`, `coverage/random_visited_fraction`: the same for a uniform-random policy over the
  same number of frames (`analyses.random_reference`; `protorl.exploration.random_reference`).
"""

from __future__ import annotations

from protorl.exploration.analysis import Analysis, AnalysisContext, Moment
from protorl.exploration.coverage import coverage_entropy, histogram, visited_fraction
from protorl.exploration.random_reference import RandomPolicyCoverage


class Coverage(Analysis):
    """State coverage of the phase so far, of its replay buffer, and of a uniform-random policy; nothing for a
    domain without coverage coordinates."""

    columns = ("coverage/entropy", "coverage/visited_fraction", "coverage/replay_entropy",
               "coverage/random_entropy", "coverage/random_visited_fraction")

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
