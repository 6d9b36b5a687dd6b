"""`protorl-analyze RUN_DIR`: plots and a short text summary of the analyses logged during pre-training.

Reads `pretrain/analysis.csv` (and `maps/`) of a run directory and writes into `RUN_DIR/analysis/`:
`coverage.png` (coverage over frames, next to a uniform-random policy's), `representation.png` (the four
`repr/*` collapse diagnostics of `train.csv`), `variance.png` (per-state std and CV of the k-NN reward, proto
vs uniform candidates: figure 10), `map.png` (the latest maze map, if any) and `analysis.txt`. An older run's
`analysis.csv` without some columns is analysed as far as it goes, the summary naming the columns it lacks.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path

from protorl.analysis.maps import map_paths
from protorl.analysis.paths import inside
from protorl.config import AgentConfig
from protorl.diagnostics import collapse_message

COVERAGE_KEYS = {  # column -> (legend, line format)
    "coverage/entropy": ("normalised entropy (all visited states)", "o-"),
    "coverage/replay_entropy": ("normalised entropy (replay buffer)", "s--"),
    "coverage/visited_fraction": ("fraction of cells visited", "^-"),
    "coverage/random_entropy": ("uniform-random policy: normalised entropy", "o:"),
    "coverage/random_visited_fraction": ("uniform-random policy: fraction of cells visited", "^:"),
}
REPR_KEYS = {  # train.csv column -> (panel title, y label)
    "repr/distinct_prototypes": ("distinct nearest prototypes per batch", "prototypes"),
    "repr/target_entropy": ("entropy of the Sinkhorn targets", "nats"),
    "repr/projection_spread": ("median pairwise distance of projections", "L2 distance"),
    "repr/shared_direction": ("shared direction of raw projections", "|mean| / mean |.|"),
}
SCHEMES = ("proto", "uniform")
VARIANCE_KEYS = [f"variance/{scheme}_{stat}" for scheme in SCHEMES for stat in ("mean", "std", "cv")]
COVERAGE_FIGURES = ("coverage/entropy", "coverage/replay_entropy", "coverage/visited_fraction")  # the summary's
RANDOM_FIGURES = ("coverage/random_entropy", "coverage/random_visited_fraction")
OUTPUTS = ("coverage.png", "variance.png", "representation.png", "map.png", "analysis.txt")


class NotARunError(ValueError):
    """The directory holds no readable pre-training analyses."""


def phase_dir(run_dir: Path) -> Path:
    """The directory holding `analysis.csv`: `run_dir/pretrain`, or `run_dir` itself (a phase directory)."""
    if not run_dir.is_dir():
        raise NotARunError(f"{run_dir} is not a directory")
    for candidate in (run_dir / "pretrain", run_dir):
        if (candidate / "analysis.csv").is_file():
            return candidate
    raise NotARunError(f"{run_dir} is not a protorl run directory with analyses: no pretrain/analysis.csv "
                       "(written by protorl-pretrain and protorl-train unless analysis_every_frames=null)")


def read_csv(path: Path) -> tuple[list[str], list[dict[str, float]]]:
    """The columns of a CSV and its rows that have frames, their non-empty values as floats; NotARunError
    without a frames column or with a value that is not a number."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        if "frames" not in columns:
            raise NotARunError(f"{path} has no frames column (its columns: {', '.join(columns) or 'none'})")
        try:
            rows = [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in reader]
        except ValueError as error:
            raise NotARunError(f"{path}, line {reader.line_num}: {error}") from error
    return columns, [row for row in rows if "frames" in row]


def has(rows: list[dict[str, float]], key: str) -> bool:
    """Whether a row has a value of `key`."""
    return any(key in row for row in rows)


def series(rows: list[dict[str, float]], key: str) -> tuple[list[float], list[float]]:
    """(frames, values) of the rows that have `key`."""
    points = [(row["frames"], row[key]) for row in rows if key in row]
    return [p[0] for p in points], [p[1] for p in points]


def plot_coverage(rows: list[dict[str, float]], path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for key, (label, fmt) in COVERAGE_KEYS.items():
        if has(rows, key):
            ax.plot(*series(rows, key), fmt, label=label)
    ax.set(xlabel="environment frames", ylabel="coverage", ylim=(0.0, 1.0), title="state coverage (pre-training)")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=100)
    return path


