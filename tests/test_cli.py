"""End to end through the console entry points (subprocesses, real MuJoCo rendering, tiny sizes).

Every run uses `tests.runs.TINY`: 32x32 frames, action repeat 8 (125 agent steps per 1000-frame point_mass
episode), a tiny agent and one intra-op thread, so that each subprocess takes seconds.
"""

from __future__ import annotations

import subprocess

import pytest
import torch
from omegaconf import OmegaConf

from protorl.agents import ProtoAgent
from protorl.logs.logger import EPISODE_COLUMNS, EVAL_COLUMNS
from protorl.storage.snapshots import load_snapshot
from tests.runs import (
    TIMEOUT_S,
    TINY,
    assert_finite_floats,
    assert_ok,
    assert_user_error,
    command_line,
    environment,
    read_csv,
    read_rows,
    run,
)

pytestmark = pytest.mark.slow  # the slow tier: this module runs protorl's commands or real training

TRAIN_COLUMNS = [*EPISODE_COLUMNS, *ProtoAgent.metric_names()]  # the episode, then every metric Proto-RL logs


@pytest.fixture(scope="module")
def pretrain_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("cli") / "pretrain_run"
    result = run("pretrain", *TINY, "task=point_mass_easy", "pretrain_frames=1000", "snapshots.at_frames=[496]",
                 run_dir=run_dir)
    return run_dir, result


@pytest.fixture(scope="module")
def finetune_run(pretrain_run, tmp_path_factory):
    pretrain_dir, pretrain_result = pretrain_run
    assert_ok(pretrain_result)
    snapshot = pretrain_dir / "pretrain" / "snapshots" / "snapshot_1000.pt"
    run_dir = tmp_path_factory.mktemp("cli") / "finetune_run"
    result = run("finetune", *TINY, "task=point_mass_hard", f"snapshot={snapshot}", "finetune_frames=1000",
                 run_dir=run_dir)
    return run_dir, result, snapshot


def test_pretrain_end_to_end(pretrain_run):
    run_dir, result = pretrain_run
    assert_ok(result)
    phase_dir = run_dir / "pretrain"
    snapshots = sorted(p.name for p in (phase_dir / "snapshots").iterdir())
    assert snapshots == ["snapshot_1000.pt", "snapshot_496.pt"]
    payload = load_snapshot(phase_dir / "snapshots" / "snapshot_1000.pt")
    assert payload["frames"] == 1000
    assert payload["env_spec"] == {"domain": "point_mass", "obs_type": "pixels", "obs_shape": [9, 32, 32],
                                   "action_shape": [2], "action_repeat": 8}
    assert payload["config"]["agent"]["num_prototypes"] == 16
    assert payload["agent"]["head"]["prototypes"].shape == (16, 16)
    assert payload["agent"]["queue"]["items"].shape == (32, 16)
    assert load_snapshot(phase_dir / "snapshots" / "snapshot_496.pt")["frames"] == 496

    header, rows = read_csv(phase_dir / "train.csv")
    assert header == TRAIN_COLUMNS
    assert len(rows) == 1  # one 1000-frame episode
    row = rows[0]
    assert (row["frames"], row["agent_steps"], row["episode"], row["episode_length_frames"]) == (
        "1000", "125", "1", "1000")
    assert_finite_floats(row, ["episode_reward", "fps", "total_time_s", "repr_loss", "critic_loss", "critic_q",
                               "actor_loss", "alpha", "actor_entropy", "intr_reward_mean", "intr_reward_std"])
    assert row["extr_reward_mean"] == ""  # the task reward is hidden during pre-training
    header, rows = read_csv(phase_dir / "eval.csv")
    assert header == EVAL_COLUMNS and rows == []  # no evaluation during pre-training by default

    config = OmegaConf.load(run_dir / "config.yaml")
    assert config.task == "point_mass_easy" and config.pretrain_frames == 1000
    assert config.agent.num_prototypes == 16 and config.env.image_size == 32
    assert config.run_dir == str(run_dir)

    assert (run_dir / "curves.png").stat().st_size > 0
    assert "protorl run summary" in result.stdout
    assert "pretrain" in result.stdout and "point_mass_easy" in result.stdout
    assert str(phase_dir / "snapshots" / "snapshot_1000.pt") in result.stdout
    assert "1000 frames" in result.stdout


