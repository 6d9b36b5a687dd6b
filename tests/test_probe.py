"""The linear state probe: the ridge regression against known answers (a linear map is recovered, noise is not),
and the probe of a real snapshot: deterministic for a seed, with its reference rows, from Python and the command."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import protorl
import protorl.reports.probe
from protorl.exploration.probe import collect_frames, gram_matrix, ridge_predictions, ridge_r2
from protorl.reports.probe import ProbeResult, summary_groups, summary_table
from tests.agents import tiny
from tests.runs import TIMEOUT_S, assert_user_error, environment, read_csv, read_rows


@pytest.mark.parametrize("num_features", [20, 600])  # fewer features than frames, more
def test_the_probe_recovers_a_linear_map(num_features):
    """Features that mix a 5-d state linearly (plus noise) give the state back with R^2 ~ 1."""
    rng = np.random.default_rng(0)
    state = rng.normal(size=(400, 5))
    features = state @ rng.normal(size=(5, num_features)) + 0.01 * rng.normal(size=(400, num_features))
    targets = state @ rng.normal(size=(5, 3))
    assert ridge_r2(features, targets) == pytest.approx(np.ones(3), abs=0.02)


@pytest.mark.parametrize("num_features", [20, 600])
def test_the_dual_solve_is_the_textbook_ridge_regression(num_features):
    """Each strength's predictions equal the primal solution w = (X'X + k n I)^-1 X'y on features centred on the
    fitted rows and divided by their RMS there, with the targets' mean added back."""
    rng = np.random.default_rng(3)
    features = rng.normal(size=(300, num_features)) + rng.normal(size=num_features)  # features off centre
    targets = rng.normal(size=(300, 2))
    rows, new = torch.arange(200), torch.arange(200, 300)
    x = torch.as_tensor(features)
    strengths = (1e-3, 1.0, 100.0)
    predictions = ridge_predictions(x @ x.T, rows, torch.as_tensor(targets[:200]), new, num_features, strengths)
    mean = features[:200].mean(axis=0)
    scale = np.sqrt(((features[:200] - mean) ** 2).mean())
    fit_x, new_x = (features[:200] - mean) / scale, (features[200:] - mean) / scale
    for strength, prediction in zip(strengths, predictions, strict=True):
        weights = np.linalg.solve(fit_x.T @ fit_x + strength * 200 * np.eye(num_features),
                                  fit_x.T @ (targets[:200] - targets[:200].mean(axis=0)))
        assert prediction.numpy() == pytest.approx(new_x @ weights + targets[:200].mean(axis=0), abs=1e-8)


def test_the_gram_matrix_in_blocks_is_that_of_the_centred_flattened_features():
    features = np.random.default_rng(4).normal(size=(30, 3, 5, 5)) + 100.0  # far off centre
    x = torch.as_tensor(features).flatten(1)
    centred = x - x.mean(dim=0)
    assert torch.allclose(gram_matrix(features, block=7), centred @ centred.T, atol=1e-9)


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


def test_the_summary_keeps_tasks_apart():
    results = [probe_result("proto", 0.5, [0.1], task="maze"), probe_result("proto", 0.3, [0.2], task="walker")]
    groups = summary_groups(results)
    assert groups["proto: encoder (8000 frames) on maze"] == pytest.approx([0.5])
    assert groups["proto: encoder (8000 frames) on walker"] == pytest.approx([0.3])
    assert groups["randomly initialised encoder (proto) on walker"] == pytest.approx([0.2])


@pytest.mark.parametrize("seed", [0, 3])
def test_the_held_out_frames_come_from_the_fitted_frames_distribution(seed):
    """The scored quarter of the frames is not a few starting points of its own: its mean position is within a
    quarter of the fitted frames' spread of theirs (a random policy barely moves the point in an episode)."""
    positions = collect_frames("point_mass_maze_explore", 2000, seed=seed).states[:, :2]
    fitted, held_out = positions[:1500], positions[1500:]
    assert np.all(np.abs(held_out.mean(axis=0) - fitted.mean(axis=0)) < 0.25 * fitted.std(axis=0))


