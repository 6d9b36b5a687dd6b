"""`protorl-analyze RUN_DIR`: plots and a short text summary of the analyses logged during pre-training, and of
its fine-tuning phases.

Reads `pretrain/analysis.csv` (and `maps/`) of a run directory and writes into `RUN_DIR/analysis/` what each
analysis reports of itself (`Analysis.report`: `coverage.png`, coverage over frames next to a uniform-random
policy's; `variance.png`, per-state std and CV of the k-NN reward, proto vs uniform candidates: figure 10; `map.png`,
the latest maze map, if any; the state probe's R^2 in the summary), then `representation.png` (the four `repr/*`
collapse diagnostics of `train.csv`), `finetune.png` (the fine-tuning diagnostics of `protorl.reports.finetuning`,
if the run has downstream phases) and `analysis.txt`. An older run's `analysis.csv` without some columns is
analysed as far as it goes, the summary naming the columns it lacks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from protorl.agents.diagnostics import COLLAPSE_SHARED_DIRECTION, collapse_message
from protorl.errors import ResultsError
from protorl.exploration.analysis import LoggedRun, Report
from protorl.plots import Curve, Level, Panel, Rows, has, plot_curves, series
from protorl.reports.finetuning import evaluated_downstream_dirs, plot_finetuning
from protorl.reports.io import agent_choice, read_csv, read_result
from protorl.reports.paths import inside
from protorl.storage.run_files import CONFIG_FILE, PRETRAIN_DIR, RESULT_FILE, read_run_config
from protorl.training.callbacks.exploration import analysis_classes

REPR_KEYS = {  # train.csv column -> (panel title, y label): what it shows, then which way is healthy
    "repr/distinct_prototypes": ("prototypes in use: distinct nearest ones per batch",
                                 "prototypes (higher is better;\n1: every frame looks the same)"),
    "repr/target_entropy": ("how uncertain the cluster targets are\n(entropy of the Sinkhorn targets)",
                            "nats (lower is better;\nlog M: uniform, collapsed)"),
    "repr/projection_spread": ("how far apart frames are in the latent space\n(median pairwise distance)",
                               "distance (higher is better;\n0: collapsed, 1.41: random)"),
    "repr/shared_direction": ("how much frames share one latent direction\n(|mean projection| / mean |projection|)",
                              "ratio (lower is better;\n1: collapsed)"),
}
OUTPUTS = ("representation.png", "finetune.png", "analysis.txt")  # besides the analyses' own


def phase_dir(run_dir: Path) -> Path:
    """The directory holding `analysis.csv`: `run_dir/pretrain`, or `run_dir` itself (a phase directory)."""
    if not run_dir.is_dir():
        raise ResultsError(f"{run_dir} is not a directory")
    for candidate in (run_dir / PRETRAIN_DIR, run_dir):
        if (candidate / "analysis.csv").is_file():
            return candidate
    if evaluated_downstream_dirs(run_dir):
        return run_dir / PRETRAIN_DIR  # a fine-tuning run: its downstream diagnostics alone
    raise ResultsError(f"{run_dir} is not a protorl run directory with analyses: no pretrain/analysis.csv "
                       "(written by protorl-pretrain and protorl-train unless analyses.every_frames=null)")


def plot_representation(rows: Rows, num_prototypes: int | None, path: Path) -> Path:
    """The four collapse diagnostics of `train.csv` over frames, where the collapse warning fires marked."""
    panels = []
    for key, (title, label) in REPR_KEYS.items():
        if not has(rows, key):  # agents without prototypes log two
            continue
        levels = []
        if key == "repr/target_entropy" and num_prototypes:
            levels.append(Level("log M: uniform targets (collapsed)", math.log(num_prototypes), "tab:red"))
        if key == "repr/shared_direction":
            levels.append(Level("collapsed above this", COLLAPSE_SHARED_DIRECTION, "tab:red"))
        panels.append(Panel(title, label, [Curve(*series(rows, key), fmt=".-")], levels))
    plot_curves(panels, [path], "has the representation collapsed? (pre-training, episode means)", cols=2)
    return path


def _summary(run_dir: Path, phase: Path, config: DictConfig | None, rows: Rows, written: list[Path],
             reports: Sequence[Report], train_rows: Rows, num_prototypes: int | None,
             finetune_lines: Sequence[str] = ()) -> str:
    """A few lines: what ran, each analysis's report, the representation, the fine-tuning, the files written."""
    lines = [f"protorl analysis of {run_dir}"]
    if config is not None:
        lines.append(f"  agent {agent_choice(run_dir, config)}, seed {config.seed}, "
                     f"obs {OmegaConf.select(config, 'env.obs', default='?')}, "
                     f"coverage bins {OmegaConf.select(config, 'analyses.coverage_bins', default='?')} per coordinate")
    done = read_result(phase)
    if done is not None:
        lines.append(f"  pre-training on {done['task']}: {done['frames']} frames, complete")
    elif phase.is_dir():
        lines.append("  pre-training not complete (no result.json): figures up to its last analysis")
    if not rows and phase.is_dir():
        lines.append("  no analysis recorded yet")
    missing = [key for report in reports for key in report.missing]
    if missing:
        lines.append(f"  {phase / 'analysis.csv'} lacks {', '.join(missing)} (an older run?): "
                     "the figures that need them are left out")
    lines += [line for report in reports for line in report.lines]
    lines += _representation_lines(train_rows, num_prototypes)
    if finetune_lines:
        lines += ["  fine-tuning:", *finetune_lines]
    lines.append("  files: " + ", ".join(str(p) for p in written))
    return "\n".join(lines)