def test_finetune_end_to_end(finetune_run):
    run_dir, result, snapshot = finetune_run
    assert_ok(result)
    phase_dir = run_dir / "finetune"
    assert not (phase_dir / "snapshots").exists()
    header, rows = read_csv(phase_dir / "train.csv")
    assert header == TRAIN_COLUMNS and len(rows) == 1
    row = rows[0]
    assert_finite_floats(row, ["episode_reward", "critic_loss", "actor_loss", "alpha", "intr_reward_mean",
                               "extr_reward_mean"])
    assert row["repr_loss"] == ""  # the representation is frozen: no L_SSL
    header, rows = read_csv(phase_dir / "eval.csv")
    assert header == EVAL_COLUMNS
    assert [r["frames"] for r in rows] == ["0", "1000"]
    for r in rows:
        assert r["episodes"] == "1"
        assert_finite_floats(r, ["agent_steps", "episode_reward", "episode_reward_std"])

    config = OmegaConf.load(run_dir / "config.yaml")
    assert config.task == "point_mass_hard" and config.snapshot == str(snapshot)
    assert (run_dir / "curves.png").exists()
    assert "finetune" in result.stdout and "point_mass_hard" in result.stdout
    assert "eval episode reward by frames: 0:" in result.stdout


def test_eval_csv_columns_are_filled(finetune_run):
    run_dir, result, _ = finetune_run
    assert_ok(result)
    _, rows = read_csv(run_dir / "finetune" / "eval.csv")
    assert rows
    for row in rows:
        assert_finite_floats(row, EVAL_COLUMNS)


def test_train_runs_both_phases(tmp_path):
    run_dir = tmp_path / "train_run"
    result = run("train", "preset=small", *TINY, "task=point_mass_easy", "pretrain_frames=1000",
                 "finetune_frames=1000", "snapshots.at_frames=[496]", "training.update_every_steps=1",
                 run_dir=run_dir)
    assert_ok(result)
    assert (run_dir / "pretrain" / "snapshots" / "snapshot_1000.pt").is_file()
    for phase in ("pretrain", "finetune"):
        header, rows = read_csv(run_dir / phase / "train.csv")
        assert header == TRAIN_COLUMNS and len(rows) == 1, phase
    _, evals = read_csv(run_dir / "finetune" / "eval.csv")
    assert [r["frames"] for r in evals] == ["0", "1000"]
    assert (run_dir / "curves.png").stat().st_size > 0
    assert (run_dir / "config.yaml").is_file()
    summary = result.stdout[result.stdout.index("protorl run summary"):]
    assert summary.index("pretrain") < summary.index("finetune")
    assert str(run_dir / "curves.png") in summary


def test_finetune_on_other_domain_is_refused(pretrain_run, tmp_path):
    pretrain_dir, pretrain_result = pretrain_run
    assert_ok(pretrain_result)
    snapshot = pretrain_dir / "pretrain" / "snapshots" / "snapshot_1000.pt"
    result = run("finetune", *TINY, "task=walker_walk", f"snapshot={snapshot}", "finetune_frames=1000",
                 run_dir=tmp_path / "walker")
    assert_user_error(result, str(snapshot), "domain", "point_mass", "walker")
    assert not (tmp_path / "walker").exists()  # refused before Hydra creates the run directory


def test_finetune_missing_snapshot(tmp_path):
    missing = tmp_path / "no_such_snapshot.pt"
    result = run("finetune", *TINY, "task=point_mass_hard", f"snapshot={missing}", run_dir=tmp_path / "run")
    assert_user_error(result, str(missing))
    assert not (tmp_path / "run").exists()
    assert result.stdout == ""  # nothing but the error: no library's start-up chatter on stdout either


def test_unknown_task_exits_2_pointing_to_the_task_list(tmp_path):
    result = run("pretrain", "task=not_a_task", run_dir=tmp_path / "run")
    line = assert_user_error(result, "unknown task 'not_a_task'", "protorl-tasks", "gym:<id>")
    assert "did you mean" not in line  # nothing is close to it
    assert not (tmp_path / "run").exists()  # refused before anything is written


@pytest.mark.parametrize(("override", "meant"), [
    ("task=walker_rn", "did you mean walker_run?"),  # a task
    ("agent=protoo", "did you mean proto?"),  # a config group's option: Hydra's error
    ("preset=smal", "did you mean small?"),
])
def test_a_mistyped_name_gets_a_did_you_mean(tmp_path, override, meant):
    result = run("train", "preset=small", override, run_dir=tmp_path / "run")
    assert_user_error(result, override.split("=")[1], meant)
    assert not (tmp_path / "run").exists()


def test_the_renamed_agent_config_names_its_new_name(tmp_path):
    result = run("train", "preset=small", "agent=proto_paper", run_dir=tmp_path / "run")
    assert_user_error(result, "agent=proto_paper is now agent=proto", "proto_variant")
    assert not (tmp_path / "run").exists()


def test_the_renamed_experiment_names_both_fine_tunings(tmp_path):
    result = run("finetune", "-m", "experiment=quadruped_urlb_finetune_2m", "pretrain_sweep=x",
                 run_dir=tmp_path / "run")
    assert_user_error(result, "experiment=quadruped_urlb_finetune_2m is now "
                      "experiment=quadruped_urlb_departures_finetune_2m", "quadruped_urlb_paper_finetune_2m")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["train", "pretrain", "finetune"])