def probe_result(method: str, encoder_r2: float, random_r2: list[float], task: str = "maze") -> ProbeResult:
    """A snapshot's probe with one state dimension: its encoder's R^2, its random encoders' (one per init seed)."""
    result = ProbeResult(task, 100, 0, ["position x"], method, 8000)
    result.rows["encoder (8000 frames)"] = np.array([encoder_r2])
    for init_seed, r2 in enumerate(random_r2, start=1):
        result.rows[f"random encoder (init seed {init_seed})"] = np.array([r2])
    result.rows["observation (pooled 16x16)"] = np.array([0.5])
    return result


def test_the_summary_counts_each_run_once():
    """Seeds of a method are its runs; random encoders count once per init seed however many snapshots share
    them (methods whose random encoders score alike share a row), and the observations once per task's frames."""
    results = [probe_result("proto", r2, [0.1, 0.2]) for r2 in (0.1, 0.2, 0.9)]  # mean 0.4, median 0.2
    results += [probe_result("proto_variant", 0.5, [0.1, 0.2]), probe_result("random", 0.4, [0.1, 0.3])]
    groups = summary_groups(results)
    assert list(groups) == ["proto: encoder (8000 frames)", "proto_variant: encoder (8000 frames)",
                            "random: encoder (8000 frames)", "randomly initialised encoder (proto, proto_variant)",
                            "randomly initialised encoder (random)", "observation (pooled 16x16)"]
    assert groups["proto: encoder (8000 frames)"] == pytest.approx([0.1, 0.2, 0.9])
    assert groups["randomly initialised encoder (proto, proto_variant)"] == pytest.approx([0.1, 0.2])
    assert groups["randomly initialised encoder (random)"] == pytest.approx([0.1, 0.3])
    assert groups["observation (pooled 16x16)"] == pytest.approx([0.5])
    table = summary_table(results, reps=200)
    line = next(line for line in table.splitlines() if line.startswith("proto: encoder"))
    mean, low, high = (float(v) for v in line.split("]")[0].replace("[", " ").replace(",", " ").split()[-3:])
    assert mean == pytest.approx(0.4, abs=1e-3) and 0.1 - 1e-9 <= low < mean < high <= 0.9 + 1e-9
    assert line.endswith("0.100 0.200 0.900")


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    """The snapshot of a tiny Proto-RL pre-training of the U-maze from states."""
    run_dir = tmp_path_factory.mktemp("probe") / "run"
    (result,) = protorl.pretrain(tiny(run_dir, task="point_mass_maze_explore", pretrain_frames=2000))
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
def test_snapshots_probed_together_share_their_frames_and_random_encoders_and_score_as_alone(snapshot, monkeypatch):
    collections, initialisations = [], []
    randomly_initialised = protorl.reports.probe.randomly_initialised

    def counted(*args, **kwargs):
        collections.append(args)
        return collect_frames(*args, **kwargs)

    def initialised(pretrained, seed):
        initialisations.append(seed)
        return randomly_initialised(pretrained, seed)

    monkeypatch.setattr(protorl.reports.probe, "collect_frames", counted)
    monkeypatch.setattr(protorl.reports.probe, "randomly_initialised", initialised)
    together = protorl.probe_snapshots([snapshot, snapshot], samples=300, seed=0, init_seeds=(1,))
    assert len(collections) == 1 and initialisations == [1]  # the same agent's random encoder: probed once
    alone = protorl.probe_snapshot(snapshot, samples=300, seed=0, init_seeds=(1,))
    for result in together:
        assert result.method == "proto" and result.pretrain_frames == 2000
        assert list(result.rows) == list(alone.rows)
        assert all(np.array_equal(result.rows[name], alone.rows[name]) for name in alone.rows)


