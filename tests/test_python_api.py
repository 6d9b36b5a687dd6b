"""protorl.train / pretrain / finetune from Python: the commands' checks and run-directory contract."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

import protorl
from protorl.agents.proto import ProtoConfig
from protorl.config import Config, ConfigError
from protorl.errors import SnapshotError
from tests.agents import tiny_config
from tests.runs import read_csv


def tiny(run_dir, **fields) -> Config:
    """A tiny run from states on point_mass_easy: 1000-frame episodes of 125 agent steps."""
    settings = dict(obs="states", env="point_mass_easy", action_repeat=8, seed_transitions=20, replay_capacity=2000,
                    eval_episodes=1, eval_every_frames=1000, analysis_every_frames=None, snapshot_at_frames=[],
                    progress_bar=False, threads=1, fast_malloc=False, tensorboard=False, pretrain_frames=1000,
                    finetune_frames=1000, agent=tiny_config("proto"), run_dir=str(run_dir))
    return Config(**{**settings, **fields})


def test_train_runs_both_phases_and_keeps_the_run_directory_contract(tmp_path):
    run_dir = tmp_path / "run"
    results = protorl.train(tiny(run_dir))
    assert [(r.phase, r.frames) for r in results] == [("pretrain", 1000), ("finetune", 1000)]
    assert results[0].snapshots and results[0].snapshots[-1].is_file()
    _, evals = read_csv(run_dir / "finetune" / "eval.csv")
    assert [r["frames"] for r in evals] == ["0", "1000"]
    saved = OmegaConf.load(run_dir / "config.yaml")
    assert saved.agent.num_prototypes == 16 and saved.run_dir == str(run_dir)
    # the same call again: both phases are complete, nothing runs again
    again = protorl.train(tiny(run_dir))
    assert [(r.phase, r.wall_time_s) for r in again] == [(r.phase, r.wall_time_s) for r in results]
    # other settings in the same directory are refused, naming the key
    with pytest.raises(ConfigError, match="finetune_frames"):
        protorl.train(tiny(run_dir), finetune_frames=2000)
    # fine-tuning from the snapshot on another task of the domain, as protorl-finetune
    other = protorl.finetune(tiny(tmp_path / "other", env="point_mass_hard"), snapshot=str(results[0].snapshots[-1]))
    assert [(r.phase, r.task) for r in other] == [("finetune", "point_mass_hard")]


def test_bad_input_raises_one_clear_error_and_writes_nothing(tmp_path):
    with pytest.raises(ConfigError, match="unknown config key bogus"):
        protorl.train(tiny(tmp_path / "a"), bogus=1)
    with pytest.raises(ConfigError, match="run_dir is required"):
        protorl.pretrain(dataclasses.replace(Config(), agent=ProtoConfig()))
    with pytest.raises(ConfigError, match="agent.knn_k"):
        protorl.pretrain(tiny(tmp_path / "b", agent=tiny_config("proto", knn_k=0)))
    with pytest.raises(SnapshotError, match="no such file"):
        protorl.finetune(tiny(tmp_path / "c"), snapshot=str(tmp_path / "missing.pt"))
    assert not any(tmp_path.iterdir())
