"""The phases a command runs: what the run writes and what its memory check estimates both come from this plan."""

from __future__ import annotations

import pytest

from protorl.agents import agent_config
from protorl.app.phases import planned_phases
from protorl.config import AgentConfig, Config

TASKS = ["walker_stand", "walker_walk"]


def plan(agent: str, command: str, snapshot_given: bool = False, **fields) -> list[tuple[str, str, str]]:
    cfg = Config(agent=agent_config(AgentConfig(name=agent)), task="walker_stand", **fields)
    return [(p.kind, p.task, p.dir_name) for p in planned_phases(cfg, command, snapshot_given)]


def test_train_pretrains_then_finetunes_each_task_then_compares_without_pretraining():
    assert plan("proto", "train", finetune_tasks=TASKS, compare_without_pretraining=True) == [
        ("pretrain", "walker_stand", "pretrain"),
        ("finetune", "walker_stand", "finetune_walker_stand"), ("finetune", "walker_walk", "finetune_walker_walk"),
        ("scratch", "walker_stand", "finetune_scratch_walker_stand"),
        ("scratch", "walker_walk", "finetune_scratch_walker_walk"),
    ]


def test_without_pretraining_the_downstream_phase_learns_everything_in_its_usual_folder():
    assert plan("proto", "train", pretrain_frames=0, compare_without_pretraining=True) == [
        ("scratch", "walker_stand", "finetune")]
    assert plan("drq", "train") == [("scratch", "walker_stand", "finetune")]
    assert plan("proto", "finetune") == [("scratch", "walker_stand", "finetune")]


@pytest.mark.parametrize("agent", ["random", "icm", "apt"])
def test_the_comparison_is_skipped_for_agents_without_a_mode_without_pretraining(agent):
    assert plan(agent, "finetune", snapshot_given=True, compare_without_pretraining=True) == [
        ("finetune", "walker_stand", "finetune")]


def test_pretrain_runs_one_phase_on_the_pretraining_task():
    assert plan("proto", "pretrain", pretrain_task="walker_run", finetune_tasks=TASKS) == [
        ("pretrain", "walker_run", "pretrain")]
    assert [kind for kind, _, _ in plan("proto", "finetune", snapshot_given=True)] == ["finetune"]
