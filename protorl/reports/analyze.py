"""`protorl-analyze RUN_DIR`: plots and a short text summary of the analyses logged during pre-training, and of
its fine-tuning phases.

Reads `pretrain/analysis.csv` (and `maps/`) of a run directory and writes into `RUN_DIR/analysis/`:
`coverage.png` (coverage over frames, next to a uniform-random policy's), `representation.png` (the four
`repr/*` collapse diagnostics of `train.csv`), `variance.png` (per-state std and CV of the k-NN reward, proto
vs uniform candidates: figure 10), `map.png` (the latest maze map, if any), `finetune.png` (the fine-tuning
diagnostics of `protorl.reports.finetuning`, if the run has downstream phases) and `analysis.txt`. An older run's
`analysis.csv` without some columns is analysed as far as it goes, the summary naming the columns it lacks.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from protorl.agents.diagnostics import COLLAPSE_SHARED_DIRECTION, collapse_message
from protorl.errors import ResultsError
from protorl.exploration.maps import map_paths
from protorl.reports.finetuning import evaluated_downstream_dirs, plot_finetuning
from protorl.reports.io import Rows, has, read_csv, read_result, series
from protorl.reports.paths import inside
from protorl.reports.plots import Curve, Level, Panel, plot_curves
from protorl.storage.run_files import CONFIG_FILE, PRETRAIN_DIR, RESULT_FILE, read_run_config

COVERAGE_KEYS = {  # column -> (legend, line format)
    "coverage/entropy": ("agent: normalised entropy of the visited states", "o-"),
    # the same as the visited states' until the buffer wraps: a line without markers, so both stay visible
    "coverage/replay_entropy": ("agent: normalised entropy of the replay buffer", "--"),
    "coverage/visited_fraction": ("agent: fraction of cells visited", "^-"),
    "coverage/random_entropy": ("uniform-random policy: normalised entropy", "o:"),
    "coverage/random_visited_fraction": ("uniform-random policy: fraction of cells visited", "^:"),
}
SCHEME_NAMES = {"proto": "prototype-balanced candidates (Proto-RL)", "uniform": "uniform candidates"}
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
SCHEMES = ("proto", "uniform")
VARIANCE_STATS = {"std": "standard deviation", "cv": "coefficient of variation"}  # the plotted ones
VARIANCE_KEYS = [f"variance/{scheme}_{stat}" for scheme in SCHEMES for stat in ("mean", "std", "cv")]
COVERAGE_FIGURES = ("coverage/entropy", "coverage/replay_entropy", "coverage/visited_fraction")  # the summary's
RANDOM_FIGURES = ("coverage/random_entropy", "coverage/random_visited_fraction")
OUTPUTS = ("coverage.png", "variance.png", "representation.png", "map.png", "finetune.png", "analysis.txt")


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


def plot_coverage(rows: Rows, path: Path) -> Path:
    """Coverage over frames: the agent's, and a uniform-random policy's where recorded."""
    curves = [Curve(*series(rows, key), label, fmt) for key, (label, fmt) in COVERAGE_KEYS.items() if has(rows, key)]
    plot_curves([Panel("state coverage during pre-training,\nagainst a uniform-random policy over the same frames",
                       "coverage (higher: explored more)", curves, ylim=(0.0, 1.0))], [path])
    return path


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


def plot_variance(rows: Rows, path: Path) -> Path:
    """Per-state std and coefficient of variation of the k-NN reward, proto vs uniform candidates."""
    panels = []
    for stat, label in VARIANCE_STATS.items():
        keys = {scheme: f"variance/{scheme}_{stat}" for scheme in SCHEMES}
        curves = [Curve(*series(rows, key), SCHEME_NAMES[scheme], "o-") for scheme, key in keys.items()
                  if has(rows, key)]
        panels.append(Panel(f"its {label} per probe state", f"{label}\n(lower: a steadier reward)", curves))
    plot_curves(panels, [path], "how much the k-NN intrinsic reward of a state varies with the candidates drawn\n"
                                "(fixed probe states, repeated candidate sets, mean over probes)")
    return path


def _probe_lines(rows: Rows) -> list[str]:
    """The state probe over pre-training (`analyses.probe_samples`), if it ran: its mean R^2 at each analysis."""
    probed = [row for row in rows if "probe/encoder_r2" in row]
    if not probed:
        return []
    lines = ["  state probe (mean R^2 of a linear read-out of the physical state, docs/probe.md):"]
    for key, what in (("probe/encoder_r2", "encoder"), ("probe/projection_r2", "projection")):
        if any(key in row for row in probed):
            values = ", ".join(f"{row[key]:.3f}" for row in probed if key in row)
            lines.append(f"    {what:<10} at {', '.join(str(int(row['frames'])) for row in probed)} frames: {values}")
    return lines


def _summary(run_dir: Path, phase: Path, config: DictConfig | None, rows: Rows, written: list[Path],
             train_rows: Rows, num_prototypes: int | None, missing: Sequence[str],
             finetune_lines: Sequence[str] = ()) -> str:
    """A few lines: what ran, the last coverage and variance figures, the files written. `missing`: the
    columns of `analysis.csv` that this report reads and the file lacks (figures that need them are left out)."""
    lines = [f"protorl analysis of {run_dir}"]
    if config is not None:
        lines.append(f"  agent {config.agent.get('name', 'proto')}, seed {config.seed}, "
                     f"obs {OmegaConf.select(config, 'env.obs', default='?')}, "
                     f"coverage bins {OmegaConf.select(config, 'analyses.coverage_bins', default='?')} per coordinate")
    done = read_result(phase)
    if done is not None:
        lines.append(f"  pre-training on {done['task']}: {done['frames']} frames, complete")
    elif phase.is_dir():
        lines.append("  pre-training not complete (no result.json): figures up to its last analysis")
    if not rows and phase.is_dir():
        lines.append("  no analysis recorded yet")
    if missing:
        lines.append(f"  {phase / 'analysis.csv'} lacks {', '.join(missing)} (an older run?): "
                     "the figures that need them are left out")
    lines += _coverage_lines(rows, missing) + _representation_lines(train_rows, num_prototypes)
    lines += _variance_lines(rows, missing) + _probe_lines(rows)
    if finetune_lines:
        lines += ["  fine-tuning:", *finetune_lines]
    lines.append("  files: " + ", ".join(str(p) for p in written))
    return "\n".join(lines)


def _coverage_lines(rows: Rows, missing: Sequence[str]) -> list[str]:
    lines = []
    last = rows[-1] if rows else {}
    if all(key in last for key in COVERAGE_FIGURES):
        first = next(row for row in rows if "coverage/entropy" in row)
        lines.append(f"  coverage at {last['frames']:.0f} frames: normalised entropy {last['coverage/entropy']:.3f} "
                     f"(replay buffer {last['coverage/replay_entropy']:.3f}), "
                     f"{100 * last['coverage/visited_fraction']:.1f}% of cells visited; "
                     f"at {first['frames']:.0f} frames: {first['coverage/entropy']:.3f}")
    elif rows and not set(COVERAGE_FIGURES) & set(missing):
        lines.append("  coverage: not defined for this domain (protorl/exploration/coverage.py, COVERAGE_DIMS)")
    if all(key in last for key in RANDOM_FIGURES):
        lines.append(f"  uniform-random policy over the same {last['frames']:.0f} frames: normalised entropy "
                     f"{last['coverage/random_entropy']:.3f}, "
                     f"{100 * last['coverage/random_visited_fraction']:.1f}% of cells visited")
    return lines


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


def _variance_lines(rows: Rows, missing: Sequence[str]) -> list[str]:
    variance_rows = [row for row in rows if all(key in row for key in VARIANCE_KEYS)]
    if not variance_rows:
        unmeasured = rows and not set(VARIANCE_KEYS) & set(missing)
        return ["  reward variance: not measured (the agent has no prototypes)"] if unmeasured else []
    row = variance_rows[-1]
    lines = [f"  k-NN reward at {row['frames']:.0f} frames, per probe state over repeated candidate sets:"]
    for scheme in SCHEMES:
        mean, std, cv = (row[f"variance/{scheme}_{stat}"] for stat in ("mean", "std", "cv"))
        lines.append(f"    {scheme:<7} mean {mean:.4g}  std {std:.4g}  cv {cv:.4f}")
    mean_cv = {s: sum(r[f"variance/{s}_cv"] for r in variance_rows) / len(variance_rows) for s in SCHEMES}
    ratio = mean_cv["uniform"] / mean_cv["proto"] if mean_cv["proto"] > 0 else math.inf
    lines.append(f"    mean cv over {len(variance_rows)} analyses: proto {mean_cv['proto']:.4f}, "
                 f"uniform {mean_cv['uniform']:.4f} (uniform / proto = {ratio:.2f})")
    return lines


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
    for path in (phase / "analysis.csv", phase / "train.csv", phase / RESULT_FILE, run_dir / CONFIG_FILE,
                 phase / "maps", out, *(out / name for name in OUTPUTS)):
        inside(path, run_dir)
    maps = [inside(path, run_dir) for path in map_paths(phase / "maps", up_to_frames=math.inf)[-1:]]
    columns, rows = read_csv(phase / "analysis.csv")
    train_rows = read_csv(phase / "train.csv")[1]
    config = read_run_config(run_dir / CONFIG_FILE) if (run_dir / CONFIG_FILE).is_file() else None
    num_prototypes = _num_prototypes(config)
    out.mkdir(exist_ok=True)
    written = []
    if any(has(rows, key) for key in COVERAGE_KEYS):
        written.append(plot_coverage(rows, out / "coverage.png"))
    if any(has(rows, f"variance/{scheme}_{stat}") for scheme in SCHEMES for stat in VARIANCE_STATS):
        written.append(plot_variance(rows, out / "variance.png"))
    if has(train_rows, "repr/projection_spread"):
        written.append(plot_representation(train_rows, num_prototypes, out / "representation.png"))
    if maps:
        written.append(Path(shutil.copyfile(maps[-1], out / "map.png")))
    if (phase / "maps" / "maps.gif").is_file():
        written.append(phase / "maps" / "maps.gif")
    # the columns this report reads that the file lacks; a file whose header never reached the disk lacks none
    missing = [key for key in (*COVERAGE_KEYS, *VARIANCE_KEYS) if key not in columns] if columns else []
    finetune_png, finetune_lines = plot_finetuning(run_dir, out / "finetune.png")
    if finetune_png is not None:
        written.append(finetune_png)
    text = _summary(run_dir, phase, config, rows, written, train_rows, num_prototypes, missing, finetune_lines)
    (out / "analysis.txt").write_text(text + "\n")
    return text
