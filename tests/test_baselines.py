"""The paper's baselines (Random, Curiosity/ICM, APT, DrQ) and Proto-RL without pre-training.

Unit tests check which parameters one update moves, the reward math against hand computations, and the
frozen downstream representation; end-to-end tests run every agent through the console entry points on a
real task at tiny sizes (pre-train -> snapshot -> fine-tune).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from protorl.agents import BUILT_IN, APTAgent, DrQAgent, ICMAgent, ProtoAgent, RandomAgent, make_agent
from protorl.agents.apt import nt_xent_loss, particle_entropy_reward
from protorl.agents.icm import RunningMeanStd, normalized_curiosity
from protorl.config import AgentConfig, ConfigError
from protorl.storage.snapshots import load_snapshot
from tests.agents import PIXEL_OBS_SHAPE, POINT_MASS_ACTION_SHAPE, tiny_config, update
from tests.runs import TINY_SHARED, assert_ok, assert_user_error, read_csv, run, tiny_agent

CPU = torch.device("cpu")


def build(name: str, mode: str, seed: int = 0):
    """Agent `name` at the tiny sizes, through the registry as the trainer builds it."""
    torch.manual_seed(seed)
    return make_agent(tiny_config(name), "pixels", PIXEL_OBS_SHAPE, POINT_MASS_ACTION_SHAPE, CPU, mode)


def params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def moved(before: dict[str, torch.Tensor], module: torch.nn.Module) -> dict[str, bool]:
    """For each parameter of `module`: did it change since `before`?"""
    return {name: not torch.equal(before[name], p) for name, p in module.named_parameters()}


def groups(agent) -> dict[str, torch.nn.Module]:
    out = {"encoder": agent.encoder, "critic": agent.sac.critic, "actor": agent.sac.actor}
    out.update({name: module for name, module in agent.representation_modules().items() if name != "encoder"})
    return out


def one_update(agent, replay, step: int = 0) -> dict[str, dict[str, bool]]:
    """Run one update (step 0 also updates the actor); which parameters of each group moved."""
    before = {name: params(module) for name, module in groups(agent).items()}
    update(agent, replay, step)
    return {name: moved(before[name], module) for name, module in groups(agent).items()}


# -- which parameters an update changes -----------------------------------------------------------------


@pytest.mark.parametrize(("name", "learners"), [
    ("random", {"encoder", "critic", "actor"}),
    ("icm", {"encoder", "critic", "actor", "icm"}),
    ("apt", {"encoder", "critic", "actor", "projector"}),
])
def test_pretrain_update_moves_exactly_its_learners(name, learners, random_replay):
    agent = build(name, "pretrain")
    changed = one_update(agent, random_replay)
    assert set(changed) >= learners
    for group, flags in changed.items():
        if group in learners:
            assert all(flags.values()), (group, [k for k, v in flags.items() if not v])
        else:
            assert not any(flags.values()), (group, [k for k, v in flags.items() if v])


def test_icm_update_moves_projection_and_both_dynamics_models(random_replay):
    agent = build("icm", "pretrain")
    before = {part: params(getattr(agent.icm, part)) for part in ("projection", "forward_model", "inverse_model")}
    update(agent, random_replay, 0)
    for part, old in before.items():
        assert all(moved(old, getattr(agent.icm, part)).values()), part


@pytest.mark.parametrize("name", ["random", "icm", "apt"])
def test_downstream_representation_is_frozen(name, random_replay):
    pretrained = build(name, "pretrain")
    for step in range(2):
        update(pretrained, random_replay, step)
    agent = build(name, "frozen", seed=1)
    agent.load_pretrained(copy.deepcopy(pretrained.representation_state()))
    assert not agent.trains_representation and "optimizers" not in agent.state_dict()
    changed = {}
    for step in range(3):
        changed = one_update(agent, random_replay, step)
    for group, flags in changed.items():
        if group in ("critic", "actor"):
            assert any(flags.values()), group
        else:
            assert not any(flags.values()), (group, [k for k, v in flags.items() if v])
    # the representation is exactly the snapshot's, and the task agent is fresh (not the exploration actor)
    for key, value in pretrained.encoder.state_dict().items():
        assert torch.equal(agent.encoder.state_dict()[key], value), key
    assert not torch.equal(agent.sac.actor.trunk[0].weight, pretrained.sac.actor.trunk[0].weight)


def test_drq_critic_trains_the_encoder(random_replay):
    agent = build("drq", "online")
    assert agent.trains_representation
    changed = one_update(agent, random_replay)
    assert all(changed["encoder"].values()) and all(changed["critic"].values()) and all(changed["actor"].values())
    # the actor's loss does not reach the encoder: with the critic's learning rate at 0, the encoder stays put
    agent = build("drq", "online")
    for group in agent.sac.critic_optimizer.param_groups + agent.encoder_optimizer.param_groups:
        group["lr"] = 0.0
    changed = one_update(agent, random_replay)
    assert not any(changed["encoder"].values()) and all(changed["actor"].values())


def test_drq_has_no_pretraining_phase():
    assert not DrQAgent.supports("pretrain")
    with pytest.raises(ValueError, match="no 'pretrain' update"):
        build("drq", "pretrain")


@pytest.mark.parametrize("name", ["random", "icm", "apt"])
def test_pretrained_baselines_cannot_learn_online(name):
    assert not BUILT_IN[name].supports("online")
    with pytest.raises(ValueError, match="no 'online' update"):
        build(name, "online")


def test_proto_without_pretraining_learns_representation_from_task_reward(random_replay):
    """Figure 14: SSL trains the representation while SAC learns from r + alpha * r_intr."""
    agent = build("proto", "online")
    metrics = update(agent, random_replay, 0)
    assert {"repr_loss", "extr_reward_mean", "intr_reward_mean"} <= set(metrics)
    intr, extr, share = (float(metrics[key]) for key in ("intr_reward_mean", "extr_reward_mean", "intr_reward_share"))
    alpha = agent.cfg.intr_coef  # the intrinsic part of r + alpha * r_intr
    assert share == pytest.approx(alpha * intr / (abs(extr) + alpha * intr)) and 0.0 < share < 1.0
    before = params(agent.encoder)
    update(agent, random_replay, 1)
    assert all(moved(before, agent.encoder).values())


def test_random_agent_explores_uniformly():
    agent = build("random", "pretrain")
    obs = np.zeros(PIXEL_OBS_SHAPE, dtype=np.uint8)
    actions = np.stack([agent.act(obs, sample=True) for _ in range(4000)])
    assert actions.shape == (4000, 2) and actions.min() >= -1 and actions.max() <= 1
    np.testing.assert_allclose(actions.mean(0), 0.0, atol=0.05)
    np.testing.assert_allclose(actions.var(0), 1 / 3, atol=0.03)  # variance of U(-1, 1)
    # evaluation uses the (learnt) policy's mean: the same action for the same observation
    assert np.array_equal(agent.act(obs, sample=False), agent.act(obs, sample=False))


# -- reward math against hand computations ----------------------------------------------------------------


def test_icm_reward_normalisation_matches_hand_computation():
    batches = [[0.5, 1.5], [4.0], [0.0, 2.0, 3.0]]
    stats = RunningMeanStd()
    seen: list[float] = []
    for batch in batches:
        error = torch.tensor(batch).unsqueeze(1)  # (B, 1)
        reward = normalized_curiosity(error, stats)
        seen += batch
        std = math.sqrt(sum((x - sum(seen) / len(seen)) ** 2 for x in seen) / len(seen))  # population std
        expected = [math.log(1 + x / std) for x in batch]
        np.testing.assert_allclose(reward.squeeze(1).numpy(), expected, rtol=1e-6)
        assert stats.count == len(seen)
        assert stats.mean.item() == pytest.approx(sum(seen) / len(seen))


def test_icm_errors_are_half_squared_prediction_errors():
    agent = build("icm", "pretrain")
    icm = agent.icm
    features, next_features = torch.randn(5, agent.encoder.repr_dim), torch.randn(5, agent.encoder.repr_dim)
    action = torch.rand(5, 2) * 2 - 1
    forward_error, inverse_error = icm.errors(features, action, next_features)
    phi, next_phi = icm.projection(features), icm.projection(next_features)
    assert phi.shape == (5, agent.cfg.proj_dim)
    for i in range(5):
        predicted = icm.forward_model(torch.cat([phi[i], action[i]]))
        expected = 0.5 * ((predicted - next_phi[i]) ** 2).sum().item()
        assert forward_error[i, 0].item() == pytest.approx(expected, rel=1e-5)
        predicted_action = icm.inverse_model(torch.cat([phi[i], next_phi[i]]))
        assert inverse_error[i, 0].item() == pytest.approx(0.5 * ((predicted_action - action[i]) ** 2).sum().item(),
                                                           rel=1e-5)


@pytest.mark.slow
def test_icm_dynamics_models_are_two_layer_mlps_with_1024_units():
    agent = make_agent(AgentConfig(name="icm"), "states", (4,), (2,), CPU, "pretrain")  # ICMConfig's defaults
    for model in (agent.icm.forward_model, agent.icm.inverse_model):
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        assert [layer.out_features for layer in linears][:-1] == [1024] and len(linears) == 2
    assert agent.icm.projection.out_features == 50


@pytest.mark.parametrize("k", [1, 3, 6])
def test_apt_reward_equals_brute_force(k):
    torch.manual_seed(0)
    z = F.normalize(torch.randn(9, 5), dim=1) + 10.0  # far from the origin: centring must keep distances exact
    reward = particle_entropy_reward(z, k)
    assert reward.shape == (9, 1)
    for i in range(9):
        distances = sorted(math.dist(z[i].tolist(), z[j].tolist()) for j in range(9) if j != i)
        assert reward[i, 0].item() == pytest.approx(math.log(1 + sum(distances[:k]) / k), rel=1e-4)


def test_apt_reward_grows_with_spread():
    torch.manual_seed(0)
    z = torch.randn(32, 8)
    assert (particle_entropy_reward(3 * z, 4) > particle_entropy_reward(z, 4)).all()


def test_nt_xent_matches_its_definition():
    torch.manual_seed(0)
    z1, z2 = F.normalize(torch.randn(4, 6), dim=1), F.normalize(torch.randn(4, 6), dim=1)
    tau = 0.5
    z = torch.cat([z1, z2])
    total = 0.0
    for i in range(8):
        twin = (i + 4) % 8
        others = [j for j in range(8) if j != i]
        denominator = sum(math.exp(z[i].dot(z[j]).item() / tau) for j in others)
        total += -math.log(math.exp(z[i].dot(z[twin]).item() / tau) / denominator)
    assert nt_xent_loss(z1, z2, tau).item() == pytest.approx(total / 8, rel=1e-5)
    # identical twins that differ from the rest give a lower loss than unrelated pairs
    assert nt_xent_loss(z1, z1, tau) < nt_xent_loss(z1, z2, tau)


@pytest.mark.slow
def test_every_method_is_selectable_by_name():
    """Each of the paper's methods has a config group option (`agent=NAME`) whose `agent.name` makes
    `make_agent` build that method's class; every option names a registered agent; an unknown name is refused
    listing the valid ones."""
    from hydra import compose, initialize_config_module

    from protorl.app.cli import register_configs

    register_configs()  # the schema the commands' configs build on

    methods = {"proto": ProtoAgent, "random": RandomAgent, "icm": ICMAgent, "apt": APTAgent, "drq": DrQAgent}
    assert BUILT_IN == methods
    options = sorted(p.stem for p in (Path(__file__).parents[1] / "protorl" / "conf" / "agent").glob("*.yaml"))
    with initialize_config_module(config_module="protorl.conf", version_base="1.3"):
        names = {option: compose(config_name="train", overrides=[f"agent={option}"]).agent.name for option in options}
    assert set(names.values()) == set(methods), names
    for name in methods:
        assert names[name] == name  # `agent=NAME` selects the method called NAME
    for name, cls in methods.items():
        assert type(build(name, "online" if name == "drq" else "pretrain")) is cls, name
    with pytest.raises(ConfigError, match="agent='bogus': expected one of proto, random, icm, apt, drq"):
        make_agent(AgentConfig(name="bogus"), "pixels", PIXEL_OBS_SHAPE, POINT_MASS_ACTION_SHAPE, CPU, "pretrain")


# -- end to end through the command line, on a real task --------------------------------------------------

STATES = ["preset=small", *TINY_SHARED, "env.obs=states", "task=point_mass_maze_reach_center",
          "pretrain_task=point_mass_maze_explore", "pretrain_frames=1000", "finetune_frames=1000",
          "snapshots.at_frames=[]"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["random", "icm", "apt"])
def test_baseline_pretrain_snapshot_finetune(name, tmp_path: Path):
    run_dir = tmp_path / name
    assert_ok(run("train", *STATES, *tiny_agent(name), run_dir=run_dir))
    snapshot = run_dir / "pretrain" / "snapshots" / "snapshot_1000.pt"
    payload = load_snapshot(snapshot)
    assert payload["config"]["agent"]["name"] == name
    _, rows = read_csv(run_dir / "finetune" / "eval.csv")
    assert [int(r["frames"]) for r in rows] == [0, 1000]
    _, train_rows = read_csv(run_dir / "pretrain" / "train.csv")
    assert len(train_rows) == 1  # one 1000-frame episode
    # the same snapshot fine-tunes on another task of the domain through protorl-finetune
    other = tmp_path / f"{name}_other"
    assert_ok(run("finetune", *STATES, *tiny_agent(name), "task=point_mass_maze_reach_top_right",
                  f"snapshot={snapshot}", run_dir=other))
    assert (other / "finetune" / "result.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize(("name", "extra"), [("drq", "pretrain_frames=1000"), ("proto", "pretrain_frames=0")])
def test_training_without_pretraining(name, extra, tmp_path: Path):
    run_dir = tmp_path / name
    result = run("train", *STATES, *tiny_agent(name), extra, run_dir=run_dir)
    assert_ok(result)
    assert not (run_dir / "pretrain").exists()
    _, rows = read_csv(run_dir / "finetune" / "eval.csv")
    assert [int(r["frames"]) for r in rows] == [0, 1000]
    _, train = read_csv(run_dir / "finetune" / "train.csv")
    assert any(row.get("intr_reward_share") for row in train) == (name == "proto")  # Proto-RL's intrinsic share


@pytest.mark.slow
def test_snapshot_of_another_agent_is_refused(tmp_path: Path):
    run_dir = tmp_path / "icm"
    assert_ok(run("pretrain", *STATES, *tiny_agent("icm"), run_dir=run_dir))
    snapshot = run_dir / "pretrain" / "snapshots" / "snapshot_1000.pt"
    result = run("finetune", *STATES, *tiny_agent("proto"), f"snapshot={snapshot}", run_dir=tmp_path / "proto")
    assert_user_error(result, "pre-trained by agent 'icm', not 'proto'")


@pytest.mark.parametrize(("command", "overrides", "fragment"), [
    ("train", ["agent=bogus"], "agent=bogus: no such agent; the agents are"),
    ("pretrain", ["agent=drq"], "DrQ learns from the task reward only"),
    ("train", [*tiny_agent("icm"), "pretrain_frames=0"], "learns its representation only in pre-training"),
])
@pytest.mark.slow
def test_agent_config_errors(command, overrides, fragment, tmp_path: Path):
    result = run(command, *STATES, *overrides, run_dir=tmp_path / "run")
    assert result.returncode != 0 and fragment in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("name", "mode"), [("random", "pretrain"), ("icm", "pretrain"), ("apt", "pretrain"),
                                            ("drq", "online"), ("proto", "online")])
def test_checkpoint_state_resumes_every_agent_exactly(name, mode, random_replay):
    """state_dict -> fresh agent -> load_state_dict: the next updates are bitwise those of the original."""
    agent = build(name, mode)
    for step in range(3):
        update(agent, random_replay, step)
    restored = build(name, mode, seed=99)
    restored.load_state_dict(copy.deepcopy(agent.state_dict()))
    replays = [copy.deepcopy(random_replay), copy.deepcopy(random_replay)]
    results = []
    for twin, replay in zip((agent, restored), replays, strict=True):
        torch.manual_seed(5)
        results.append([update(twin, replay, step) for step in range(3, 6)])
    assert results[0] == results[1]
    for key, value in agent.state_dict()["encoder"].items():
        assert torch.equal(restored.state_dict()["encoder"][key], value), key
