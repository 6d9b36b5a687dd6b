"""Sweeps that share pre-training (figures 6 and 7): fine-tunings from a pre-training sweep's snapshots."""

from __future__ import annotations

import csv

import pytest
import torch
from omegaconf import OmegaConf

import protorl
from protorl.app.tools import aggregate
from protorl.errors import SnapshotError
from protorl.storage.snapshots import load_snapshot
from tests.agents import tiny, tiny_config

pytestmark = pytest.mark.slow  # the slow tier: this module runs protorl's commands or real training


def tensors(state, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(state, dict):
        return {k: v for key, value in state.items() for k, v in tensors(value, f"{prefix}{key}.").items()}
    return {prefix: state} if isinstance(state, torch.Tensor) else {}


def test_a_snapshot_along_a_longer_pretraining_equals_a_shorter_pretrainings_end(tmp_path):
    """Figure 6 from one pre-training per run: its snapshot at 2k frames is bitwise the end of a 2k-frame run."""
    short = protorl.pretrain(tiny(tmp_path / "short", pretrain_frames=2000))[0].snapshots[-1]
    longer = protorl.pretrain(tiny(tmp_path / "long", pretrain_frames=3000, snapshots={"at_frames": [2000]}))[0]
    along = longer.out_dir / "snapshots" / "snapshot_2000.pt"
    assert short.name == along.name and along in longer.snapshots
    expected, got = tensors(load_snapshot(short)["agent"]), tensors(load_snapshot(along)["agent"])
    assert expected.keys() == got.keys() and expected
    assert all(torch.equal(got[key], value) for key, value in expected.items())


def test_one_pretraining_serves_two_finetunings_found_in_its_sweep(tmp_path):
    sweep = tmp_path / "pretrain_sweep"
    protorl.pretrain(tiny(sweep / "0_proto_point_mass_easy_seed1", pretrain_frames=2000))
    runs = []
    for job, alpha in enumerate((0.0, 0.5)):
        run_dir = tmp_path / "finetune_sweep" / f"{job}_proto_point_mass_easy_seed1"
        config = tiny(run_dir, pretrain_frames=2000, pretrain_sweep=str(sweep),
                      agent=tiny_config("proto", intr_coef=alpha))
        (result,) = protorl.finetune(config)
        assert result.frames == 1000
        recorded = OmegaConf.load(run_dir / "config.yaml")  # the run records the snapshot it started from
        assert recorded.snapshot == str((sweep / "0_proto_point_mass_easy_seed1" / "pretrain" / "snapshots" /
                                         "snapshot_2000.pt").resolve())
        runs.append((run_dir, config, result))
    # resumable like any run: the same call again skips the completed fine-tuning
    run_dir, config, result = runs[0]
    (again,) = protorl.finetune(tiny(run_dir, pretrain_frames=2000, pretrain_sweep=str(sweep),
                                     agent=tiny_config("proto", intr_coef=0.0)))
    assert again.wall_time_s == result.wall_time_s
    # grouped by alpha as the per-alpha sweep's runs were
    aggregate([str(tmp_path / "finetune_sweep"), "--out", str(tmp_path / "out"), "--reps", "10",
               "--group-by", "agent.name", "agent.intr_coef"])
    with open(tmp_path / "out" / "scores.csv", newline="") as f:
        methods = sorted(row["method"] for row in csv.DictReader(f))
    assert len(methods) == 2 and "0.0" in methods[0] and "0.5" in methods[1]


def test_a_missing_pretraining_or_snapshot_is_one_clear_error(tmp_path):
    sweep = tmp_path / "pretrain_sweep"
    protorl.pretrain(tiny(sweep / "0_proto_point_mass_easy_seed1", pretrain_frames=2000))
    with pytest.raises(SnapshotError, match="no run pre-trained agent proto on point_mass_easy with seed 2"):
        protorl.finetune(tiny(tmp_path / "a", seed=2, pretrain_frames=2000, pretrain_sweep=str(sweep)))
    with pytest.raises(SnapshotError, match="no snapshot at pretrain_frames=4000"):
        protorl.finetune(tiny(tmp_path / "b", pretrain_frames=4000, pretrain_sweep=str(sweep)))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
