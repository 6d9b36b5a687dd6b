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

from protorl.agents import AGENTS, APTAgent, DrQAgent, ICMAgent, ProtoAgent, RandomAgent, make_agent
from protorl.agents.apt import nt_xent_loss, particle_entropy_reward
from protorl.agents.icm import RunningMeanStd, normalized_curiosity
from protorl.config import AgentConfig
from protorl.snapshot import load_snapshot
from tests.conftest import PIXEL_OBS_SHAPE, POINT_MASS_ACTION_SHAPE
from tests.runs import TINY, assert_ok, assert_user_error, read_csv, run

CPU = torch.device("cpu")


def build(name: str, cfg, phase: str, train_representation: bool | None = None, seed: int = 0):
    torch.manual_seed(seed)
    cfg = copy.deepcopy(cfg)
    cfg.name = name
    return make_agent("pixels", PIXEL_OBS_SHAPE, POINT_MASS_ACTION_SHAPE, cfg, CPU, phase, train_representation)


def params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def moved(before: dict[str, torch.Tensor], module: torch.nn.Module) -> dict[str, bool]:
    """For each parameter of `module`: did it change since `before`?"""
    return {name: not torch.equal(before[name], p) for name, p in module.named_parameters()}


def groups(agent) -> dict[str, torch.nn.Module]:
    out = {"encoder": agent.encoder, "critic": agent.sac.critic, "actor": agent.sac.actor}
    out.update({name: module for name, module in agent.representation_modules().items()
                if isinstance(module, torch.nn.Module) and name != "encoder"})
    return out


def one_update(agent, replay, step: int = 0) -> dict[str, dict[str, bool]]:
    """Run one update (step 0 also updates the actor); which parameters of each group moved."""
    before = {name: params(module) for name, module in groups(agent).items()}
    agent.update(replay, step)
    return {name: moved(before[name], module) for name, module in groups(agent).items()}


# -- which parameters an update changes -----------------------------------------------------------------


@pytest.mark.parametrize(("name", "learners"), [
    ("random", {"encoder", "critic", "actor"}),
    ("icm", {"encoder", "critic", "actor", "icm"}),
    ("apt", {"encoder", "critic", "actor", "projector"}),
])
def test_pretrain_update_moves_exactly_its_learners(name, learners, tiny_cfg, random_replay):
    agent = build(name, tiny_cfg, "pretrain")
    changed = one_update(agent, random_replay)
    assert set(changed) >= learners
    for group, flags in changed.items():
        if group in learners:
            assert all(flags.values()), (group, [k for k, v in flags.items() if not v])
        else:
            assert not any(flags.values()), (group, [k for k, v in flags.items() if v])


def test_icm_update_moves_projection_and_both_dynamics_models(tiny_cfg, random_replay):
    agent = build("icm", tiny_cfg, "pretrain")
    before = {part: params(getattr(agent.icm, part)) for part in ("projection", "forward_model", "inverse_model")}
    agent.update(random_replay, 0)
    for part, old in before.items():
        assert all(moved(old, getattr(agent.icm, part)).values()), part


@pytest.mark.parametrize("name", ["random", "icm", "apt"])
def test_downstream_representation_is_frozen(name, tiny_cfg, random_replay):
    pretrained = build(name, tiny_cfg, "pretrain")
    for step in range(2):
        pretrained.update(random_replay, step)
    agent = build(name, tiny_cfg, "finetune", train_representation=False, seed=1)
    agent.load_pretrained(copy.deepcopy(pretrained.representation_state()))
    assert not agent.train_representation and "optimizers" not in agent.state_dict()
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


def test_drq_critic_trains_the_encoder(tiny_cfg, random_replay):
    agent = build("drq", tiny_cfg, "finetune")
    assert agent.train_representation
    changed = one_update(agent, random_replay)
    assert all(changed["encoder"].values()) and all(changed["critic"].values()) and all(changed["actor"].values())
    # the actor's loss does not reach the encoder: with the critic's learning rate at 0, the encoder stays put
    agent = build("drq", tiny_cfg, "finetune")
    for group in agent.sac.critic_optimizer.param_groups + agent.encoder_optimizer.param_groups:
        group["lr"] = 0.0
    changed = one_update(agent, random_replay)
    assert not any(changed["encoder"].values()) and all(changed["actor"].values())


