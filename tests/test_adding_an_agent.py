"""Adding an agent touches its module, its YAML and the registry only (README, "Adding an agent").

tests/toy_agent/ holds exactly those three pieces for a toy agent, outside the package: protorl's own files are
not touched. The toy agent then pre-trains, writes a snapshot and fine-tunes through the real commands.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from protorl.snapshot import load_snapshot
from tests.runs import STATES_SHARED, TIMEOUT_S, assert_ok, assert_user_error, environment, read_csv

TOY = Path(__file__).parent / "toy_agent"


def run_toy(command: str, *overrides: str, run_dir: Path) -> subprocess.CompletedProcess:
    """protorl-<command> with the toy agent registered and its YAML on Hydra's search path."""
    return subprocess.run([sys.executable, str(TOY / "toy.py"), command, *STATES_SHARED, "agent=toy",
                           f"hydra.searchpath=[file://{TOY / 'conf'}]", *overrides, f"hydra.run.dir={run_dir}"],
                          capture_output=True, text=True, timeout=TIMEOUT_S, env=environment(), cwd=run_dir.parent,
                          check=False)


def test_a_toy_agent_pretrains_and_finetunes_through_the_commands(tmp_path):
    run_dir = tmp_path / "toy"
    assert_ok(run_toy("train", "pretrain_frames=1000", "finetune_frames=1000", "agent.reward_scale=2.0",
                      run_dir=run_dir))
    header, rows = read_csv(run_dir / "pretrain" / "train.csv")
    assert "intr_reward_mean" in header and float(rows[-1]["intr_reward_mean"]) > 0  # its declared metric
    snapshot = load_snapshot(run_dir / "pretrain" / "snapshots" / "snapshot_1000.pt")
    assert snapshot["config"]["agent"]["name"] == "toy" and snapshot["config"]["agent"]["reward_scale"] == 2.0
    assert all(torch.is_tensor(v) for v in snapshot["agent"]["encoder"].values())
    _, evals = read_csv(run_dir / "finetune" / "eval.csv")
    assert [r["frames"] for r in evals] == ["0", "1000"]


def test_the_toy_agents_config_is_checked_like_any_other(tmp_path):
    result = run_toy("pretrain", "pretrain_frames=1000", "agent.reward_scale=-1", run_dir=tmp_path / "bad")
    assert_user_error(result, "agent.reward_scale=-1")
    result = run_toy("pretrain", "pretrain_frames=1000", "agent.num_prototypes=8", run_dir=tmp_path / "other")
    assert_user_error(result, "num_prototypes")  # Proto-RL's keys are not the toy agent's
    assert not (tmp_path / "bad").exists() and not (tmp_path / "other").exists()
