"""Optional Weights & Biases tracking: off by default, a clear error without the package, and the same
metrics as the CSV logs (W&B's offline mode: nothing leaves the machine)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from protorl.app.plan import validate
from protorl.config import Config, ConfigError, LoggingConfig
from protorl.logs.logger import Logger
from tests.runs import TINY, assert_ok, run

pytestmark = pytest.mark.slow  # the slow tier: this module runs protorl's commands or real training

PRESETS = sorted(p.stem for p in (Path(__file__).parents[1] / "protorl" / "conf" / "preset").glob("*.yaml"))


def test_wandb_is_off_by_default(tmp_path, monkeypatch):
    """Without `logging.wandb=true` no W&B run starts: the schema, every command's composed config under every preset
    say false, and a configuration left at the default neither imports wandb nor writes the run id file."""
    from hydra import compose, initialize_config_module

    from protorl.app.cli import register_configs

    register_configs()  # the schema the commands' configs build on
    from protorl.logs.tracking import ID_FILE, phase_tracker, start_run

    assert Config().logging.wandb is False
    assert PRESETS
    with initialize_config_module(config_module="protorl.conf", version_base="1.3"):
        for command in ("pretrain", "finetune", "train"):
            for preset in PRESETS:
                composed = compose(config_name=command, overrides=[f"preset={preset}"])
                assert composed.logging.wandb is False, (command, preset)
    monkeypatch.setitem(sys.modules, "wandb", None)  # any `import wandb` from here on raises ImportError
    cfg = Config(run_dir=str(tmp_path))
    validate(cfg, "train")
    assert start_run(cfg.logging, tmp_path, {}) is None and phase_tracker(None, "pretrain") is None
    assert not (tmp_path / ID_FILE).exists()


def test_wandb_without_the_package_is_refused_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` sees when it is not installed
    with pytest.raises(ConfigError, match=r"logging\.wandb.*pip install"):
        validate(Config(logging=LoggingConfig(wandb=True), run_dir="."), "train")


def test_phase_metrics_reach_the_wandb_run(tmp_path, monkeypatch):
    from protorl.logs.tracking import PhaseTracker

    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb_run = wandb.init(mode="offline", dir=str(tmp_path), project="protorl-test")
    try:
        logger = Logger(tmp_path / "finetune", ("critic_loss",), tensorboard=False,
                        tracker=PhaseTracker(wandb_run, "finetune"))
        logger.accumulate({"critic_loss": 2.0})
        logger.accumulate({"critic_loss": 4.0})
        logger.log_train({"frames": 1000, "episode_reward": 12.5})
        logger.log_eval({"frames": 2000, "episode_reward": 30.0})
        logger.log_scalars({"frames": 2000, "coverage/entropy": 0.5})
        logger.close()
        summary = wandb_run.summary
        assert summary["finetune/train/critic_loss"] == 3.0  # the average the CSV row gets
        assert summary["finetune/train/episode_reward"] == 12.5
        assert summary["finetune/eval/episode_reward"] == 30.0
        assert summary["finetune/coverage/entropy"] == 0.5
        assert summary["finetune/frames"] == 2000
    finally:
        wandb_run.finish()


def test_a_run_logs_offline_and_a_rerun_continues_the_same_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    overrides = ["preset=small", *TINY, "env.obs=states", "pretrain_frames=1000", "finetune_frames=1000",
                 "analyses.every_frames=null", "logging.wandb=true"]
    assert_ok(run("train", *overrides, run_dir=run_dir))
    run_id = (run_dir / "wandb_id.txt").read_text().strip()
    assert [p.name.rsplit("-", 1)[1] for p in (run_dir / "wandb").glob("offline-run-*")] == [run_id]
    assert_ok(run("train", *overrides, run_dir=run_dir))  # both phases complete: nothing re-runs
    assert (run_dir / "wandb_id.txt").read_text().strip() == run_id
    assert {p.name.rsplit("-", 1)[1] for p in (run_dir / "wandb").glob("offline-run-*")} == {run_id}