def plot_representation(rows: list[dict[str, float]], num_prototypes: int | None, path: Path) -> Path:
    """The four collapse diagnostics of `train.csv` over frames (log M marked on the target entropy)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    keys = [key for key in REPR_KEYS if has(rows, key)]  # agents without prototypes log two
    fig = Figure(figsize=(5.0 * min(len(keys), 2), 3.0 * math.ceil(len(keys) / 2)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(math.ceil(len(keys) / 2), min(len(keys), 2), squeeze=False).ravel()
    for ax, key in zip(axes, keys, strict=True):
        title, label = REPR_KEYS[key]
        ax.plot(*series(rows, key), ".-")
        if key == "repr/target_entropy" and num_prototypes:
            ax.axhline(math.log(num_prototypes), color="tab:red", linestyle="--", label="log M: uniform (collapsed)")
            ax.legend(fontsize=8)
        ax.set(xlabel="environment frames", ylabel=label, title=title)
    fig.suptitle("representation diagnostics (pre-training, episode means)")
    fig.savefig(path, dpi=100)
    return path


def plot_variance(rows: list[dict[str, float]], path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10.0, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    for ax, (stat, label) in zip(fig.subplots(1, 2), (("std", "standard deviation"),
                                                       ("cv", "coefficient of variation")), strict=True):
        for scheme in SCHEMES:
            if has(rows, f"variance/{scheme}_{stat}"):
                ax.plot(*series(rows, f"variance/{scheme}_{stat}"), "o-", label=f"{scheme} candidates")
        ax.set(xlabel="environment frames", ylabel=label, title=f"per-state {label}")
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle("k-NN intrinsic reward of fixed probe states over repeated candidate sets (mean over probes)")
    fig.savefig(path, dpi=100)
    return path


def summary(run_dir: Path, phase: Path, rows: list[dict[str, float]], written: list[Path],
            train_rows: list[dict[str, float]] | None = None, num_prototypes: int | None = None,
            missing: Sequence[str] = ()) -> str:
    """A few lines: what ran, the last coverage and variance figures, the files written. `missing`: the
    columns of `analysis.csv` that this report reads and the file lacks (figures that need them are left out)."""
    lines = [f"protorl analysis of {run_dir}"]
    result = phase / "result.json"
    config = run_dir / "config.yaml"
    if config.is_file():
        from omegaconf import OmegaConf

        cfg = OmegaConf.load(config)
        lines.append(f"  agent {cfg.agent.get('name', 'proto')}, seed {cfg.seed}, obs {cfg.obs}, "
                     f"coverage bins {cfg.get('coverage_bins', '?')} per coordinate")
    if result.is_file():
        done = json.loads(result.read_text())
        lines.append(f"  pre-training on {done['task']}: {done['frames']} frames, complete")
    else:
        lines.append("  pre-training not complete (no result.json): figures up to its last analysis")
    if not rows:
        lines.append("  no analysis recorded yet")
    if missing:
        lines.append(f"  {phase / 'analysis.csv'} lacks {', '.join(missing)} (an older run?): "
                     "the figures that need them are left out")
    last = rows[-1] if rows else {}
    if all(key in last for key in COVERAGE_FIGURES):
        first = next(row for row in rows if "coverage/entropy" in row)
        lines.append(f"  coverage at {last['frames']:.0f} frames: normalised entropy {last['coverage/entropy']:.3f} "
                     f"(replay buffer {last['coverage/replay_entropy']:.3f}), "
                     f"{100 * last['coverage/visited_fraction']:.1f}% of cells visited; "
                     f"at {first['frames']:.0f} frames: {first['coverage/entropy']:.3f}")
    elif rows and not set(COVERAGE_FIGURES) & set(missing):
        lines.append("  coverage: not defined for this domain (protorl/analysis/coverage.py, COVERAGE_DIMS)")
    if all(key in last for key in RANDOM_FIGURES):
        lines.append(f"  uniform-random policy over the same {last['frames']:.0f} frames: normalised entropy "
                     f"{last['coverage/random_entropy']:.3f}, "
                     f"{100 * last['coverage/random_visited_fraction']:.1f}% of cells visited")
    repr_rows = [row for row in train_rows or [] if "repr/projection_spread" in row]
    if repr_rows:
        row = repr_rows[-1]
        figures = ", ".join(f"{key.split('/')[1]} {row[key]:.4g}" for key in REPR_KEYS if key in row)
        lines.append(f"  representation at {row['frames']:.0f} frames: {figures}")
        message = collapse_message(row, num_prototypes)
        collapsed = [r for r in repr_rows if collapse_message(r, num_prototypes)]
        lines.append(f"    {message}" if message else
                     f"    not collapsed at the end ({len(collapsed)} of {len(repr_rows)} logged episodes collapsed)")
    variance_rows = [row for row in rows if all(key in row for key in VARIANCE_KEYS)]
    if variance_rows:
        row = variance_rows[-1]
        lines.append(f"  k-NN reward at {row['frames']:.0f} frames, per probe state over repeated candidate sets:")
        for scheme in SCHEMES:
            mean, std, cv = (row[f"variance/{scheme}_{stat}"] for stat in ("mean", "std", "cv"))
            lines.append(f"    {scheme:<7} mean {mean:.4g}  std {std:.4g}  cv {cv:.4f}")
        mean_cv = {s: sum(r[f"variance/{s}_cv"] for r in variance_rows) / len(variance_rows) for s in SCHEMES}
        ratio = mean_cv["uniform"] / mean_cv["proto"] if mean_cv["proto"] > 0 else math.inf
        lines.append(f"    mean cv over {len(variance_rows)} analyses: proto {mean_cv['proto']:.4f}, "
                     f"uniform {mean_cv['uniform']:.4f} (uniform / proto = {ratio:.2f})")
    elif rows and not set(VARIANCE_KEYS) & set(missing):
        lines.append("  reward variance: not measured (the agent has no prototypes)")
    animation = phase / "maps" / "maps.gif"
    if animation.is_file():
        written.append(animation)
    lines.append("  files: " + ", ".join(str(p) for p in written))
    return "\n".join(lines)


def _num_prototypes(run_dir: Path) -> int | None:
    """M of a Proto-RL run, from its config.yaml; None for other agents or without a config."""
    config = run_dir / "config.yaml"
    if not config.is_file():
        return None
    from omegaconf import OmegaConf

    agent = OmegaConf.load(config).get("agent", {})
    if agent.get("name", "proto") != "proto":
        return None
    return int(agent.get("num_prototypes", AgentConfig().num_prototypes))


def analyze_run(run_dir: Path) -> str:
    """Write the plots and `analysis.txt` into `run_dir/analysis/`; returns the summary text.

    Reads and writes only inside `run_dir`: if a symlink leads a path it would read or write outside it (the
    `analysis` directory or a file in it, a CSV, the config, the latest map), raises OutsideRunError before
    writing anything."""
    phase = phase_dir(run_dir)
    out = run_dir / "analysis"
    for path in (phase / "analysis.csv", phase / "train.csv", phase / "result.json", run_dir / "config.yaml",
                 phase / "maps", out, *(out / name for name in OUTPUTS)):
        inside(path, run_dir)
    maps = [inside(path, run_dir) for path in map_paths(phase / "maps", up_to_frames=math.inf)[-1:]]
    columns, rows = read_csv(phase / "analysis.csv")
    out.mkdir(exist_ok=True)
    written = []
    if any(has(rows, key) for key in COVERAGE_KEYS):
        written.append(plot_coverage(rows, out / "coverage.png"))
    if any(has(rows, key) for key in VARIANCE_KEYS if not key.endswith("_mean")):  # the std and cv it plots
        written.append(plot_variance(rows, out / "variance.png"))
    train_rows = read_csv(phase / "train.csv")[1] if (phase / "train.csv").is_file() else []
    num_prototypes = _num_prototypes(run_dir)
    if has(train_rows, "repr/projection_spread"):
        written.append(plot_representation(train_rows, num_prototypes, out / "representation.png"))
    if maps:
        written.append(Path(shutil.copyfile(maps[-1], out / "map.png")))
    missing = [key for key in (*COVERAGE_KEYS, *VARIANCE_KEYS) if key not in columns]
    text = summary(run_dir, phase, rows, written, train_rows, num_prototypes, missing)
    (out / "analysis.txt").write_text(text + "\n")
    return text