def test_drq_has_no_pretraining_phase(tiny_cfg):
    with pytest.raises(ValueError, match="no task-agnostic pre-training"):
        build("drq", tiny_cfg, "pretrain")


@pytest.mark.parametrize("name", ["random", "icm", "apt"])
def test_pretrained_baselines_cannot_learn_online(name, tiny_cfg):
    with pytest.raises(ValueError, match="fine-tune it from a pre-training snapshot"):
        build(name, tiny_cfg, "finetune", train_representation=True)


def test_proto_without_pretraining_learns_representation_from_task_reward(tiny_cfg, random_replay):
    """Figure 14: SSL trains the representation while SAC learns from r + alpha * r_intr."""
    agent = build("proto", tiny_cfg, "finetune", train_representation=True)
    metrics = agent.update(random_replay, 0)
    assert {"repr_loss", "extr_reward_mean", "intr_reward_mean"} <= set(metrics)
    before = params(agent.encoder)
    agent.update(random_replay, 1)
    assert all(moved(before, agent.encoder).values())


def test_random_agent_explores_uniformly(tiny_cfg):
    agent = build("random", tiny_cfg, "pretrain")
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


def test_icm_errors_are_half_squared_prediction_errors(tiny_cfg):
    agent = build("icm", tiny_cfg, "pretrain")
    icm = agent.icm
    features, next_features = torch.randn(5, agent.encoder.repr_dim), torch.randn(5, agent.encoder.repr_dim)
    action = torch.rand(5, 2) * 2 - 1
    forward_error, inverse_error = icm.errors(features, action, next_features)
    phi, next_phi = icm.projection(features), icm.projection(next_features)
    assert phi.shape == (5, tiny_cfg.icm_proj_dim)
    for i in range(5):
        predicted = icm.forward_model(torch.cat([phi[i], action[i]]))
        expected = 0.5 * ((predicted - next_phi[i]) ** 2).sum().item()
        assert forward_error[i, 0].item() == pytest.approx(expected, rel=1e-5)
        predicted_action = icm.inverse_model(torch.cat([phi[i], next_phi[i]]))
        assert inverse_error[i, 0].item() == pytest.approx(0.5 * ((predicted_action - action[i]) ** 2).sum().item(),
                                                           rel=1e-5)


def test_icm_dynamics_models_are_two_layer_mlps_with_1024_units():
    agent = make_agent("states", (4,), (2,), AgentConfig(name="icm"), CPU, "pretrain")
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


def test_every_method_is_selectable_by_name(tiny_cfg):
    """Each of the paper's methods has a config group option (`agent=NAME`) whose `agent.name` makes
    `make_agent` build that method's class; every option names a registered agent; an unknown name is refused
    listing the valid ones."""
    from hydra import compose, initialize_config_module

    import protorl.cli  # noqa: F401  (registers the structured schema)

    methods = {"proto": ProtoAgent, "random": RandomAgent, "icm": ICMAgent, "apt": APTAgent, "drq": DrQAgent}
    assert AGENTS == methods
    options = sorted(p.stem for p in (Path(__file__).parents[1] / "protorl" / "conf" / "agent").glob("*.yaml"))
    with initialize_config_module(config_module="protorl.conf", version_base="1.3"):
        names = {option: compose(config_name="train", overrides=[f"agent={option}"]).agent.name for option in options}
    assert set(names.values()) == set(methods), names
    for name in methods:
        assert names[name] == name  # `agent=NAME` selects the method called NAME
    for name, cls in methods.items():
        assert type(build(name, tiny_cfg, "finetune" if name == "drq" else "pretrain")) is cls, name
    with pytest.raises(ValueError, match="unknown agent 'bogus'; valid agents: proto, random, icm, apt, drq"):
        build("bogus", tiny_cfg, "pretrain")


# -- end to end through the command line, on a real task --------------------------------------------------

