"""The phases a command runs: what the run writes and what its memory check estimates both come from this plan."""

from __future__ import annotations

import pytest

from protorl.agents import agent_config
from protorl.config import AgentConfig, Config
from protorl.training.phases import planned_phases

TASKS = ["walker_stand", "walker_walk"]


def plan(agent: str, command: str, snapshot_given: bool = False, **fields) -> list[tuple[str, str, str]]:
    cfg = Config(agent=agent_config(AgentConfig(name=agent)), task="walker_stand", **fields)
    return [(p.mode, p.task, p.dir_name) for p in planned_phases(cfg, command, snapshot_given)]


def test_train_pretrains_then_finetunes_each_task_then_compares_without_pretraining():
    assert plan("proto", "train", finetune_tasks=TASKS, compare_without_pretraining=True) == [
        ("pretrain", "walker_stand", "pretrain"),
        ("frozen", "walker_stand", "finetune_walker_stand"), ("frozen", "walker_walk", "finetune_walker_walk"),
        ("online", "walker_stand", "finetune_scratch_walker_stand"),
        ("online", "walker_walk", "finetune_scratch_walker_walk"),
    ]


def test_without_pretraining_the_downstream_phase_learns_everything_in_its_usual_folder():
    assert plan("proto", "train", pretrain_frames=0, compare_without_pretraining=True) == [
        ("online", "walker_stand", "finetune")]
    assert plan("drq", "train") == [("online", "walker_stand", "finetune")]
    assert plan("proto", "finetune") == [("online", "walker_stand", "finetune")]


@pytest.mark.parametrize("agent", ["random", "icm", "apt"])
def test_the_comparison_is_skipped_for_agents_without_a_mode_without_pretraining(agent):
    assert plan(agent, "finetune", snapshot_given=True, compare_without_pretraining=True) == [
        ("frozen", "walker_stand", "finetune")]


def test_pretrain_runs_one_phase_on_the_pretraining_task():
    assert plan("proto", "pretrain", pretrain_task="walker_run", finetune_tasks=TASKS) == [
        ("pretrain", "walker_run", "pretrain")]
    assert [mode for mode, _, _ in plan("proto", "finetune", snapshot_given=True)] == ["frozen"]


def test_the_plan_of_a_run_holds_its_checked_config_and_the_phases_the_trainer_runs(tmp_path):
    """`plan_run` is what every way into a run calls: the phases it returns are the ones `run_plan` runs, each
    trainer's agent made in the phase's mode, and the checked config is the one the run directory records."""
    from protorl.app.commands import run_plan
    from protorl.app.plan import plan_run
    from protorl.training import loop
    from tests.agents import tiny

    plan = plan_run(tiny(tmp_path / "run", compare_without_pretraining=True), "train")
    assert [(p.mode, p.dir_name, p.phase) for p in plan.phases] == [
        ("pretrain", "pretrain", "pretrain"), ("frozen", "finetune", "finetune"),
        ("online", "finetune_scratch_point_mass_easy", "finetune")]
    assert plan.pretrained is None
    modes, make_agent = [], loop.make_agent

    def recording(cfg, obs_type, obs_shape, action_shape, device, mode):
        modes.append(mode)
        return make_agent(cfg, obs_type, obs_shape, action_shape, device, mode)

    loop.make_agent = recording
    try:
        results = run_plan(plan)
    finally:
        loop.make_agent = make_agent
    assert modes == [p.mode for p in plan.phases]
    assert [r.out_dir.name for r in results] == [p.dir_name for p in plan.phases]
    assert [r.frames for r in results] == [p.frames for p in plan.phases]


def test_a_trainer_refuses_a_phase_its_snapshot_does_not_fit(tmp_path):
    from protorl.training import Trainer, phase_of
    from tests.agents import tiny

    cfg = tiny(tmp_path)
    with pytest.raises(ValueError, match="a phase in mode frozen needs pre-trained snapshot"):
        Trainer(cfg, phase_of(cfg, "frozen"), tmp_path / "finetune")
    with pytest.raises(ValueError, match="a phase in mode pretrain takes no pre-trained snapshot"):
        Trainer(cfg, phase_of(cfg, "pretrain"), tmp_path / "pretrain", pretrained={"agent": {}})
