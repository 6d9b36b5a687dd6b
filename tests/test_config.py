"""Run configuration: the paper's defaults (table 1, appendix C) and start-up validation."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from protorl.agents.proto.agent import ProtoConfig
from protorl.app.validate import check_named_env, validate
from protorl.config import AgentConfig, Config, ConfigError
from tests.agents import update

# -- validation --------------------------------------------------------------------------------------


def make_config(agent: dict | None = None, **top) -> Config:
    return Config(agent=ProtoConfig(**(agent or {})), **top)


def test_defaults_are_valid():
    validate(make_config(), "pretrain")
    validate(make_config(snapshot="some/snapshot.pt"), "finetune")
    validate(make_config(obs="states", image_size=84), "pretrain")
    validate(make_config(env="walker_walk", pretrain_env="walker_run", device="cpu"), "pretrain")


@pytest.mark.parametrize(
    ("config", "phase", "key"),
    [
        (make_config({"batch_size": 0}), "pretrain", "agent.batch_size"),
        (make_config({"discount": 1.5}), "pretrain", "agent.discount"),
        (make_config({"discount": 0.0}), "pretrain", "agent.discount"),
        (make_config(obs="rgb"), "pretrain", "obs"),
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
        (make_config(seed_transitions=-1), "pretrain", "seed_transitions"),
        (make_config(pretrain_frames=0), "pretrain", "pretrain_frames"),
        (make_config(replay_capacity=0), "pretrain", "replay_capacity"),
        (make_config({"batch_size": 32}, replay_capacity=10), "pretrain", "agent.batch_size 32"),
        (make_config(snapshot_at_frames=[1000, 0]), "pretrain", "snapshot_at_frames"),
        (make_config(threads=0), "pretrain", "threads"),
        (make_config(image_size=8), "pretrain", "image_size"),
        (make_config(frame_stack=0), "pretrain", "frame_stack"),
        (make_config(action_repeat=0), "pretrain", "action_repeat"),
        (make_config(device="tpu"), "pretrain", "device"),
        (make_config(device="cuda:"), "pretrain", "device"),
        (make_config(device="cpu:0"), "pretrain", "device"),
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


@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_device_without_cuda(device, monkeypatch):
    """A CUDA device is refused where CUDA is not available, and accepted where it is (on any machine: torch's
    answer is patched both ways)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError) as info:
        validate(make_config(device=device), "pretrain")
    assert str(info.value) == (f"invalid config value device={device!r}: expected 'auto' or 'cpu': "
                               "CUDA is not available on this machine")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    validate(make_config(device=device), "pretrain")


def test_a_cuda_index_the_machine_does_not_have_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="'cuda:N' with N below 1"):
        validate(make_config(device="cuda:3"), "pretrain")


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("field", ["env", "pretrain_env"])
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
PAPER_RUN = {
    "replay_capacity": 100_000, "seed_transitions": 1000, "action_repeat": 2, "frame_stack": 3,
    "image_size": 84, "pretrain_frames": 500_000, "finetune_frames": 500_000, "eval_every_frames": 10_000,
    "eval_episodes": 10, "snapshot_at_frames": [100_000, 200_000, 500_000, 1_000_000], "obs": "pixels",
    "update_every_steps": 1,
}


def test_schema_defaults_match_paper_table():
    config = Config(agent=ProtoConfig())
    for key, value in PAPER_AGENT.items():
        assert getattr(config.agent, key) == value, key
        assert type(getattr(config.agent, key)) is type(value), key
    for key, value in PAPER_RUN.items():
        assert getattr(config, key) == value, key


def test_configs_do_not_share_mutable_defaults():
    """Every mutable default (lists, the nested AgentConfig, and their own mutable fields) is a fresh object per
    Config, so changing one run's configuration cannot change another's."""
    immutable = (str, int, float, bool, type(None), tuple, frozenset)

    def mutable_fields(node, path: str):
        for item in dataclasses.fields(node):
            value = getattr(node, item.name)
            if not isinstance(value, immutable):
                yield f"{path}{item.name}", value
                if dataclasses.is_dataclass(value):
                    yield from mutable_fields(value, f"{path}{item.name}.")

    first, second = dict(mutable_fields(Config(), "")), dict(mutable_fields(Config(), ""))
    assert {"snapshot_at_frames", "finetune_envs", "agent"} <= set(first)
    for key, value in first.items():
        assert value is not second[key], key
    changed = Config()
    changed.snapshot_at_frames.append(1)
    changed.finetune_envs.append("walker_walk")
    changed.agent.lr = 1.0
    assert Config().snapshot_at_frames == PAPER_RUN["snapshot_at_frames"]
    assert Config().finetune_envs == [] and Config().agent.lr == PAPER_AGENT["lr"]


def test_agent_configs_are_plain_dataclasses():
    """Proto-RL's config holds every value of the paper's table; the shared part is the base class's."""
    assert {f.name for f in dataclasses.fields(ProtoConfig)} >= set(PAPER_AGENT)
    assert issubclass(ProtoConfig, AgentConfig) and "num_prototypes" not in {f.name for f in
                                                                             dataclasses.fields(AgentConfig)}


