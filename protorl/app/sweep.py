"""The index of a Hydra multirun: one row per job's run directory, written when the sweep ends.

Hydra's launchers (basic: sequential; joblib: processes on this machine; submitit: SLURM or its local
executor) run the jobs, each in its own run directory under the sweep directory. `SweepIndex` then writes
`index.csv` into the sweep directory: per job, its overrides, agent, task, seed and the state of each phase
(`complete` once the phase wrote `result.json`, else `incomplete`: failed, killed or still running).
A job that stops with an error does not stop the sweep; the sweep exits with status 1 if any job is
incomplete.
`protorl-aggregate SWEEP_DIR` reads the run directories themselves, so it needs no index.
"""

from __future__ import annotations

import csv
import logging
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from protorl.reports.io import agent_choice
from protorl.storage.run_files import CONFIG_FILE, SWEEP_INDEX_FILE, is_complete, phase_dirs, read_run_config

log = logging.getLogger("protorl")
INDEX_COLUMNS = ["run_dir", "overrides", "agent", "task", "seed", "phases", "complete"]


def phase_states(run_dir: Path) -> dict[str, str]:
    """`{phase directory: "complete" | "incomplete"}` for `pretrain/`, `finetune/` and `finetune_<task>/`."""
    return {phase.name: "complete" if is_complete(phase) else "incomplete" for phase in phase_dirs(run_dir)}


def index_row(run_dir: Path, sweep_dir: Path) -> dict[str, str]:
    """One job of a sweep: where it ran, what it overrode, and how far it got."""
    overrides_file = run_dir / ".hydra" / "overrides.yaml"
    overrides = OmegaConf.load(overrides_file) if overrides_file.is_file() else []
    config = read_run_config(run_dir / CONFIG_FILE) if (run_dir / CONFIG_FILE).is_file() else OmegaConf.create()
    states = phase_states(run_dir)
    return {"run_dir": str(run_dir.relative_to(sweep_dir)), "overrides": " ".join(overrides),
            "agent": agent_choice(run_dir, config), "task": config.get("task", ""),
            "seed": config.get("seed", ""), "phases": " ".join(f"{name}:{state}" for name, state in states.items()),
            "complete": str(bool(states) and all(s == "complete" for s in states.values())).lower()}


def write_index(sweep_dir: Path) -> list[dict[str, str]]:
    """Write `sweep_dir/index.csv` over every job directory (one holding `.hydra/`) directly below it; its rows."""
    jobs = sorted((p for p in sweep_dir.iterdir() if (p / ".hydra").is_dir()),
                  key=lambda p: (len(p.name.split("_")[0]), p.name))  # job 10 after job 9
    rows = [index_row(job, sweep_dir) for job in jobs]
    with open(sweep_dir / SWEEP_INDEX_FILE, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=INDEX_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return rows


class SweepIndex(Callback):
    """Hydra callback: write the sweep directory's `index.csv` when a multirun ends; exit with status 1
    if a job did not complete (after the index is written, so it names them)."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        path, rows = sweep_dir / SWEEP_INDEX_FILE, write_index(sweep_dir)
        incomplete = [row["run_dir"] for row in rows if row["complete"] != "true"]
        log.info("sweep index: %s", path)
        if incomplete:
            log.error("%d job(s) did not complete: %s (see %s)", len(incomplete), ", ".join(incomplete), path)
            sys.exit(1)
