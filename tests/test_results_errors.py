"""protorl-aggregate and protorl-analyze on bad inputs: each ends as one `protorl: error:` line with
exit status 2, or, for an older run's partial analysis.csv, as an analysis of what the file has; neither tool
reads or writes through a symlink that leads outside a run directory."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
from omegaconf import OmegaConf

from protorl.app.tools import aggregate, analyze

ANALYSIS_COLUMNS = [
    "frames", "coverage/entropy", "coverage/visited_fraction", "coverage/replay_entropy",
    "coverage/random_entropy", "coverage/random_visited_fraction",
    "variance/proto_mean", "variance/proto_std", "variance/proto_cv",
    "variance/uniform_mean", "variance/uniform_std", "variance/uniform_cv", "analysis/time_s",
]
# Runs `protorl.app.tools.aggregate(sys.argv[1:])` in a Python where `import rliable` fails as if not installed.
WITHOUT_RLIABLE = """
import sys

class BlockRliable:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "rliable":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, BlockRliable())
from protorl.app.tools import aggregate

aggregate(sys.argv[1:])
"""


def make_run(run_dir: Path, seed: int = 1, score: float | None = 500.0) -> Path:
    """A run directory: `config.yaml` and, unless `score` is None, a complete `finetune` phase ending at it."""
    run_dir.mkdir(parents=True)
    OmegaConf.save({"task": "walker_run", "seed": seed, "env": {"obs": "states"}, "agent": {"name": "proto"}},
                   run_dir / "config.yaml")
    if score is not None:
        (run_dir / "finetune").mkdir()
        (run_dir / "finetune" / "eval.csv").write_text(f"frames,episode_reward\n1000,{score / 2}\n2000,{score}\n")
        (run_dir / "finetune" / "result.json").write_text(json.dumps({"task": "walker_run", "frames": 2000}))
    return run_dir


def make_pretrain_run(run_dir: Path, columns: list[str] = ANALYSIS_COLUMNS) -> Path:
    """A run directory with a complete `pretrain` phase: two rows of `analysis.csv` and a map."""
    make_run(run_dir, score=None)
    phase = run_dir / "pretrain"
    (phase / "maps").mkdir(parents=True)
    with open(phase / "analysis.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows({column: frames if column == "frames" else value for column in columns}
                         for frames, value in ((1000, 0.25), (2000, 0.5)))
    iio.imwrite(phase / "maps" / "map_2000.png", np.zeros((8, 8, 3), dtype=np.uint8))
    (phase / "result.json").write_text(json.dumps({"task": "point_mass_maze_explore", "frames": 2000}))
    return run_dir


def exit_status(command, argv: list[str]) -> int:
    with pytest.raises(SystemExit) as stop:
        command(argv)
    return stop.value.code


def one_error_line(err: str) -> str:
    """The single `protorl: error:` line of stderr."""
    assert err.startswith("protorl: error:") and len(err.strip().splitlines()) == 1, err
    return err


def without_rliable(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_RLIABLE, *argv], capture_output=True, text=True, timeout=120)


# -- protorl-aggregate ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_aggregate_help_works_without_rliable():
    done = without_rliable("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: protorl-aggregate") and done.stderr == ""


@pytest.mark.slow
def test_aggregate_without_rliable_says_how_to_install_it(tmp_path):
    """Complete records need rliable's statistics: one line naming the `sweep` extra, nothing written."""
    make_run(tmp_path / "runs" / "proto_1")
    done = without_rliable(str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--reps", "5")
    assert done.returncode == 2
    assert "rliable" in one_error_line(done.stderr) and 'pip install -e ".[sweep]"' in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("analysis_csv", [True, False])
def test_aggregate_unknown_metric_names_the_column_and_lists_the_columns(tmp_path, capsys, analysis_csv):
    for seed in (1, 2):
        run = make_run(tmp_path / "runs" / f"proto_{seed}", seed=seed, score=None)
        if analysis_csv:
            (run / "pretrain").mkdir()
            (run / "pretrain" / "analysis.csv").write_text(f"frames,coverage/entropy\n{seed}000,0.5\n")
    assert exit_status(aggregate, [str(tmp_path / "runs"), "--out", str(tmp_path / "out"),
                                   "--metric", "nosuchcol"]) == 2
    err = one_error_line(capsys.readouterr().err)
    assert "nosuchcol" in err
    if analysis_csv:
        assert "coverage/entropy" in err
    else:
        assert "none of the runs read (2) has a pretrain/analysis.csv" in err


@pytest.mark.parametrize("link", ["run directory", "config.yaml", "eval.csv", "eval.csv of another run"])
def test_aggregate_refuses_symlinks_leading_outside_a_run(tmp_path, capsys, link):
    """A run read through a symlink is not the run the sweep holds: refused, naming the link."""
    sweep, elsewhere = tmp_path / "sweep", tmp_path / "elsewhere"
    run = make_run(sweep / "proto_1")
    other = make_run(elsewhere / "proto_2", seed=2, score=900.0)
    if link == "run directory":
        path, target = sweep / "proto_2", other
    elif link == "config.yaml":
        path, target = run / "config.yaml", other / "config.yaml"
    else:
        source = make_run(sweep / "proto_2", seed=2) if link == "eval.csv of another run" else other
        path, target = run / "finetune" / "eval.csv", source / "finetune" / "eval.csv"
    path.unlink(missing_ok=True)
    path.symlink_to(target)
    assert exit_status(aggregate, [str(sweep), "--out", str(tmp_path / "out"), "--reps", "5"]) == 2
    assert str(path) in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


# -- protorl-analyze -------------------------------------------------------------------------------------------
def test_analyze_a_partial_analysis_csv_as_far_as_it_goes(tmp_path, capsys):
    """An older run's analysis.csv without some columns: the plots of the others, a note naming the missing."""
    missing = ["coverage/replay_entropy", "variance/uniform_std", "variance/uniform_cv"]
    run = make_pretrain_run(tmp_path / "run", [c for c in ANALYSIS_COLUMNS if c not in missing])
    analyze([str(run)])
    printed = capsys.readouterr().out
    assert printed.strip() == (run / "analysis" / "analysis.txt").read_text().strip()
    assert f"{run / 'pretrain' / 'analysis.csv'} lacks {', '.join(missing)} (an older run?)" in printed
    assert "not defined for this domain" not in printed and "not measured" not in printed
    assert "uniform-random policy over the same 2000 frames: normalised entropy 0.500" in printed
    for name in ("coverage.png", "variance.png", "map.png"):
        assert iio.imread(run / "analysis" / name).ndim == 3


def test_analyze_an_analysis_csv_without_frames_is_one_error_line(tmp_path, capsys):
    run = make_pretrain_run(tmp_path / "run", [c for c in ANALYSIS_COLUMNS if c != "frames"])
    assert exit_status(analyze, [str(run)]) == 2
    err = one_error_line(capsys.readouterr().err)
    assert str(run / "pretrain" / "analysis.csv") in err and "frames" in err


@pytest.mark.slow
@pytest.mark.parametrize("link", ["analysis directory", "output file", "analysis.csv", "map"])
def test_analyze_refuses_symlinks_leading_outside_the_run(tmp_path, capsys, link):
    """Nothing is read from or written to `elsewhere`; a symlink inside the run directory is followed."""
    run, elsewhere = make_pretrain_run(tmp_path / "run"), tmp_path / "elsewhere"
    other = make_pretrain_run(elsewhere / "other") / "pretrain"
    (elsewhere / "notes.txt").write_text("mine\n")
    path, target = {"analysis directory": (run / "analysis", elsewhere),
                    "output file": (run / "analysis" / "analysis.txt", elsewhere / "notes.txt"),
                    "analysis.csv": (run / "pretrain" / "analysis.csv", other / "analysis.csv"),
                    "map": (run / "pretrain" / "maps" / "map_3000.png", other / "maps" / "map_2000.png")}[link]
    path.parent.mkdir(exist_ok=True)
    path.unlink(missing_ok=True)
    path.symlink_to(target)
    before = sorted((p, p.stat().st_mtime_ns) for p in elsewhere.rglob("*"))
    assert exit_status(analyze, [str(run)]) == 2
    assert str(path) in one_error_line(capsys.readouterr().err)
    assert sorted((p, p.stat().st_mtime_ns) for p in elsewhere.rglob("*")) == before
    assert (elsewhere / "notes.txt").read_text() == "mine\n"
    if link == "map":  # the same link inside the run directory is fine
        path.unlink()
        path.symlink_to(run / "pretrain" / "maps" / "map_2000.png")
        analyze([str(run)])
        assert "map.png" in capsys.readouterr().out


@pytest.mark.parametrize("tool, argv", [(aggregate, []), (aggregate, ["--reps", "0", "."]), (analyze, []),
                                        (analyze, ["a", "b"])])
def test_usage_errors_are_one_line(capsys, tool, argv):
    with pytest.raises(SystemExit) as stop:
        tool(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("protorl: error:") and err.count("\n") == 1 and "--help" in err, err