def test_help_says_what_the_command_does_and_the_keys_to_change_first(command, tmp_path):
    result = run(command, "--help", run_dir=tmp_path / "run")
    assert_ok(result)
    text = result.stdout
    assert text.startswith(f"protorl-{command}: ") and "the keys to change first:" in text
    assert "preset=" in text and "task=TASK" in text and "commands.md" in text
    assert "agent_schema" not in text and "agent_scale" not in text  # internal config groups
    assert "proto_variant" in text and "fig4_small" in text  # the groups' options, read from the configs
    assert not (tmp_path / "run").exists()


def test_invalid_value_exits_2(tmp_path):
    result = run("pretrain", "agent.batch_size=0", run_dir=tmp_path / "run")
    assert_user_error(result, "agent.batch_size", "positive")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("sweep", [False, True])
def test_run_dir_on_the_command_line_is_refused_naming_hydras_key(tmp_path, sweep):
    """Hydra's output directory would silently replace it: the run would write somewhere the user did not ask."""
    asked = tmp_path / "asked"
    result = run("pretrain", *(("-m", "seed=1,2") if sweep else ()), f"run_dir={asked}", run_dir=tmp_path / "run")
    if sweep:
        assert result.returncode == 2 and "2 of the sweep's 2 jobs would stop" in result.stderr, result.stderr
        assert result.stderr.count("run_dir is Hydra's output directory") == 2
    else:
        assert_user_error(result, "run_dir is Hydra's output directory", "hydra.run.dir=PATH")
    assert not asked.exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize(("sweep", "own_config"), [(False, False), (True, False), (False, True)])
def test_a_job_name_or_config_of_ones_own_does_not_change_the_command(tmp_path, sweep, own_config):
    """`hydra.job.name` names the run's directory (base.yaml), and a config of one's own may build on a command's;
    the command stays the one run."""
    overrides = ("-m", "seed=1,2") if sweep else ()
    if own_config:
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / "my_study.yaml").write_text("defaults:\n  - pretrain\n  - _self_\n")
        overrides = ("--config-dir", str(tmp_path / "mine"), "--config-name", "my_study")
    result = run("pretrain", *overrides, "hydra.job.name=my_study", "agent.batch_size=0", run_dir=tmp_path / "run")
    if sweep:  # every job's line under the sweep's
        assert result.returncode == 2 and "2 of the sweep's 2 jobs would stop" in result.stderr, result.stderr
        assert result.stderr.count("invalid config value agent.batch_size=0: expected a positive") == 2
    else:
        assert_user_error(result, "agent.batch_size", "positive")
    assert not (tmp_path / "run").exists()


def test_finetune_without_snapshot_exits_2(tmp_path):
    result = run("finetune", "task=point_mass_hard", run_dir=tmp_path / "run")
    assert_user_error(result, "snapshot")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("override", "fragment"), [
    ("agent.lr=-1", "agent.lr"), ("env.obs=rgb", "env.obs"), ("runtime.device=tpu", "runtime.device"),
    ("agent.discount=2", "discount"), ("checkpoints.keep=0", "checkpoints.keep"), ("pretrain_task=nowhere", "nowhere"),
    ("seed=abc", "seed"),
])
def test_each_invalid_config_class_is_refused_before_any_output(tmp_path, override, fragment):
    result = run("train", override, run_dir=tmp_path / "run")
    assert result.returncode != 0 and fragment in result.stderr + result.stdout, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_task_the_main_jobs_preset_would_ignore_is_refused_before_any_output(tmp_path):
    """The main job's preset names the U-maze's tasks in pretrain_task and finetune_tasks: `protorl-train
    task=walker_run` would run them, not walker_run."""
    result = run("train", "task=walker_run", run_dir=tmp_path / "run")
    assert_user_error(result, "task=walker_run", "pretrain_task=point_mass_maze_explore",
                      "finetune_tasks=[point_mass_maze_reach_top_left]", "preset=small")
    assert not (tmp_path / "run").exists()


def test_unknown_key_is_refused_before_any_output(tmp_path):
    result = run("pretrain", "agent.not_a_key=1", run_dir=tmp_path / "run")
    assert result.returncode != 0 and "not_a_key" in result.stderr + result.stdout
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override", ["foo=1", "+foo=1"])
def test_an_unknown_top_level_key_is_one_line_that_suggests_nothing_refused(tmp_path, override):
    """Hydra's own message for `foo=1` suggests `+foo=1`, which protorl refuses: both get protorl's one line."""
    line = assert_user_error(run("pretrain", override, run_dir=tmp_path / "run"), "unknown config key foo")
    assert "+foo" not in line
    assert not (tmp_path / "run").exists()


