"""protorl-aggregate on synthetic run and sweep directories: final-score tables and rliable's IQM against hand
computations, run discovery and layouts, the missing and incomplete runs, method labels, the written figures
and the errors on bad paths."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
from omegaconf import OmegaConf

from protorl.app.tools import aggregate
from protorl.logs.logger import EVAL_COLUMNS
from protorl.reports.aggregate import curve_panel, seed_curve
from protorl.reports.records import COMPLETE, Record

pytestmark = pytest.mark.slow  # the slow tier: this module runs protorl's commands or real training

REPS = 50


def make_run(run_dir: Path, agent: str = "proto", task: str = "walker_run", seed: int = 1,
             curves: dict[str, list[tuple[int, float]]] | None = None, running: tuple[str, ...] = (),
             intr_coef: float = 0.2) -> Path:
    """A run directory: `config.yaml` and, per phase directory in `curves` ({name: [(frames, return)]}), its
    `eval.csv` and, unless the phase is in `running`, its `result.json`."""
    run_dir.mkdir(parents=True)
    OmegaConf.save({"task": task, "seed": seed, "agent": {"name": agent, "intr_coef": intr_coef},
                    "pretrain_frames": 4000, "finetune_frames": 2000}, run_dir / "config.yaml")
    for phase, rows in (curves or {}).items():
        (run_dir / phase).mkdir()
        with open(run_dir / phase / "eval.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=EVAL_COLUMNS)
            writer.writeheader()
            writer.writerows({"frames": frames, "agent_steps": frames // 2, "episode_reward": reward,
                              "episode_reward_std": 1.0, "episodes": 10, "total_time_s": 1.0}
                             for frames, reward in rows)
        if phase not in running:
            phase_task = task if phase == "finetune" else phase.removeprefix("finetune_")
            result = {"phase": "finetune", "task": phase_task, "frames": max((r[0] for r in rows), default=0),
                      "episodes": 4, "wall_time_s": 1.0}
            (run_dir / phase / "result.json").write_text(json.dumps(result))
    return run_dir


def final_curve(score: float) -> dict[str, list[tuple[int, float]]]:
    """A `finetune` curve ending at `score`, its rows out of order: the final score is the largest frames'."""
    return {"finetune": [(2000, score), (0, 5.0), (1000, score / 2)]}


def run_aggregate(paths: list[Path], out: Path, *extra: str) -> None:
    aggregate([*map(str, paths), "--out", str(out), "--reps", str(REPS), *extra])


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_final_scores_mean_and_population_std_by_hand(tmp_path, capsys):
    for seed, score in zip((1, 2, 3), (100.0, 200.0, 600.0), strict=True):
        make_run(tmp_path / "runs" / f"proto_{seed}", seed=seed, curves=final_curve(score))
    run_aggregate([tmp_path / "runs"], tmp_path / "out")
    (row,) = read_rows(tmp_path / "out" / "scores.csv")
    # mean (100 + 200 + 600) / 3 = 300; population std sqrt((200^2 + 100^2 + 300^2) / 3) = sqrt(140000 / 3)
    assert (row["task"], row["method"], int(row["n_seeds"])) == ("walker_run", "proto", 3)
    assert float(row["mean"]) == pytest.approx(300.0)
    assert float(row["std"]) == pytest.approx(math.sqrt(140000 / 3))
    table = (tmp_path / "out" / "scores.md").read_text()
    assert "population std" in table and "| walker_run | 300.0 ± 216.0 (3 seeds) |" in table
    assert capsys.readouterr().out.strip() == (tmp_path / "out" / "summary.txt").read_text().strip()


