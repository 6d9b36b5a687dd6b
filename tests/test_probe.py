"""The linear state probe: the ridge regression against known answers (a linear map is recovered, noise is not),
and the probe of a real snapshot: deterministic for a seed, with its reference rows, from Python and the command."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import protorl
from protorl.probe import collect_frames, ridge_r2
from tests.agents import tiny
from tests.runs import TIMEOUT_S, assert_user_error, environment, read_csv, read_rows


@pytest.mark.parametrize("num_features", [20, 600])  # fewer features than frames (primal), more (dual)
def test_the_probe_recovers_a_linear_map(num_features):
    """Features that mix a 5-d state linearly (plus noise) give the state back with R^2 ~ 1."""
    rng = np.random.default_rng(0)
    state = rng.normal(size=(400, 5))
    features = state @ rng.normal(size=(5, num_features)) + 0.01 * rng.normal(size=(400, num_features))
    targets = state @ rng.normal(size=(5, 3))
    assert ridge_r2(features, targets) == pytest.approx(np.ones(3), abs=0.02)


def test_the_probe_scores_noise_near_zero():
    rng = np.random.default_rng(1)
    r2 = ridge_r2(rng.normal(size=(2000, 10)), rng.normal(size=(2000, 2)))
    assert np.all(np.abs(r2) < 0.02)


def test_a_constant_state_dimension_has_no_r2():
    rng = np.random.default_rng(2)
    features = rng.normal(size=(200, 4))
    targets = np.stack([features[:, 0], np.ones(200)], axis=1)
    r2 = ridge_r2(features, targets)
    assert r2[0] > 0.99 and np.isnan(r2[1])


def test_the_frames_are_the_same_for_a_seed_and_hold_the_points_position():
    first = collect_frames("point_mass_maze_explore", 300, seed=4)
    again = collect_frames("point_mass_maze_explore", 300, seed=4)
    other = collect_frames("point_mass_maze_explore", 300, seed=5)
    assert np.array_equal(first.states, again.states) and np.array_equal(first.obs, again.obs)
    assert not np.array_equal(first.states, other.states)
    assert first.state_names == ["position root_x", "position root_y", "velocity root_x", "velocity root_y"]
    assert np.allclose(first.obs[:, :2], first.states[:, :2])  # from states the observation starts with x, y


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    """The snapshot of a tiny Proto-RL pre-training of the U-maze from states."""
    run_dir = tmp_path_factory.mktemp("probe") / "run"
    (result,) = protorl.pretrain(tiny(run_dir, env="point_mass_maze_explore", pretrain_frames=2000))
    return run_dir / "pretrain" / result.snapshots[-1]


@pytest.mark.slow
def test_a_snapshots_probe_is_deterministic_and_has_its_reference_rows(snapshot):
    first = protorl.probe_snapshot(snapshot, samples=300, seed=0, init_seeds=(1, 2))
    again = protorl.probe_snapshot(snapshot, samples=300, seed=0, init_seeds=(1, 2))
    assert list(first.rows) == ["encoder (2000 frames)", "projection (2000 frames)", "random encoder (init seed 1)",
                                "random encoder (init seed 2)", "observation"]
    for name, r2 in first.rows.items():
        assert np.array_equal(r2, again.rows[name]) and r2.shape == (4,)
    assert first.mean("observation") > 0.99  # the states themselves: the probe's ceiling
    assert not np.array_equal(first.rows["random encoder (init seed 1)"], first.rows["random encoder (init seed 2)"])


@pytest.mark.slow
def test_the_command_prints_the_table_and_refuses_a_bad_snapshot(snapshot, tmp_path):
    def probe(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", "from protorl.cli import probe; probe()", *args],
                              capture_output=True, text=True, timeout=TIMEOUT_S, env=environment(), check=False)

    result = probe(str(snapshot), "--samples", "200", "--init-seeds", "1", "--csv", str(tmp_path / "probe.csv"))
    assert result.returncode == 0, result.stderr
    assert "linear state probe on 200 frames of point_mass_maze_explore" in result.stdout
    assert "random encoder (init seed 1)" in result.stdout
    assert (tmp_path / "probe.csv").read_text().startswith("features,r2_mean,r2/position root_x")
    assert_user_error(probe(str(tmp_path / "missing.pt")), "missing.pt")


@pytest.mark.slow
def test_the_probe_over_pretraining_is_a_curve_that_leaves_training_alone(tmp_path):
    """`probe_samples` adds the probe's mean R^2 to every analysis; the run's own rows are those of the same run
    without it."""
    settings = dict(env="point_mass_maze_explore", pretrain_frames=2000, analysis_every_frames=1000)
    protorl.pretrain(tiny(tmp_path / "probed", probe_samples=200, **settings))
    protorl.pretrain(tiny(tmp_path / "plain", **settings))
    header, rows = read_csv(tmp_path / "probed" / "pretrain" / "analysis.csv")
    assert [row["frames"] for row in rows] == ["1000", "2000"]
    for row in rows:
        assert -1 < float(row["probe/encoder_r2"]) <= 1 and -1 < float(row["probe/projection_r2"]) <= 1
    _, plain = read_csv(tmp_path / "plain" / "pretrain" / "analysis.csv")
    assert all(row["probe/encoder_r2"] == "" for row in plain)
    assert read_rows(tmp_path / "probed" / "pretrain" / "train.csv") == read_rows(
        tmp_path / "plain" / "pretrain" / "train.csv")