STATES = ["preset=small", *TINY, "obs=states", "env=point_mass_maze_reach_center",
          "pretrain_env=point_mass_maze_explore", "pretrain_frames=1000", "finetune_frames=1000",
          "snapshot_at_frames=[]", "agent.apt_knn_k=3", "agent.icm_hidden_dim=32"]


@pytest.mark.parametrize("name", ["random", "icm", "apt"])
def test_baseline_pretrain_snapshot_finetune(name, tmp_path: Path):
    run_dir = tmp_path / name
    assert_ok(run("train", *STATES, f"agent={name}", run_dir=run_dir))
    snapshot = run_dir / "pretrain" / "snapshots" / "snapshot_1000.pt"
    payload = load_snapshot(snapshot)
    assert payload["config"]["agent"]["name"] == name
    _, rows = read_csv(run_dir / "finetune" / "eval.csv")
    assert [int(r["frames"]) for r in rows] == [0, 1000]
    _, train_rows = read_csv(run_dir / "pretrain" / "train.csv")
    assert len(train_rows) == 1  # one 1000-frame episode
    # the same snapshot fine-tunes on another task of the domain through protorl-finetune
    other = tmp_path / f"{name}_other"
    assert_ok(run("finetune", *STATES, f"agent={name}", "env=point_mass_maze_reach_top_right",
                  f"snapshot={snapshot}", run_dir=other))
    assert (other / "finetune" / "result.json").exists()


@pytest.mark.parametrize(("name", "extra"), [("drq", "pretrain_frames=1000"), ("proto", "pretrain_frames=0")])
def test_training_without_pretraining(name, extra, tmp_path: Path):
    run_dir = tmp_path / name
    result = run("train", *STATES, f"agent={name}", extra, run_dir=run_dir)
    assert_ok(result)
    assert not (run_dir / "pretrain").exists()
    _, rows = read_csv(run_dir / "finetune" / "eval.csv")
    assert [int(r["frames"]) for r in rows] == [0, 1000]


def test_snapshot_of_another_agent_is_refused(tmp_path: Path):
    run_dir = tmp_path / "icm"
    assert_ok(run("pretrain", *STATES, "agent=icm", run_dir=run_dir))
    snapshot = run_dir / "pretrain" / "snapshots" / "snapshot_1000.pt"
    result = run("finetune", *STATES, "agent=proto", f"snapshot={snapshot}", run_dir=tmp_path / "proto")
    assert_user_error(result, "agent.name='icm' in the snapshot, 'proto' here")


@pytest.mark.parametrize(("command", "overrides", "fragment"), [
    ("train", ["agent=bogus"], "Available options in 'agent'"),
    ("pretrain", ["agent=drq"], "DrQ learns from the task reward only"),
    ("train", ["agent=icm", "pretrain_frames=0"], "learns its representation only in pre-training"),
])
def test_agent_config_errors(command, overrides, fragment, tmp_path: Path):
    result = run(command, *STATES, *overrides, run_dir=tmp_path / "run")
    assert result.returncode != 0 and fragment in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("name", "phase"), [("random", "pretrain"), ("icm", "pretrain"), ("apt", "pretrain"),
                                             ("drq", "finetune"), ("proto", "finetune")])
def test_checkpoint_state_resumes_every_agent_exactly(name, phase, tiny_cfg, random_replay):
    """state_dict -> fresh agent -> load_state_dict: the next updates are bitwise those of the original."""
    agent = build(name, tiny_cfg, phase, train_representation=True)
    for step in range(3):
        agent.update(random_replay, step)
    restored = build(name, tiny_cfg, phase, train_representation=True, seed=99)
    restored.load_state_dict(copy.deepcopy(agent.state_dict()))
    replays = [copy.deepcopy(random_replay), copy.deepcopy(random_replay)]
    results = []
    for twin, replay in zip((agent, restored), replays, strict=True):
        torch.manual_seed(5)
        results.append([twin.update(replay, step) for step in range(3, 6)])
    assert results[0] == results[1]
    for key, value in agent.state_dict()["encoder"].items():
        assert torch.equal(restored.state_dict()["encoder"][key], value), key