def test_mean_score_averages_each_curve_and_success_rate_is_a_metric(tmp_path):
    """--score mean: a run's score is the mean of its evaluations (solving sooner scores higher); --metric
    success_rate reads eval.csv's success rate, already in [0, 1]."""
    for seed, rows in ((1, [(0, 0.0), (1000, 500.0), (2000, 1000.0)]), (2, [(0, 300.0), (1000, 300.0), (2000, 0.0)])):
        run_dir = make_run(tmp_path / "runs" / f"s{seed}", seed=seed, curves={"finetune": rows})
        with open(run_dir / "finetune" / "eval.csv", newline="") as f:
            evals = list(csv.DictReader(f))
        for row in evals:
            row["success_rate"] = "1.0" if float(row["episode_reward"]) > 0 else "0.0"
        with open(run_dir / "finetune" / "eval.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=EVAL_COLUMNS)
            writer.writeheader()
            writer.writerows(evals)
    run_aggregate([tmp_path / "runs"], tmp_path / "mean", "--score", "mean")
    (row,) = read_rows(tmp_path / "mean" / "scores.csv")
    assert float(row["mean"]) == pytest.approx((500.0 + 200.0) / 2)  # curve means 500 and 200
    assert "mean over the evaluations" in (tmp_path / "mean" / "scores.md").read_text()
    run_aggregate([tmp_path / "runs"], tmp_path / "final")
    assert float(read_rows(tmp_path / "final" / "scores.csv")[0]["mean"]) == pytest.approx(500.0)  # 1000 and 0
    run_aggregate([tmp_path / "runs"], tmp_path / "success", "--metric", "success_rate", "--score", "mean")
    assert float(read_rows(tmp_path / "success" / "scores.csv")[0]["mean"]) == pytest.approx((2 / 3 + 2 / 3) / 2)


def test_tasks_option_keeps_only_the_named_tasks(tmp_path, capsys):
    make_run(tmp_path / "runs" / "a", curves={"finetune_walker_run": [(0, 1.0), (2000, 10.0)],
                                              "finetune_walker_walk": [(0, 1.0), (2000, 20.0)]})
    run_aggregate([tmp_path / "runs"], tmp_path / "out", "--tasks", "walker_walk")
    assert [row["task"] for row in read_rows(tmp_path / "out" / "scores.csv")] == ["walker_walk"]
    with pytest.raises(SystemExit):
        run_aggregate([tmp_path / "runs"], tmp_path / "none", "--tasks", "cheetah_run")
    assert "no record of task cheetah_run" in capsys.readouterr().err


def test_iqm_matches_hand_computation_and_rliable_is_reproducible(tmp_path):
    scores = [700.0, 10.0, 300.0, 990.0, 50.0, 450.0, 20.0, 100.0]
    for seed, score in enumerate(scores):
        make_run(tmp_path / "runs" / f"s{seed}", seed=seed, curves=final_curve(score))
    run_aggregate([tmp_path / "runs"], tmp_path / "a")
    run_aggregate([tmp_path / "runs"], tmp_path / "b")
    rows = {row["metric"]: row for row in read_rows(tmp_path / "a" / "aggregate.csv")}
    iqm = np.mean(sorted(scores)[2:6]) / 1000  # drop the lowest two and highest two: (50 + 100 + 300 + 450) / 4
    assert float(rows["IQM"]["point"]) == pytest.approx(iqm)
    assert float(rows["Mean"]["point"]) == pytest.approx(np.mean(scores) / 1000)
    assert float(rows["Median"]["point"]) == pytest.approx(np.mean(scores) / 1000)  # of the per-task means: one task
    assert float(rows["Optimality Gap"]["point"]) == pytest.approx(1 - np.mean(scores) / 1000)
    for row in rows.values():
        assert float(row["ci_low"]) <= float(row["point"]) <= float(row["ci_high"])
        assert float(row["ci_low"]) < float(row["ci_high"])
    assert (tmp_path / "a" / "aggregate.csv").read_text() == (tmp_path / "b" / "aggregate.csv").read_text()


def test_one_record_per_finetune_task_and_sweep_discovery(tmp_path):
    curves = {f"finetune_{task}": [(0, 1.0), (2000, score)]
              for task, score in (("walker_run", 100.0), ("walker_walk", 400.0), ("walker_stand", 900.0))}
    sweep = tmp_path / "multirun" / "2026.11.22" / "120000_train"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    for seed in (1, 2):
        run = make_run(sweep / f"{seed - 1}_walker_seed{seed}", task="walker_stand", seed=seed, curves=curves)
        (run / ".hydra").mkdir()
        (run / ".hydra" / "config.yaml").write_text("seed: 99\n")  # Hydra's copy: not a run of its own
    (sweep / "2_crashed_before_start" / ".hydra").mkdir(parents=True)  # a job that never wrote config.yaml
    (sweep / "2_crashed_before_start" / ".hydra" / "config.yaml").write_text("seed: 99\n")
    single = make_run(tmp_path / "single", seed=3, curves={"finetune_walker_run": [(2000, 200.0)]})
    run_aggregate([tmp_path / "multirun", single], tmp_path / "out")
    rows = {row["task"]: row for row in read_rows(tmp_path / "out" / "scores.csv")}
    assert {task: (float(r["mean"]), int(r["n_seeds"])) for task, r in rows.items()} == {
        "walker_run": (pytest.approx(400 / 3), 3), "walker_walk": (400.0, 2), "walker_stand": (900.0, 2)}
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "3 runs, 7 downstream records of eval episode return (7 complete)" in summary
    assert "proto  walker_walk  seed 3: never ran" in summary  # the single run has only walker_run
    assert "proto: seeds 1, 2 x tasks walker_run, walker_stand, walker_walk" in summary  # seed 3 lacks two tasks


def test_a_fine_tuning_without_pretraining_is_its_own_method_on_the_same_task(tmp_path):
    """`finetune_scratch_<task>` (compare_without_pretraining) is scored on <task>, as another method."""
    for seed in (1, 2):
        make_run(tmp_path / f"run{seed}", seed=seed, curves={"finetune_walker_run": [(2000, 300.0 + seed)],
                                                             "finetune_scratch_walker_run": [(2000, 100.0 + seed)]})
    run_aggregate([tmp_path / f"run{seed}" for seed in (1, 2)], tmp_path / "out")
    rows = {(row["method"], row["task"]): float(row["mean"]) for row in read_rows(tmp_path / "out" / "scores.csv")}
    assert rows == {("proto", "walker_run"): 301.5, ("proto without pre-training", "walker_run"): 101.5}


def test_missing_seed_and_incomplete_runs_are_named(tmp_path):
    for seed in (1, 2, 3):
        make_run(tmp_path / f"proto_{seed}", seed=seed, curves=final_curve(100.0 * seed),
                 running=("finetune",) if seed == 3 else ())
    for seed in (1, 3):  # apt seed 2 never ran
        make_run(tmp_path / f"apt_{seed}", agent="apt", seed=seed, curves=final_curve(50.0))
    make_run(tmp_path / "icm_1", agent="icm", seed=1, curves={"finetune": []}, running=("finetune",))
    run_aggregate([tmp_path / f"{name}" for name in ("proto_1", "proto_2", "proto_3", "apt_1", "apt_3", "icm_1")],
                  tmp_path / "out")
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "apt  walker_run  seed 2: never ran" in summary
    assert "proto  walker_run  seed 3: running or stopped, last evaluation at 2000 frames" in summary
    assert f"icm  walker_run  seed 1: no evaluation yet ({tmp_path / 'icm_1' / 'finetune'})" in summary
    assert "not complete (5 of methods x tasks x seeds)" in summary  # + icm seeds 2 and 3, never ran
    rows = {row["method"]: row for row in read_rows(tmp_path / "out" / "scores.csv")}
    assert set(rows) == {"apt", "proto"}
    assert (int(rows["proto"]["n_seeds"]), float(rows["proto"]["mean"])) == (2, 150.0)  # seed 3 excluded


def test_a_result_that_fails_its_digest_and_a_row_cut_short_are_not_taken(tmp_path):
    """A result.json changed after it was written is named as such, not as a run still going; a last eval.csv row
    cut short by a killed write is not an evaluation."""
    for seed in (1, 2):
        make_run(tmp_path / f"proto_{seed}", seed=seed, curves=final_curve(100.0 * seed))
    record = tmp_path / "proto_2" / "finetune" / "result.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "record_version": 2, "sha256": "0" * 64}))
    with open(tmp_path / "proto_1" / "finetune" / "eval.csv", "a") as f:
        f.write("3000,1500,9")  # no newline: the write stopped here
    run_aggregate([tmp_path / "proto_1", tmp_path / "proto_2"], tmp_path / "out")
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert ("proto  walker_run  seed 2: its result.json does not match its digest (changed after it was written), "
            "last evaluation at 2000 frames") in summary
    rows = {row["method"]: row for row in read_rows(tmp_path / "out" / "scores.csv")}
    assert (int(rows["proto"]["n_seeds"]), float(rows["proto"]["mean"])) == (1, 100.0)  # the cut row not read


def test_group_by_separates_methods_by_intrinsic_reward_coefficient(tmp_path):
    for alpha, scores in ((0.1, (100.0, 300.0)), (0.5, (700.0, 900.0))):
        for seed, score in enumerate(scores):
            make_run(tmp_path / f"a{alpha}_s{seed}", seed=seed, intr_coef=alpha, curves=final_curve(score))
    run_aggregate([tmp_path], tmp_path / "out", "--group-by", "agent.name", "agent.intr_coef")
    rows = {row["method"]: float(row["mean"]) for row in read_rows(tmp_path / "out" / "scores.csv")}
    assert rows == {"agent.name=proto agent.intr_coef=0.1": 200.0, "agent.name=proto agent.intr_coef=0.5": 800.0}
    methods = {row["method"] for row in read_rows(tmp_path / "out" / "aggregate.csv")}
    assert methods == set(rows)


def test_seed_curves_are_aligned_on_shared_frames():
    def record(frames, returns):
        return Record("proto", "proto", "walker_run", 1, np.array(frames, float), np.array(returns, float),
                      COMPLETE, Path("."))

    frames, mean, std = seed_curve([record([0, 1000, 2000], [0.0, 10.0, 20.0]), record([0, 1000], [4.0, 30.0])])
    assert list(frames) == [0, 1000]
    np.testing.assert_allclose(mean, [2.0, 20.0])
    np.testing.assert_allclose(std, [2.0, 10.0])  # population std of two values: half their distance


def test_drq_is_a_line_at_its_final_mean_unless_all_curves_are_asked_for():
    """The paper's figures draw DrQ (no pre-training) as a reference line; --all-curves draws its curve."""
    def record(agent: str, seed: int, values: list[float]) -> Record:
        return Record(agent, agent, "walker_run", seed, np.array([0, 1000, 2000]), np.array(values), COMPLETE,
                      Path(f"/{agent}{seed}"))

    records = [record("proto", 1, [0.0, 10.0, 20.0]), record("proto", 2, [0.0, 20.0, 40.0]),
               record("drq", 1, [0.0, 5.0, 100.0]), record("drq", 2, [0.0, 5.0, 200.0])]
    colors = {"proto": "C0", "drq": "C1"}
    panel = curve_panel("walker_run", records, colors, "return")
    assert [c.label for c in panel.curves] == ["proto (2 seeds)"]
    assert [(level.label, level.value) for level in panel.levels] == [("drq (final, 2 seeds)", 150.0)]
    panel = curve_panel("walker_run", records, colors, "return", all_curves=True)
    assert sorted(c.label for c in panel.curves) == ["drq (2 seeds)", "proto (2 seeds)"] and not panel.levels
    drq = next(c for c in panel.curves if c.label.startswith("drq"))
    assert list(drq.values) == [0.0, 5.0, 150.0]


def test_figures_are_written_as_png_and_pdf(tmp_path):
    for agent, score in (("proto", 600.0), ("random", 100.0), ("drq", 800.0)):
        for task in ("walker_run", "cheetah_run"):
            for seed in (1, 2):
                make_run(tmp_path / f"{agent}_{task}_{seed}", agent=agent, task=task, seed=seed,
                         curves=final_curve(score + seed))
    run_aggregate([tmp_path], tmp_path / "out")
    for name in ("curves", "aggregate", "profiles"):
        png, pdf = tmp_path / "out" / f"{name}.png", tmp_path / "out" / f"{name}.pdf"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        image = matplotlib.image.imread(png)
        assert image.ndim == 3 and min(image.shape[:2]) > 100 and image.std() > 0  # not a blank canvas
        assert pdf.read_bytes()[:4] == b"%PDF"


def test_no_complete_record_writes_only_the_summary(tmp_path, capsys):
    make_run(tmp_path / "run", curves={"finetune": [(1000, 50.0)]}, running=("finetune",))
    run_aggregate([tmp_path / "run"], tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["summary.txt"]
    out = capsys.readouterr().out
    assert "no complete record" in out and "proto  walker_run  seed 1: running or stopped" in out


@pytest.mark.parametrize("make", ["nothing", "empty directory"])
def test_bad_paths_exit_with_status_2(tmp_path, capsys, make):
    path = tmp_path / "no_such_sweep"
    if make == "empty directory":
        path.mkdir()
    with pytest.raises(SystemExit) as exit_info:
        run_aggregate([path], tmp_path / "out")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("protorl: error:") and str(path) in err and len(err.strip().splitlines()) == 1


def test_a_pretraining_metric_is_aggregated_by_method_from_analysis_csv(tmp_path):
    """--metric coverage/entropy (figure 9): one record per pre-training phase, its last analysis row."""
    finals = {("proto", 1): 0.5, ("proto", 2): 0.7, ("random", 1): 0.2, ("random", 2): 0.4}
    for (agent, seed), final in finals.items():
        run = make_run(tmp_path / "runs" / f"{agent}_{seed}", agent=agent, task="point_mass_maze_explore", seed=seed)
        (run / "pretrain").mkdir()
        (run / "pretrain" / "analysis.csv").write_text(
            f"frames,coverage/entropy,variance/proto_cv\n2000,{final},\n1000,0.1,0.3\n")  # rows out of order
        if (agent, seed) != ("random", 2):
            (run / "pretrain" / "result.json").write_text("{}")
    run_aggregate([tmp_path / "runs"], tmp_path / "out", "--metric", "coverage/entropy")
    rows = {row["method"]: row for row in read_rows(tmp_path / "out" / "scores.csv")}
    assert float(rows["proto"]["mean"]) == pytest.approx(0.6) and float(rows["proto"]["std"]) == pytest.approx(0.1)
    assert float(rows["random"]["mean"]) == pytest.approx(0.2) and rows["random"]["n_seeds"] == "1"
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "random  point_mass_maze_explore  seed 2: running or stopped" in summary
    assert "coverage/entropy" in (tmp_path / "out" / "scores.md").read_text()


def test_returns_are_normalised_by_each_tasks_maximum_return(tmp_path):
    """Reach Duplo's episodes are 250 control steps (appendix C.1), the suite's 1000: 125 and 500 both score 0.5."""
    make_run(tmp_path / "runs" / "duplo", task="reach_duplo_top_left", curves=final_curve(125.0))
    make_run(tmp_path / "runs" / "walker", task="walker_run", curves=final_curve(500.0))
    run_aggregate([tmp_path / "runs"], tmp_path / "out")
    points = {row["metric"]: float(row["point"]) for row in read_rows(tmp_path / "out" / "aggregate.csv")}
    assert points["Mean"] == pytest.approx(0.5) and points["Optimality Gap"] == pytest.approx(0.5)


def test_reference_scores_replace_the_maximum_return_for_rliable(tmp_path):
    """--reference TASK=SCORE: expert-normalised scores, as URLB reports them; the return table is unchanged."""
    make_run(tmp_path / "runs" / "run", task="walker_run", curves=final_curve(200.0))
    make_run(tmp_path / "runs" / "walk", task="walker_walk", curves=final_curve(600.0))
    run_aggregate([tmp_path / "runs"], tmp_path / "out", "--reference", "walker_run=800", "walker_walk=960")
    points = {row["metric"]: float(row["point"]) for row in read_rows(tmp_path / "out" / "aggregate.csv")}
    assert points["Mean"] == pytest.approx((200 / 800 + 600 / 960) / 2)
    assert {row["task"]: float(row["mean"]) for row in read_rows(tmp_path / "out" / "scores.csv")} == \
        {"walker_run": 200.0, "walker_walk": 600.0}
    assert "/ the reference score (walker_run 800, walker_walk 960)" in (tmp_path / "out" / "summary.txt").read_text()


@pytest.mark.parametrize("references, message", [
    (["walker_run=800"], "no reference score for task walker_walk"),
    (["walker_run=800", "walker_walk=960", "walker_stand=984"], "no record of task walker_stand"),
    (["walker_run=800", "walker_walk=-1"], "'walker_walk=-1' is not TASK=SCORE with a positive SCORE"),
    (["walker_run=800", "walker_walk"], "'walker_walk' is not TASK=SCORE"),
    (["walker_run=800", "walker_run=700"], "--reference names a task twice"),
])
def test_a_bad_reference_is_one_line_and_writes_nothing(tmp_path, capsys, references, message):
    make_run(tmp_path / "runs" / "run", task="walker_run", curves=final_curve(200.0))
    make_run(tmp_path / "runs" / "walk", task="walker_walk", curves=final_curve(600.0))
    with pytest.raises(SystemExit) as exit_info:
        run_aggregate([tmp_path / "runs"], tmp_path / "out", "--reference", *references)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_reference_scores_do_not_apply_to_a_pretraining_metric(tmp_path, capsys):
    make_run(tmp_path / "runs" / "run", curves=final_curve(200.0))
    with pytest.raises(SystemExit):
        run_aggregate([tmp_path / "runs"], tmp_path / "out", "--metric", "coverage/entropy",
                      "--reference", "walker_run=800")
    assert "does not apply to --metric" in capsys.readouterr().err


def test_runs_of_one_method_task_and_seed_with_different_configs_ask_for_group_by(tmp_path, capsys):
    """E.g. figure 14's runs (no pre-training) aggregated with figure 4's: not repeats, two experiments."""
    make_run(tmp_path / "fig4" / "proto", curves=final_curve(300.0))
    run = make_run(tmp_path / "fig14" / "proto", curves=final_curve(100.0))
    OmegaConf.save(OmegaConf.merge(OmegaConf.load(run / "config.yaml"), {"pretrain_frames": 0}), run / "config.yaml")
    with pytest.raises(SystemExit) as stop:
        run_aggregate([tmp_path / "fig4", tmp_path / "fig14"], tmp_path / "out")
    assert stop.value.code == 2
    assert "differ in pretrain_frames" in capsys.readouterr().err
    run_aggregate([tmp_path / "fig4", tmp_path / "fig14"], tmp_path / "out", "--group-by", "agent.name",
                  "pretrain_frames")
    assert {row["method"] for row in read_rows(tmp_path / "out" / "scores.csv")} == {
        "agent.name=proto pretrain_frames=0", "agent.name=proto pretrain_frames=4000"}


@pytest.mark.parametrize(("sha_a", "sha_b", "differing"), [
    ("ab12", "ab12", None),  # one snapshot found at two paths: repeats
    ("ab12", "cd34", "snapshot_sha256"),  # two snapshots
    ("ab12", None, "snapshot"), (None, "ab12", "snapshot"),  # one recorded by its path only: the paths differ
])
def test_fine_tunings_of_one_snapshot_found_at_two_paths_are_duplicates(tmp_path, capsys, sha_a, sha_b, differing):
    """A snapshot is identified by its content: the same fine-tuning from it under two paths is a repeat; from
    snapshots of other content, or one known by its path alone, two experiments --group-by must tell apart,
    whichever run is found first."""
    for name, path, sha in (("a", "/old/snapshot_4000.pt", sha_a), ("b", "/new/snapshot_4000.pt", sha_b)):
        run_dir = make_run(tmp_path / name, curves=final_curve(300.0))
        OmegaConf.save(OmegaConf.merge(OmegaConf.load(run_dir / "config.yaml"),
                                       {"snapshot": path, "snapshot_sha256": sha}), run_dir / "config.yaml")
    if differing is None:
        run_aggregate([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
        assert "duplicate ignored" in capsys.readouterr().out
        assert len(read_rows(tmp_path / "out" / "scores.csv")) == 1
    else:
        with pytest.raises(SystemExit):
            run_aggregate([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
        assert f"they differ in {differing})" in capsys.readouterr().err


def test_a_run_repeated_with_other_checkpoint_settings_is_a_duplicate_not_another_experiment(tmp_path, capsys):
    """A single run and a sweep's run of the same seed that differ only in what a rerun may change (checkpoints):
    one record kept, the other listed as a duplicate, and neither called a run without the phase."""
    make_run(tmp_path / "sweep" / "0_proto", curves=final_curve(300.0))
    single = make_run(tmp_path / "single", curves=final_curve(300.0))
    OmegaConf.save(OmegaConf.merge(OmegaConf.load(single / "config.yaml"), {"checkpoints": {"every_frames": 500}}),
                   single / "config.yaml")
    run_aggregate([tmp_path / "sweep", tmp_path / "single"], tmp_path / "out")
    summary = capsys.readouterr().out
    assert "duplicate ignored" in summary and "run without such a phase" not in summary
    assert len(read_rows(tmp_path / "out" / "scores.csv")) == 1



def test_a_run_saved_with_the_flat_keys_of_before_the_groups_is_read_on_todays_keys(tmp_path):
    """A config.yaml written before the settings were grouped (`env` its task, `checkpoint_every_frames`) is read
    on today's keys: the same experiment as a run saved since, another seed of it."""
    make_run(tmp_path / "runs" / "grouped", curves=final_curve(300.0))
    flat = make_run(tmp_path / "runs" / "flat", seed=2, curves=final_curve(100.0))
    OmegaConf.save({"env": "walker_run", "seed": 2, "agent": {"name": "proto", "intr_coef": 0.2},
                    "pretrain_frames": 4000, "finetune_frames": 2000, "checkpoint_every_frames": 500},
                   flat / "config.yaml")
    run_aggregate([tmp_path / "runs"], tmp_path / "out")
    (row,) = read_rows(tmp_path / "out" / "scores.csv")
    assert (row["task"], int(row["n_seeds"]), float(row["mean"])) == ("walker_run", 2, 200.0)

def test_group_by_agent_labels_the_agent_config_chosen(tmp_path):
    """agent=proto and agent=proto_variant are both agent.name "proto": `--group-by agent` tells them apart by
    Hydra's record of the choice, by today's names for runs started before the rename (agent=proto_paper the
    published algorithm, agent=proto with preset=small's file the variant); a run without that record falls back
    to agent.name."""
    choices = {"proto": {"agent": "proto", "agent_scale@agent": "proto_small"},
               "proto_variant": {"agent": "proto_variant", "agent_scale@agent": "proto_variant_small"},
               "old_paper": {"agent": "proto_paper", "agent_preset@agent": "proto_paper_small"},
               "old_variant": {"agent": "proto", "agent_preset@agent": "proto_small"},
               "old_paper_preset": {"agent": "proto", "agent_preset@agent": "proto_paper"}}
    scores = {"proto": 100.0, "proto_variant": 300.0, "old_paper": 110.0, "old_variant": 310.0,
              "old_paper_preset": 120.0}
    for seed, (name, choice) in enumerate(choices.items(), start=1):  # a seed each: no run repeats another
        run = make_run(tmp_path / "runs" / name, seed=seed, curves=final_curve(scores[name]))
        (run / ".hydra").mkdir()
        OmegaConf.save({"hydra": {"runtime": {"choices": choice}}}, run / ".hydra" / "hydra.yaml")
    make_run(tmp_path / "runs" / "plain", agent="random", curves=final_curve(50.0))
    run_aggregate([tmp_path / "runs"], tmp_path / "out", "--group-by", "agent")
    means = {row["method"]: float(row["mean"]) for row in read_rows(tmp_path / "out" / "scores.csv")}
    assert means == {"proto": pytest.approx(110.0), "proto_variant": 305.0, "random": 50.0}


def test_a_job_the_sweeps_index_marks_incomplete_is_named_even_without_a_record(tmp_path):
    """A job refused before writing anything has no config.yaml, only its line in index.csv: the summary names it
    instead of saying "all complete"."""
    sweep = tmp_path / "sweep"
    make_run(sweep / "0_proto_walker_run_seed1", curves=final_curve(100.0))
    (sweep / "1_proto_walker_run_seed2" / ".hydra").mkdir(parents=True)  # refused: Hydra's files only
    with open(sweep / "index.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["run_dir", "overrides", "agent", "env", "seed", "phases", "complete"])
        writer.writeheader()
        writer.writerow({"run_dir": "0_proto_walker_run_seed1", "overrides": "seed=1", "complete": "true"})
        writer.writerow({"run_dir": "1_proto_walker_run_seed2", "overrides": "seed=2 agent.lr=-1", "complete": "false"})
    run_aggregate([sweep], tmp_path / "out")
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "all complete" not in summary
    assert f"{sweep / '1_proto_walker_run_seed2'}: stopped before completing (seed=2 agent.lr=-1; index.csv)" in summary


def test_a_run_still_pretraining_is_named_as_such_not_as_a_run_without_the_phase(tmp_path):
    sweep = tmp_path / "sweep"
    make_run(sweep / "0_proto_walker_run_seed1", curves=final_curve(100.0))
    pretraining = make_run(sweep / "1_proto_walker_run_seed2")
    (pretraining / "pretrain").mkdir()  # its eval.csv and checkpoints so far, no result.json yet
    pretrained = make_run(sweep / "2_proto_walker_run_seed3")
    (pretrained / "pretrain").mkdir()
    (pretrained / "pretrain" / "result.json").write_text("{}")  # a pre-training run: no downstream phase of its own
    run_aggregate([sweep], tmp_path / "out")
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert f"pre-training running or stopped, no downstream phase yet: {pretraining}" in summary
    assert f"run without such a phase: {pretrained}" in summary
    assert "all complete" not in summary  # the run still pre-training is not complete
    assert f"    {pretraining}: pre-training running or stopped, no downstream phase yet" in summary


def test_at_reads_each_run_as_it_stood_at_a_budget(tmp_path):
    """--at FRAMES: a run that has passed FRAMES counts (finished or not) with its last value at or before them;
    one still short of them is running, one that ended before them is named as such."""
    for name, seed, rows, running in (("passed", 1, [(1000, 0.2), (2000, 0.4), (3000, 0.9)], True),
                                      ("finished", 2, [(1000, 0.1), (2000, 0.6), (4000, 0.8)], False),
                                      ("short", 3, [(1000, 0.3)], True),
                                      ("ended", 4, [(1000, 0.5)], False),
                                      ("between", 5, [(1000, 0.8), (2500, 0.9)], True)):
        run = make_run(tmp_path / "runs" / name, seed=seed)
        (run / "pretrain").mkdir()
        (run / "pretrain" / "analysis.csv").write_text(
            "frames,coverage/entropy\n" + "".join(f"{frames},{value}\n" for frames, value in rows))
        if not running:
            (run / "pretrain" / "result.json").write_text("{}")
    run_aggregate([tmp_path / "runs"], tmp_path / "out", "--metric", "coverage/entropy", "--at", "2000")
    (row,) = read_rows(tmp_path / "out" / "scores.csv")
    assert float(row["mean"]) == pytest.approx((0.4 + 0.6 + 0.8) / 3) and row["n_seeds"] == "3"
    assert {int(r["seed"]): float(r["score"]) for r in read_rows(tmp_path / "out" / "runs.csv")} == \
        pytest.approx({1: 0.4, 2: 0.6, 5: 0.8})
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "seed 3: running or stopped, last evaluation at 1000 frames" in summary
    assert "seed 4: ended before the frames asked for, last evaluation at 1000 frames" in summary
    assert "Coverage/entropy at 2,000 frames: mean" in (tmp_path / "out" / "scores.md").read_text()
    run_aggregate([tmp_path / "runs"], tmp_path / "mean", "--metric", "coverage/entropy", "--at", "2000",
                  "--score", "mean")
    assert {int(r["seed"]): float(r["score"]) for r in read_rows(tmp_path / "mean" / "runs.csv")} == \
        pytest.approx({1: 0.3, 2: 0.35, 5: 0.8})  # the mean of the values up to 2000 frames


def budget_runs(root: Path, scores: dict[tuple[str, int, int], float]) -> None:
    """One run per (agent, pretrain_frames, seed): a fine-tuning on walker_run ending at the score."""
    for (agent, frames, seed), score in scores.items():
        run = make_run(root / f"{agent}_{frames}_{seed}", agent=agent, seed=seed, curves=final_curve(score))
        OmegaConf.save(OmegaConf.merge(OmegaConf.load(run / "config.yaml"), {"pretrain_frames": frames}),
                       run / "config.yaml")


def test_versus_plots_each_budgets_iqm_and_a_method_without_pretraining_as_a_line(tmp_path, capsys):
    """--versus pretrain_frames: per budget, rliable's IQM over that budget's runs (four seeds: the mean of the
    middle two); DrQ, which does not pre-train, is one line across whatever its runs' budget key says."""
    scores = {("proto", 1000, s): v for s, v in zip(range(4), (100.0, 200.0, 300.0, 900.0), strict=True)}
    scores |= {("proto", 10000, s): v for s, v in zip(range(4), (500.0, 600.0, 700.0, 0.0), strict=True)}
    scores |= {("drq", 1000 * (1 + s % 2), s): v for s, v in zip(range(4), (50.0, 60.0, 70.0, 80.0), strict=True)}
    budget_runs(tmp_path / "runs", scores)
    run_aggregate([tmp_path / "runs"], tmp_path / "out", "--versus", "pretrain_frames")
    rows = {(r["method"], r["value"], r["metric"]): r for r in read_rows(tmp_path / "out" / "versus.csv")}
    assert float(rows["proto", "1000", "IQM"]["point"]) == pytest.approx((200 + 300) / 2 / 1000)
    assert float(rows["proto", "10000", "IQM"]["point"]) == pytest.approx((500 + 600) / 2 / 1000)
    assert float(rows["proto", "10000", "Mean"]["point"]) == pytest.approx(1800 / 4 / 1000)
    assert float(rows["drq", "", "IQM"]["point"]) == pytest.approx((60 + 70) / 2 / 1000)  # all four seeds, one line
    assert rows["drq", "", "IQM"]["n_seeds"] == "4" and rows["proto", "1000", "IQM"]["n_seeds"] == "4"
    assert {key[:2] for key in rows} == {("proto", "1000"), ("proto", "10000"), ("drq", "")}
    for row in rows.values():
        assert float(row["ci_low"]) <= float(row["point"]) <= float(row["ci_high"])
    assert matplotlib.image.imread(tmp_path / "out" / "versus.png").shape[1] > 500
    summary = capsys.readouterr().out
    assert "proto, pretrain_frames=1000 (4 seeds): IQM 0.250 [" in summary
    assert "drq, at every value (4 seeds)" in summary


def test_versus_draws_an_earlier_aggregates_method_as_a_baseline(tmp_path, capsys):
    budget_runs(tmp_path / "runs", {("proto", 1000, 1): 300.0, ("proto", 2000, 1): 500.0})
    make_run(tmp_path / "earlier" / "drq", agent="drq", curves=final_curve(250.0))
    run_aggregate([tmp_path / "earlier"], tmp_path / "drq")
    run_aggregate([tmp_path / "runs"], tmp_path / "out", "--versus", "pretrain_frames",
                  "--baseline", str(tmp_path / "drq" / "aggregate.csv"), "drq")
    baseline = "drq (drq)"  # the method (the folder of its aggregate.csv)
    rows = {(r["method"], r["metric"]): r for r in read_rows(tmp_path / "out" / "versus.csv")}
    assert float(rows[baseline, "Mean"]["point"]) == pytest.approx(0.25) and rows[baseline, "Mean"]["value"] == ""
    run_aggregate([tmp_path / "runs"], tmp_path / "at", "--versus", "pretrain_frames",
                  "--baseline", str(tmp_path / "drq" / "aggregate.csv"), "drq@500")  # measured at 500: a point
    rows = {(r["method"], r["metric"]): r for r in read_rows(tmp_path / "at" / "versus.csv")}
    assert float(rows[baseline, "Mean"]["point"]) == pytest.approx(0.25) and rows[baseline, "Mean"]["value"] == "500"
    assert "drq (drq), pretrain_frames=500: IQM 0.250 [" in capsys.readouterr().out
    for bad, message in (([str(tmp_path / "drq" / "aggregate.csv"), "apt"], "no complete rows of method 'apt'"),
                         ([str(tmp_path / "drq" / "scores.csv"), "drq"], "not an aggregate.csv"),
                         ([str(tmp_path / "missing.csv"), "drq"], "No such file"),
                         ([str(tmp_path / "drq" / "aggregate.csv"), "drq@half"], "METHOD@VALUE with VALUE a number"),
                         ([str(tmp_path / "drq" / "aggregate.csv"), "@500"], "METHOD@VALUE with VALUE a number")):
        with pytest.raises(SystemExit) as stop:
            run_aggregate([tmp_path / "runs"], tmp_path / "bad", "--versus", "pretrain_frames", "--baseline", *bad)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and message in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit):
        run_aggregate([tmp_path / "runs"], tmp_path / "bad", "--baseline", str(tmp_path / "drq" / "aggregate.csv"),
                      "drq")
    assert "give --versus KEY" in capsys.readouterr().err


def test_versus_keeps_a_fine_tuning_without_pretraining_and_a_seed_at_several_budgets_as_lines(tmp_path):
    """A run's fine-tuning without pre-training (finetune_scratch_<task>) and DrQ's runs of one seed at two
    budgets do not vary with the budget: each is one line across (a seed's runs at two budgets are repeats), not
    mixed into the pre-trained curve."""
    for seed in (1, 2):
        for frames, score, scratch in ((1000, 400.0, 100.0), (2000, 600.0, 100.0)):
            run = make_run(tmp_path / "runs" / f"proto_{frames}_{seed}", seed=seed,
                           curves={"finetune": [(2000, score + seed)], "finetune_scratch_walker_run":
                                   [(2000, scratch + seed)]})
            OmegaConf.save(OmegaConf.merge(OmegaConf.load(run / "config.yaml"), {"pretrain_frames": frames}),
                           run / "config.yaml")
    budget_runs(tmp_path / "runs", {("drq", 1000, 1): 50.0, ("drq", 2000, 1): 50.0})
    run_aggregate([tmp_path / "runs"], tmp_path / "out", "--versus", "pretrain_frames")
    rows = {(r["method"], r["value"]): float(r["point"]) for r in read_rows(tmp_path / "out" / "versus.csv")
            if r["metric"] == "Mean"}
    assert (tmp_path / "out" / "summary.txt").read_text().count("duplicate ignored") == 3  # drq 1, scratch 1 and 2
    assert rows == pytest.approx({("proto", "1000"): 401.5 / 1000, ("proto", "2000"): 601.5 / 1000,
                                  ("proto without pre-training", ""): (101.0 + 102.0) / 2 / 1000,
                                  ("drq", ""): 0.05})


@pytest.mark.parametrize("extra, message", [
    (["--versus", "task"], "--versus task: "),
    (["--versus", "agent.nope"], "has no agent.nope"),
    (["--versus", "pretrain_frames", "--group-by", "pretrain_frames"], "leave it out of --group-by"),
    (["--versus", "pretrain_frames", "--group-by", "task"], "has runs whose score varies with pretrain_frames and "
                                                            "runs whose score does not"),
])
def test_versus_refuses_what_it_cannot_plot_in_one_line(tmp_path, capsys, extra, message):
    budget_runs(tmp_path / "runs", {("proto", 1000, 1): 300.0, ("drq", 1000, 1): 100.0})
    with pytest.raises(SystemExit) as stop:
        run_aggregate([tmp_path / "runs"], tmp_path / "out", *extra)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