def test_diverging_run_stops_with_a_clear_message(tmp_path):
    """A learning rate of 1e30 sends the weights to inf within a few updates: the run must stop, say which
    metric went non-finite, and not write a finished result."""
    run_dir = tmp_path / "nan"
    result = run("pretrain", *TINY, "env.obs=states", "agent.lr=1e30", "pretrain_frames=3000",
                 "checkpoints.every_frames=1000", run_dir=run_dir)
    assert result.returncode == 3, result.stderr
    assert "non-finite" in result.stderr and "protorl: error:" in result.stderr and "Traceback" not in result.stderr
    assert not (run_dir / "pretrain" / "result.json").exists()


def test_finetune_with_other_agent_architecture_is_a_user_error(pretrain_run, tmp_path):
    pretrain_dir, pretrain_result = pretrain_run
    assert_ok(pretrain_result)
    snapshot = pretrain_dir / "pretrain" / "snapshots" / "snapshot_1000.pt"
    result = run("finetune", *TINY, "agent.num_prototypes=32", "task=point_mass_hard",
                 f"snapshot={snapshot}", "finetune_frames=1000", run_dir=tmp_path / "arch")
    assert_user_error(result, str(snapshot), "num_prototypes")


def test_states_pretrain_end_to_end(tmp_path):
    run_dir = tmp_path / "states_run"
    result = run("pretrain", *TINY, "env.obs=states", "task=point_mass_easy", "pretrain_frames=1000",
                 "snapshots.at_frames=[]", run_dir=run_dir)
    assert_ok(result)
    payload = load_snapshot(run_dir / "pretrain" / "snapshots" / "snapshot_1000.pt")
    assert payload["env_spec"]["obs_type"] == "states"
    assert payload["env_spec"]["obs_shape"] == [4]  # point_mass: position (2) + velocity (2)
    assert payload["agent"]["head"]["projector.linear.weight"].shape == (16, 32)  # state_hidden_dim -> proj_dim
    _, rows = read_csv(run_dir / "pretrain" / "train.csv")
    assert len(rows) == 1
    assert_finite_floats(rows[0], ["repr_loss", "critic_loss", "intr_reward_mean"])


def test_same_seed_reproduces_the_run(pretrain_run, tmp_path):
    """A second run with the same seed gives the same logged metrics and bitwise-equal snapshot tensors."""
    first_dir, first = pretrain_run
    assert_ok(first)
    second_dir = tmp_path / "again"
    assert_ok(run("pretrain", *TINY, "task=point_mass_easy", "pretrain_frames=1000", "snapshots.at_frames=[496]",
                  run_dir=second_dir))
    assert read_rows(first_dir / "pretrain" / "train.csv") == read_rows(second_dir / "pretrain" / "train.csv")
    snapshots = [load_snapshot(d / "pretrain" / "snapshots" / "snapshot_1000.pt")["agent"]
                 for d in (first_dir, second_dir)]
    for part in ("encoder", "head", "actor"):
        for name, tensor in snapshots[0][part].items():
            assert torch.equal(tensor, snapshots[1][part][name]), (part, name)


COUNTING = """
import atexit, sys
import protorl.app.plan as plan
counts = {"plan_run": 0, "load_snapshot": 0}
def counted(name, function):
    def call(*args, **kwargs):
        counts[name] += 1
        return function(*args, **kwargs)
    return call
plan.plan_run = counted("plan_run", plan.plan_run)
plan.load_snapshot = counted("load_snapshot", plan.load_snapshot)
atexit.register(lambda: print("counts", counts["plan_run"], counts["load_snapshot"]))
from protorl.app.cli import finetune
sys.argv[0] = "protorl-finetune"
finetune()
"""


def test_a_command_checks_its_config_and_reads_its_snapshot_once(pretrain_run, tmp_path):
    """The plan made before Hydra writes is the one the run runs: one plan, one read of the snapshot."""
    pretrain_dir, pretrain_result = pretrain_run
    assert_ok(pretrain_result)
    snapshot = pretrain_dir / "pretrain" / "snapshots" / "snapshot_1000.pt"
    run_dir = tmp_path / "finetune_once"
    line = command_line("finetune", *TINY, "task=point_mass_hard", f"snapshot={snapshot}", "finetune_frames=1000",
                        run_dir=run_dir)
    result = subprocess.run([line[0], "-c", COUNTING, *line[3:]], capture_output=True, text=True,
                            timeout=TIMEOUT_S, env=environment(), cwd=tmp_path)
    assert_ok(result)
    assert "counts 1 1" in result.stdout.splitlines()[-1], result.stdout[-2000:]
