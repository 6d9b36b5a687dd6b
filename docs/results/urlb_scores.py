"""A URLB page's `scores.csv` from its sweeps: one row per completed fine-tuning (the arm, the pre-training frames
of its snapshot, seed, task, the last evaluation's mean return, the phase's wall time), the file that
`urlb_tables.py` reads. A run without pre-training (SAC from scratch) is recorded at 0 pre-training frames.

    python docs/results/urlb_scores.py paper=<paper sweep> scratch=<scratch sweep> > docs/results/<page>/scores.csv
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from protorl.errors import ResultsError
from protorl.reports.aggregate import varies_with_pretraining
from protorl.reports.io import read_result
from protorl.reports.records import COMPLETE, discover_runs, read_records
from protorl.storage.run_files import read_run_config


def rows(arm: str, sweep: Path) -> list[dict]:
    """The completed fine-tunings below `sweep`, labelled `arm`, sorted by pre-training frames, seed and task."""
    found = []
    for run in discover_runs([sweep]):
        pretrain_frames = int(read_run_config(run / "config.yaml").pretrain_frames)
        for record in read_records(run, ["agent.name"]):
            if record.status != COMPLETE:
                continue
            frames = pretrain_frames if varies_with_pretraining(record) else 0
            wall_time = read_result(record.path)["wall_time_s"]
            found.append({"fine_tuning": arm, "pretrain_frames": frames, "seed": record.seed, "task": record.task,
                          "score": round(record.final, 2), "wall_time_s": round(wall_time)})
    return sorted(found, key=lambda row: (row["pretrain_frames"], row["seed"], row["task"]))


def main(arms: list[str]) -> None:
    found = []
    for arm in arms:
        name, _, sweep = arm.partition("=")
        if not sweep:
            sys.exit(f"{arm}: give ARM=SWEEP, e.g. paper=multirun/reach_duplo_urlb_paper_finetune_2m/<date>")
        try:
            found += rows(name, Path(sweep))
        except ResultsError as error:  # a missing sweep, a run's file that is not a run's
            sys.exit(f"{arm}: {error}")
    writer = csv.DictWriter(sys.stdout, ["fine_tuning", "pretrain_frames", "seed", "task", "score", "wall_time_s"],
                            lineterminator="\n")
    writer.writeheader()
    writer.writerows(found)


if __name__ == "__main__":
    main(sys.argv[1:])
