"""Run configuration: the paper's defaults (table 1, appendix C) and start-up validation."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import protorl
from protorl.agents.proto.agent import ProtoConfig
from protorl.app.plan import check_named_task, validate
from protorl.config import (
    GROUPS,
    RENAMED,
    AgentConfig,
    Config,
    ConfigError,
    grouped,
    renamed_message,
    rerun_free_keys,
)
from tests.agents import config_of, update
from tests.runs import TIMEOUT_S, assert_user_error, environment

ROOT = Path(__file__).resolve().parents[1]


def checkout_first() -> dict[str, str]:
    """The tests' environment with this checkout first on the import path (run from another directory)."""
    return {**environment(), "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


# -- validation --------------------------------------------------------------------------------------


def make_config(agent: dict | None = None, **fields) -> Config:
    """The paper's Config with Proto-RL's `agent` keys changed, and `fields` (a group as a dict of some of its
    keys: `env={"obs": "states"}`)."""
    return config_of({"agent": ProtoConfig(**(agent or {}))}, **fields)


def value_at(node, key: str):
    """A dotted key's value in a Config or a composed config: `replay.capacity` is `node.replay.capacity`."""
    for part in key.split("."):
        node = getattr(node, part)
    return node


def test_defaults_are_valid():
    validate(make_config(), "pretrain")
    validate(make_config(snapshot="some/snapshot.pt"), "finetune")
    validate(make_config(env={"obs": "states", "image_size": 84}), "pretrain")
    validate(make_config(task="walker_walk", pretrain_task="walker_run", runtime={"device": "cpu"}), "pretrain")


@pytest.mark.parametrize(
    ("config", "phase", "key"),
    [
        (make_config({"batch_size": 0}), "pretrain", "agent.batch_size"),
        (make_config({"discount": 1.5}), "pretrain", "agent.discount"),
        (make_config({"discount": 0.0}), "pretrain", "agent.discount"),
        (make_config(env={"obs": "rgb"}), "pretrain", "env.obs"),
        (make_config({"intr_coef": -0.1}), "finetune", "agent.intr_coef"),
        (make_config(), "finetune", "snapshot"),
        (make_config(snapshot=""), "finetune", "snapshot"),
        (make_config({"lr": 0.0}), "pretrain", "agent.lr"),
        (make_config({"encoder_target_tau": 0.0}), "pretrain", "agent.encoder_target_tau"),
        (make_config({"critic_target_tau": 1.01}), "pretrain", "agent.critic_target_tau"),
        (make_config({"num_prototypes": -4}), "pretrain", "agent.num_prototypes"),
        (make_config({"log_std_min": 2.0, "log_std_max": -10.0}), "pretrain", "agent.log_std_min"),
        (make_config({"knn_k": 9, "num_prototypes": 2, "candidates_per_prototype": 4}), "pretrain",
         "agent.knn_k"),
        (make_config(training={"seed_transitions": -1}), "pretrain", "training.seed_transitions"),
        (make_config(pretrain_frames=0), "pretrain", "pretrain_frames"),
        (make_config(replay={"capacity": 0}), "pretrain", "replay.capacity"),
        (make_config({"batch_size": 32}, replay={"capacity": 10}), "pretrain", "agent.batch_size 32"),
        (make_config(snapshots={"at_frames": [1000, 0]}), "pretrain", "snapshots.at_frames"),
        (make_config(runtime={"threads": 0}), "pretrain", "runtime.threads"),
        (make_config(env={"image_size": 8}), "pretrain", "env.image_size"),
        (make_config(env={"frame_stack": 0}), "pretrain", "env.frame_stack"),
        (make_config(env={"action_repeat": 0}), "pretrain", "env.action_repeat"),
        (make_config(runtime={"device": "tpu"}), "pretrain", "runtime.device"),
        (make_config(runtime={"device": "cuda:"}), "pretrain", "runtime.device"),
        (make_config(runtime={"device": "cpu:0"}), "pretrain", "runtime.device"),
        (make_config(analyses={"coverage_bins": 1}), "pretrain", "analyses.coverage_bins"),
        (make_config(checkpoints={"keep": 0}), "pretrain", "checkpoints.keep"),
        (make_config(evaluation={"episodes": -1}), "pretrain", "evaluation.episodes"),
        (make_config(evaluation={"episodes": 0}), "finetune", "evaluation.episodes"),
        (make_config(logging={"every_episodes": 0}), "pretrain", "logging.every_episodes"),
        (make_config({"anti_collapse": "whiten"}), "pretrain", "agent.anti_collapse"),
        (make_config({"reward_space": "cosine"}), "pretrain", "agent.reward_space"),
        (make_config({"ssl_update_every": 0}), "pretrain", "agent.ssl_update_every"),
        (make_config({"anti_collapse": "batchnorm", "batch_size": 1}), "pretrain", "agent.batch_size"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_invalid_values_are_rejected_naming_the_key(config, phase, key):
    with pytest.raises(ConfigError) as info:
        validate(config, phase)
    assert key in str(info.value)


@pytest.mark.parametrize(("config", "key"), [
    (make_config({"intr_coef": float("nan")}), "agent.intr_coef"),
    (make_config(runtime={"max_hours": float("inf")}), "runtime.max_hours"),
])
def test_a_float_that_is_not_finite_is_refused_naming_the_key(config, key):
    with pytest.raises(ConfigError, match=rf"invalid config value {key}=(nan|inf): expected a finite number"):
        validate(config, "finetune")


@pytest.mark.parametrize(("fields", "key"), [
    ({"finetune_tasks": [{"task": "walker_run"}]}, "finetune_tasks"),
    ({"snapshots": {"at_frames": [[1000]]}}, "snapshots.at_frames"),
])
def test_a_list_of_lists_or_dicts_is_refused_naming_the_key(tmp_path, fields, key):
    """OmegaConf lets a typed list hold lists and dicts: the plan refuses them in one line, before anything runs."""
    with pytest.raises(ConfigError, match=rf"invalid config value {key}=.*: expected a list of values"):
        protorl.train(run_dir=str(tmp_path / "run"), **fields)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_device_without_cuda(device, monkeypatch):
    """A CUDA device is refused where CUDA is not available, and accepted where it is (on any machine: torch's
    answer is patched both ways)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError) as info:
        validate(make_config(runtime={"device": device}), "pretrain")
    assert str(info.value) == (f"invalid config value runtime.device={device!r}: expected 'auto' or 'cpu': "
                               "CUDA is not available on this machine")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    validate(make_config(runtime={"device": device}), "pretrain")


def test_a_cuda_index_the_machine_does_not_have_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="'cuda:N' with N below 1"):
        validate(make_config(runtime={"device": "cuda:3"}), "pretrain")


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("field", ["task", "pretrain_task"])
def test_unknown_task_points_to_the_task_list(field):
    """An unknown task names itself and where the tasks are listed, and suggests the closest one when one is close,
    instead of listing every task."""
    with pytest.raises(ValueError) as info:
        validate(make_config(**{field: "not_a_task"}), "pretrain")
    message = str(info.value)
    assert "not_a_task" in message and "protorl-tasks" in message and "walker_walk" not in message
    with pytest.raises(ValueError) as info:
        validate(make_config(**{field: "walker_wakl"}), "pretrain")
    assert "did you mean walker_walk" in str(info.value)


def test_every_accepted_knn_k_survives_the_first_update(make_cfg, replay):
    from protorl.agents import ProtoAgent

    accepted = []
    for knn_k in range(1, 2 * 4 + 1):  # up to the full queue M * T
        agent_cfg = make_cfg(num_prototypes=2, candidates_per_prototype=4, knn_k=knn_k)
        try:
            validate(Config(agent=agent_cfg), "pretrain")
        except ConfigError as error:
            assert "agent.knn_k" in str(error)
            continue
        accepted.append(knn_k)
        agent = ProtoAgent("pixels", (9, 32, 32), (2,), agent_cfg, torch.device("cpu"), "pretrain")
        update(agent, replay, 0)
    assert accepted == [1, 2]


# -- the paper's table -------------------------------------------------------------------------------

PAPER_AGENT = {
    "lr": 1e-4, "batch_size": 512, "discount": 0.99, "critic_target_tau": 0.01, "encoder_target_tau": 0.05,
    "actor_update_every": 2, "critic_target_update_every": 2, "encoder_target_update_every": 2,
    "init_temperature": 0.1, "log_std_min": -10.0, "log_std_max": 2.0, "num_prototypes": 512,
    "candidates_per_prototype": 4, "proj_dim": 128, "temperature": 0.1, "knn_k": 3, "intr_coef": 0.2,
    "feature_dim": 50, "pred_hidden_dim": 512, "sinkhorn_iters": 3, "augment_pad": 4,
    # the published algorithm: SSL every update, a linear projector, reward after enqueueing, on the sphere
    "ssl_update_every": 1, "anti_collapse": "none", "reward_before_enqueue": False, "reward_space": "sphere",
}
# the departures of docs/fidelity.md
VARIANT = {"anti_collapse": "center", "reward_before_enqueue": True, "reward_space": "raw"}
PAPER_RUN = {  # dotted keys
    "replay.capacity": 100_000, "training.seed_transitions": 1000, "env.action_repeat": 2, "env.frame_stack": 3,
    "env.image_size": 84, "pretrain_frames": 500_000, "finetune_frames": 500_000, "evaluation.every_frames": 10_000,
    "evaluation.episodes": 10, "snapshots.at_frames": [100_000, 200_000, 500_000, 1_000_000], "env.obs": "pixels",
    "training.update_every_steps": 1,
}


def test_schema_defaults_match_paper_table():
    config = Config(agent=ProtoConfig())
    for key, value in PAPER_AGENT.items():
        assert getattr(config.agent, key) == value, key
        assert type(getattr(config.agent, key)) is type(value), key
    for key, value in PAPER_RUN.items():
        assert value_at(config, key) == value, key


def test_configs_do_not_share_mutable_defaults():
    """Every mutable default (lists, the groups, the nested AgentConfig, and their own mutable fields) is a fresh
    object per Config, so changing one run's configuration cannot change another's."""
    immutable = (str, int, float, bool, type(None), tuple, frozenset)

    def mutable_fields(node, path: str):
        for item in dataclasses.fields(node):
            value = getattr(node, item.name)
            if not isinstance(value, immutable):
                yield f"{path}{item.name}", value
                if dataclasses.is_dataclass(value):
                    yield from mutable_fields(value, f"{path}{item.name}.")

    first, second = dict(mutable_fields(Config(), "")), dict(mutable_fields(Config(), ""))
    assert {"snapshots.at_frames", "finetune_tasks", "agent", *GROUPS} <= set(first)
    for key, value in first.items():
        assert value is not second[key], key
    changed = Config()
    changed.snapshots.at_frames.append(1)
    changed.finetune_tasks.append("walker_walk")
    changed.replay.capacity = 5
    changed.agent.lr = 1.0
    assert Config().snapshots.at_frames == PAPER_RUN["snapshots.at_frames"]
    assert Config().replay.capacity == PAPER_RUN["replay.capacity"]
    assert Config().finetune_tasks == [] and Config().agent.lr == PAPER_AGENT["lr"]


def test_agent_configs_are_plain_dataclasses():
    """Proto-RL's config holds every value of the paper's table; the shared part is the base class's."""
    assert {f.name for f in dataclasses.fields(ProtoConfig)} >= set(PAPER_AGENT)
    assert issubclass(ProtoConfig, AgentConfig) and "num_prototypes" not in {f.name for f in
                                                                             dataclasses.fields(AgentConfig)}


@pytest.mark.parametrize(("config_name", "paper_scale"), [("pretrain", True), ("finetune", True), ("train", False)])
def test_composed_cli_configs(config_name, paper_scale):
    """The YAML files: pretrain/finetune default to the paper preset, train to the main job (preset=demo)."""
    from hydra import compose, initialize_config_module

    from protorl.app.cli import register_configs

    register_configs()  # the schema the commands' configs build on

    with initialize_config_module(config_module="protorl.conf", version_base="1.3"):
        cfg = compose(config_name=config_name)
    if paper_scale:
        for key, value in PAPER_RUN.items():
            assert value_at(cfg, key) == value, key
        for key, value in PAPER_AGENT.items():
            assert cfg.agent[key] == value, key
        assert cfg.task == "point_mass_easy"
    else:
        assert (cfg.task, cfg.env.obs) == ("point_mass_maze_reach_top_left", "states")
        assert cfg.runtime.threads == 1  # the main job on one thread: a busy CPU's threads wait on each other
        assert cfg.pretrain_frames < PAPER_RUN["pretrain_frames"] and cfg.agent.batch_size < 512
        # the small preset's departures; the remaining hyper-parameters stay the paper's
        for key, value in PAPER_AGENT.items():
            if key not in ("batch_size", *VARIANT):
                assert cfg.agent[key] == value, key
        for key, value in VARIANT.items():
            assert cfg.agent[key] == value, key


@pytest.mark.parametrize("preset", ["small", "demo", "paper"])
def test_proto_is_the_published_algorithm_and_proto_variant_the_working_variant_under_every_preset(preset):
    """agent=proto and agent=proto_variant name one algorithm each whatever the preset; the small and demo presets
    choose the variant, the paper preset the published algorithm."""
    from hydra import compose, initialize_config_module

    from protorl.app.cli import register_configs

    register_configs()  # the schema the commands' configs build on
    with initialize_config_module(config_module="protorl.conf", version_base="1.3"):
        agents = {name: compose(config_name="train", overrides=[f"preset={preset}", f"agent={name}"]).agent
                  for name in ("proto", "proto_variant")}
        default = compose(config_name="train", overrides=[f"preset={preset}"]).agent
    for key in VARIANT:
        assert agents["proto_variant"][key] == VARIANT[key], key
        assert agents["proto"][key] == PAPER_AGENT[key], key
    assert agents["proto"].actor_anchor_coef == 0  # no departure of the fine-tuning either
    assert agents["proto"].name == agents["proto_variant"].name == "proto"
    assert default == agents["proto" if preset == "paper" else "proto_variant"]
    if preset == "demo":  # the main job's fine-tuning comes with the variant under its preset
        assert agents["proto_variant"].actor_anchor_coef > 0


MAZE = {"pretrain_task": "point_mass_maze_explore", "finetune_tasks": ["point_mass_maze_reach_top_left"]}  # preset=demo


@pytest.mark.parametrize(("fields", "command", "runs"), [
    ({"task": "walker_run", **MAZE}, "train", False),  # the preset's tasks take task's place
    ({"task": "walker_run", **MAZE}, "pretrain", False),
    ({"task": "walker_run", **MAZE}, "finetune", False),
    ({"task": "point_mass_maze_reach_top_left", **MAZE}, "train", True),  # one of finetune_tasks
    ({"task": "point_mass_maze_explore", **MAZE}, "pretrain", True),  # the pre-training's task
    ({"task": "walker_run"}, "train", True),  # no preset's tasks: task is both phases' task
    ({"task": "walker_run", "pretrain_task": "walker_walk"}, "train", True),  # fine-tuned on
    ({"task": "walker_run", "pretrain_task": "walker_walk"}, "finetune", True),
    ({"task": "walker_run", "pretrain_task": "walker_walk"}, "pretrain", False),  # pre-trains on walker_walk only
    ({"task": "walker_run", "pretrain_task": "walker_walk", "pretrain_frames": 0}, "train", True),
    ({"task": "walker_walk", "finetune_tasks": ["walker_run"], "pretrain_sweep": "sweep"}, "finetune", True),  # picks
    ({"task": "walker_walk", "finetune_tasks": ["walker_run"], "pretrain_sweep": "sweep",  # the snapshot; not with
      "pretrain_task": "walker_stand"}, "finetune", False),  # pretrain_task
])
def test_a_task_named_by_the_user_must_be_a_task_of_the_run(fields, command, runs):
    cfg = Config(run_dir=".", **fields)
    if runs:
        check_named_task(cfg, command, named=["task"])
    else:
        with pytest.raises(ConfigError, match=rf"task={cfg.task} is not a task of this run"):
            check_named_task(cfg, command, named=["task"])
    check_named_task(cfg, command, named=[])  # task not named: the config's tasks are what the user asked for


@pytest.mark.parametrize("command", ["train", "pretrain"])
def test_a_task_named_with_what_takes_its_place_is_what_the_user_asked_for(command):
    """Named together, task and pretrain_task (or finetune_tasks) say which task each phase runs."""
    cfg = Config(run_dir=".", task="point_mass_maze_reach_center", **MAZE)
    check_named_task(cfg, command, named=["task", "pretrain_task", "finetune_tasks"])
    check_named_task(cfg, "pretrain", named=["task", "pretrain_task"])
    with pytest.raises(ConfigError, match="finetune_tasks=.point_mass_maze_reach_top_left"):
        check_named_task(cfg, "finetune", named=["task", "pretrain_task"])  # finetune_tasks, from the preset, runs


# -- the keys before the groups -------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(("command", "override"), [
    ("train", "obs=states"), ("pretrain", "env=walker_walk"), ("finetune", "threads=1"),
    ("train", "replay_capacity=500"),
])
def test_a_flat_key_on_the_command_line_is_refused_naming_its_new_key(command, override, tmp_path):
    """An override of a key the groups replaced exits 2 with one line naming the key to write instead, before
    anything is written."""
    key = override.partition("=")[0]
    code = f"from protorl.app.cli import {command}; {command}()"
    result = subprocess.run([sys.executable, "-c", code, override, f"hydra.run.dir={tmp_path / 'run'}"],
                            capture_output=True, text=True, timeout=TIMEOUT_S, cwd=tmp_path,
                            env=checkout_first())
    line = assert_user_error(result, f"{key} is now {RENAMED[key]}")
    assert line == f"protorl: error: {renamed_message(key, override.partition('=')[2])}"
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("multirun", [False, True])
def test_a_flat_key_in_an_experiment_file_of_ones_own_is_refused_naming_its_new_key(multirun, tmp_path):
    """A key of the flat config in a YAML file of the user's (set, or swept by the sweeper) gets the same line."""
    experiment = tmp_path / "conf" / "experiment" / "mine.yaml"
    experiment.parent.mkdir(parents=True)
    body = "hydra:\n  sweeper:\n    params:\n      obs: states,pixels\n" if multirun else "obs: states\n"
    experiment.write_text("# @package _global_\n" + body)
    args = [*(["-m"] if multirun else []), "--config-dir", str(tmp_path / "conf"), "experiment=mine",
            f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    result = subprocess.run([sys.executable, "-c", "from protorl.app.cli import train; train()", *args],
                            capture_output=True, text=True, timeout=TIMEOUT_S, cwd=tmp_path,
                            env=checkout_first())
    assert result.returncode == 2, result.stderr
    assert renamed_message("obs") in result.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


@pytest.mark.parametrize(("fields", "new_key"), [
    ({"obs": "states"}, "env.obs"), ({"env": "walker_walk"}, "task"), ({"replay_capacity": 500}, "replay.capacity"),
    ({"threads": 1, "task": "walker_walk"}, "runtime.threads"),
])
def test_a_flat_keyword_of_the_python_api_is_refused_naming_its_new_key(fields, new_key, tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as error:
        protorl.train(run_dir=str(run_dir), **fields)
    (key,) = set(fields) & set(RENAMED)
    assert str(error.value) == renamed_message(key, fields[key]) and f"is now {new_key}:" in str(error.value)
    assert not run_dir.exists()


def test_renamed_names_every_key_of_every_group_once():
    """Every key of a group had a flat name before the groups (so a config.yaml of before holds them all), but the
    keys added since, which a config.yaml of before lacks and a run reads as their defaults."""
    added_since = {"runtime.compile_update", "runtime.tf32"}
    assert sorted(RENAMED.values()) == sorted(set(RENAMED.values()))
    grouped_keys = {f"{group}.{item.name}" for group in GROUPS
                    for item in dataclasses.fields(getattr(Config(), group))}
    assert grouped_keys - added_since <= set(RENAMED.values())
    assert not added_since & set(RENAMED.values())


def test_a_flat_saved_config_is_moved_into_the_groups_and_a_grouped_one_kept():
    flat = {"env": "walker_run", "pretrain_env": "walker_walk", "finetune_envs": ["walker_run"], "obs": "states",
            "image_size": 64, "replay_capacity": 5000, "threads": 1, "seed": 3, "snapshot_sha256": None,
            "agent": {"name": "proto", "lr": 0.001}}
    moved = grouped(flat)
    assert moved == {"task": "walker_run", "pretrain_task": "walker_walk", "finetune_tasks": ["walker_run"],
                     "env": {"obs": "states", "image_size": 64}, "replay": {"capacity": 5000},
                     "runtime": {"threads": 1}, "seed": 3, "snapshot_sha256": None,
                     "agent": {"name": "proto", "lr": 0.001}}
    assert grouped(moved) == moved
    saved = dataclasses.asdict(Config(run_dir="runs/x"))  # what a run writes today, every group in it
    assert grouped(saved) == saved
    assert grouped({"seed": 1, "agent": {"name": "proto"}}) == {"seed": 1, "agent": {"name": "proto"}}


def test_every_config_key_has_its_line_in_the_commands_page():
    """A setting of the run or of a group is one field in its class plus its line in docs/commands.md."""
    page = (ROOT / "docs" / "commands.md").read_text()
    documented = set(re.findall(r"^\| `([\w.]+)` \|", page, flags=re.MULTILINE))
    config = Config()
    keys = {item.name for item in dataclasses.fields(config) if item.name not in GROUPS}
    keys |= {f"{group}.{item.name}" for group in GROUPS for item in dataclasses.fields(getattr(config, group))}
    assert keys - documented == set()


def test_the_settings_a_rerun_may_change_are_those_that_change_no_result():
    """Marked where they are declared (`free`): how a run is watched, where it runs, how often it checkpoints;
    never a setting of the algorithm, the environment, the schedule or the seed."""
    assert rerun_free_keys() == {
        "resume", "start_over", "run_dir", "comparison_note",
        "runtime.device", "runtime.fast_malloc", "runtime.max_hours", "runtime.overlap_env_step", "replay.on_device",
        "checkpoints.every_frames", "checkpoints.every_minutes", "checkpoints.keep", "checkpoints.keep_completed",
        "logging.progress_bar", "logging.wandb", "logging.wandb_project", "logging.wandb_entity", "logging.wandb_group",
        "evaluation.save_video", "evaluation.video_size"}
    assert not any(key.startswith(("agent.", "env.", "training.")) for key in rerun_free_keys())