@pytest.mark.slow
def test_a_snapshots_method_is_the_agent_config_its_run_was_started_with(snapshot, tmp_path):
    """Hydra's record of the run names the agent config (proto_variant and proto are both agent.name proto)."""
    run_dir = tmp_path / "run"
    (run_dir / "pretrain" / "snapshots").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(snapshot.parent.parent.parent.joinpath("config.yaml").read_text())
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "hydra.yaml").write_text("hydra:\n  runtime:\n    choices:\n      agent: proto_variant\n")
    copy = run_dir / "pretrain" / "snapshots" / snapshot.name
    copy.write_bytes(snapshot.read_bytes())
    config = protorl.load_pretrained(copy, "cpu").config
    assert protorl.reports.probe.snapshot_method(copy, config) == "proto_variant"
    assert protorl.reports.probe.snapshot_method(snapshot, config) == "proto"  # no Hydra record: the agent's name


@pytest.mark.slow
def test_the_command_prints_the_table_and_refuses_a_bad_snapshot(snapshot, tmp_path):
    def probe(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", "from protorl.app.tools import probe; probe()", *args],
                              capture_output=True, text=True, timeout=TIMEOUT_S, env=environment(), check=False)

    result = probe(str(snapshot), "--samples", "200", "--init-seeds", "1", "--csv", str(tmp_path / "probe.csv"),
                   "--threads", "1")
    assert result.returncode == 0, result.stderr
    assert "linear state probe on 200 frames of point_mass_maze_explore" in result.stdout
    assert "random encoder (init seed 1)" in result.stdout
    assert (tmp_path / "probe.csv").read_text().startswith(
        "snapshot,method,pretrain_frames,features,r2_mean,r2/position root_x")
    assert_user_error(probe(str(tmp_path / "missing.pt")), "missing.pt")
    assert_user_error(probe(str(snapshot), "--threads", "0"), "--threads=0")
    assert_user_error(probe(str(snapshot), "--samples", "19"), "--samples=19: at least 20 frames")

    several = probe(str(snapshot), str(snapshot), "--samples", "200", "--init-seeds", "1", "--csv",
                    str(tmp_path / "two.csv"))
    assert several.returncode == 0, several.stderr
    assert several.stdout.count("linear state probe on 200 frames") == 2
    assert "mean R^2 across runs" in several.stdout and "proto: encoder (2000 frames)" in several.stdout
    assert len((tmp_path / "two.csv").read_text().splitlines()) == 1 + 2 * 4  # 4 rows per snapshot
    refused = probe(str(snapshot), str(tmp_path / "gone.pt"), "--csv", str(tmp_path / "none.csv"))
    assert_user_error(refused, "gone.pt")
    assert not (tmp_path / "none.csv").exists()
    assert_user_error(probe(str(snapshot), "--csv", str(tmp_path / "no_such_dir" / "probe.csv")), "no_such_dir")


@pytest.mark.slow
def test_the_probe_over_pretraining_is_a_curve_that_leaves_training_alone(tmp_path):
    """`analyses.probe_samples` adds the probe's mean R^2 to every analysis; the run's own rows are those of the
    same run without it."""
    settings = dict(task="point_mass_maze_explore", pretrain_frames=2000)
    protorl.pretrain(tiny(tmp_path / "probed", analyses={"every_frames": 1000, "probe_samples": 200}, **settings))
    protorl.pretrain(tiny(tmp_path / "plain", analyses={"every_frames": 1000}, **settings))
    header, rows = read_csv(tmp_path / "probed" / "pretrain" / "analysis.csv")
    assert [row["frames"] for row in rows] == ["1000", "2000"]
    for row in rows:
        assert -1 < float(row["probe/encoder_r2"]) <= 1 and -1 < float(row["probe/projection_r2"]) <= 1
    _, plain = read_csv(tmp_path / "plain" / "pretrain" / "analysis.csv")
    assert all(row["probe/encoder_r2"] == "" for row in plain)
    assert read_rows(tmp_path / "probed" / "pretrain" / "train.csv") == read_rows(
        tmp_path / "plain" / "pretrain" / "train.csv")