@pytest.mark.parametrize(("config_name", "paper_scale"), [("pretrain", True), ("finetune", True), ("train", False)])
def test_composed_cli_configs(config_name, paper_scale):
    """The YAML files: pretrain/finetune default to the paper preset, train to the main job (preset=demo)."""
    from hydra import compose, initialize_config_module

    import protorl.app.cli  # noqa: F401  (registers the structured schema)

    with initialize_config_module(config_module="protorl.conf", version_base="1.3"):
        cfg = compose(config_name=config_name)
    if paper_scale:
        for key, value in PAPER_RUN.items():
            assert cfg[key] == value, key
        for key, value in PAPER_AGENT.items():
            assert cfg.agent[key] == value, key
        assert cfg.env == "point_mass_easy"
    else:
        assert (cfg.env, cfg.obs) == ("point_mass_maze_reach_top_left", "states")
        assert cfg.pretrain_frames < PAPER_RUN["pretrain_frames"] and cfg.agent.batch_size < 512
        # the small preset's departures; the remaining hyper-parameters stay the paper's
        for key, value in PAPER_AGENT.items():
            if key not in ("batch_size", *VARIANT):
                assert cfg.agent[key] == value, key
        for key, value in VARIANT.items():
            assert cfg.agent[key] == value, key


@pytest.mark.parametrize("preset", ["small", "paper"])
def test_proto_paper_pins_the_published_algorithm_under_any_preset(preset):
    from hydra import compose, initialize_config_module

    import protorl.app.cli  # noqa: F401

    with initialize_config_module(config_module="protorl.conf", version_base="1.3"):
        paper = compose(config_name="pretrain", overrides=[f"preset={preset}", "agent=proto_paper"])
        default = compose(config_name="pretrain", overrides=[f"preset={preset}"])
    for key in VARIANT:
        assert paper.agent[key] == PAPER_AGENT[key], key
        assert default.agent[key] == (VARIANT[key] if preset == "small" else PAPER_AGENT[key]), key
    assert paper.agent.name == default.agent.name == "proto"


MAZE = {"pretrain_env": "point_mass_maze_explore", "finetune_envs": ["point_mass_maze_reach_top_left"]}  # preset=demo


@pytest.mark.parametrize(("fields", "command", "runs"), [
    ({"env": "walker_run", **MAZE}, "train", False),  # the preset's tasks take env's place
    ({"env": "walker_run", **MAZE}, "pretrain", False),
    ({"env": "walker_run", **MAZE}, "finetune", False),
    ({"env": "point_mass_maze_reach_top_left", **MAZE}, "train", True),  # one of finetune_envs
    ({"env": "point_mass_maze_explore", **MAZE}, "pretrain", True),  # the pre-training's task
    ({"env": "walker_run"}, "train", True),  # no preset's tasks: env is both phases' task
    ({"env": "walker_run", "pretrain_env": "walker_walk"}, "train", True),  # fine-tuned on
    ({"env": "walker_run", "pretrain_env": "walker_walk"}, "finetune", True),
    ({"env": "walker_run", "pretrain_env": "walker_walk"}, "pretrain", False),  # pre-trains on walker_walk only
    ({"env": "walker_run", "pretrain_env": "walker_walk", "pretrain_frames": 0}, "train", True),
    ({"env": "walker_walk", "finetune_envs": ["walker_run"], "pretrain_sweep": "sweep"}, "finetune", True),  # picks
    ({"env": "walker_walk", "finetune_envs": ["walker_run"], "pretrain_sweep": "sweep",  # the snapshot; not with
      "pretrain_env": "walker_stand"}, "finetune", False),  # pretrain_env
])
def test_an_env_named_by_the_user_must_be_a_task_of_the_run(fields, command, runs):
    cfg = Config(run_dir=".", **fields)
    if runs:
        check_named_env(cfg, command, named=["env"])
    else:
        with pytest.raises(ConfigError, match=rf"env={cfg.env} is not a task of this run"):
            check_named_env(cfg, command, named=["env"])
    check_named_env(cfg, command, named=[])  # env not named: the config's tasks are what the user asked for


@pytest.mark.parametrize("command", ["train", "pretrain"])
def test_an_env_named_with_what_takes_its_place_is_what_the_user_asked_for(command):
    """Named together, env and pretrain_env (or finetune_envs) say which task each phase runs."""
    cfg = Config(run_dir=".", env="point_mass_maze_reach_center", **MAZE)
    check_named_env(cfg, command, named=["env", "pretrain_env", "finetune_envs"])
    check_named_env(cfg, "pretrain", named=["env", "pretrain_env"])
    with pytest.raises(ConfigError, match="finetune_envs=.point_mass_maze_reach_top_left"):
        check_named_env(cfg, "finetune", named=["env", "pretrain_env"])  # finetune_envs, from the preset, runs