def _representation_lines(train_rows: Rows, num_prototypes: int | None) -> list[str]:
    repr_rows = [row for row in train_rows if "repr/projection_spread" in row]
    if not repr_rows:
        return []
    row = repr_rows[-1]
    figures = ", ".join(f"{key.split('/')[1]} {row[key]:.4g}" for key in REPR_KEYS if key in row)
    message = collapse_message(row, num_prototypes)
    collapsed = [r for r in repr_rows if collapse_message(r, num_prototypes)]
    return [f"  representation at {row['frames']:.0f} frames: {figures}",
            f"    {message}" if message else
            f"    not collapsed at the end ({len(collapsed)} of {len(repr_rows)} logged episodes collapsed)"]


def _num_prototypes(config: DictConfig | None) -> int | None:
    """M of a run whose agent has prototypes (its config's `agent.num_prototypes`); None otherwise."""
    value = None if config is None else config.get("agent", {}).get("num_prototypes")
    return None if value is None else int(value)


def analyze_run(run_dir: Path) -> str:
    """Write the plots and `analysis.txt` into `run_dir/analysis/`; returns the summary text.

    Reads and writes only inside `run_dir`: if a symlink leads a path it would read or write outside it (the
    `analysis` directory or a file in it, a CSV, the config, the latest map), raises ResultsError before
    writing anything."""
    phase = phase_dir(run_dir)
    out = run_dir / "analysis"
    analyses = analysis_classes()
    outputs = [*OUTPUTS, *(name for cls in analyses for name in cls.outputs)]
    maps = sorted((phase / "maps").iterdir()) if (phase / "maps").is_dir() else []  # what the map's report may read
    for path in (phase / "analysis.csv", phase / "train.csv", phase / RESULT_FILE, run_dir / CONFIG_FILE,
                 phase / "maps", *maps, out, *(out / name for name in outputs)):
        inside(path, run_dir)
    columns, rows = read_csv(phase / "analysis.csv")
    train_rows = read_csv(phase / "train.csv")[1]
    config = read_run_config(run_dir / CONFIG_FILE) if (run_dir / CONFIG_FILE).is_file() else None
    num_prototypes = _num_prototypes(config)
    out.mkdir(exist_ok=True)
    logged = LoggedRun(rows, columns, phase, out, config, lambda path: inside(path, run_dir))
    reports = [cls.report(logged) for cls in analyses]
    written = [path for report in reports for path in report.written]
    if has(train_rows, "repr/projection_spread"):
        written.append(plot_representation(train_rows, num_prototypes, out / "representation.png"))
    finetune_png, finetune_lines = plot_finetuning(run_dir, out / "finetune.png")
    if finetune_png is not None:
        written.append(finetune_png)
    text = _summary(run_dir, phase, config, rows, written, reports, train_rows, num_prototypes, finetune_lines)
    (out / "analysis.txt").write_text(text + "\n")
    return text
