"""The pixel downstream study's presets (docs/results/pixels_downstream) run end to end at tiny size: the
pre-training, the two fine-tunings from its snapshot and DrQ without pre-training, from pixels, each evaluated at
the same frames."""

from __future__ import annotations

import json

import pytest

from tests.runs import AGENT_SIZES, TINY_SHARED, assert_ok, read_rows, run

TINY_STUDY = [*TINY_SHARED, "training.seed_transitions=20", "replay.capacity=1000", "checkpoints.every_frames=1000"]
FRAMES = ["finetune_frames=2000", "evaluation.every_frames=1000"]


@pytest.mark.slow
def test_the_three_arms_run_from_the_presets_and_are_evaluated_alike(tmp_path):
    pretrain = tmp_path / "pretrain_run"
    assert_ok(run("pretrain", "experiment=pixels_downstream_pretrain", *TINY_STUDY, *AGENT_SIZES["proto"],
                  "pretrain_frames=2000", "analyses.every_frames=2000", "analyses.probe_samples=20",
                  "analyses.map_samples=64", "analyses.variance_probes=8", "seed=1", run_dir=pretrain))
    snapshot = pretrain / "pretrain" / "snapshots" / "snapshot_2000.pt"
    assert snapshot.is_file()

    evaluations = {}
    for arm in ("pixels_downstream_paper_finetune", "pixels_downstream_finetune"):
        run_dir = tmp_path / arm
        result = run("finetune", f"experiment={arm}", *TINY_STUDY, *AGENT_SIZES["proto"], *FRAMES,
                     f"snapshot={snapshot}", "pretrain_frames=2000", "seed=1", run_dir=run_dir)
        assert_ok(result)
        # the default fine-tuning learns from the pre-training's data too; the paper's does not
        assert ("pre-training data:" in result.stderr + result.stdout) == (arm == "pixels_downstream_finetune")
        evaluations[arm] = read_rows(run_dir / "finetune_point_mass_maze_reach_top_left" / "eval.csv")
    scratch = tmp_path / "scratch"
    assert_ok(run("train", "experiment=pixels_downstream_scratch", *TINY_STUDY, *FRAMES, "seed=1", run_dir=scratch))
    assert not (scratch / "pretrain").exists()
    scratch_result = json.loads((scratch / "finetune_point_mass_maze_reach_top_left" / "result.json").read_text())
    evaluations["scratch"] = read_rows(scratch / "finetune_point_mass_maze_reach_top_left" / "eval.csv")

    assert {arm: [row["frames"] for row in rows] for arm, rows in evaluations.items()} == {
        arm: ["0", "1000", "2000"] for arm in evaluations}
    # both fine-tunings start from the same pre-trained actor: the same evaluation before their first update
    assert evaluations["pixels_downstream_paper_finetune"][0] == evaluations["pixels_downstream_finetune"][0]
    assert scratch_result["frames"] == 2000
