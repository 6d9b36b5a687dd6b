"""Keeping the prototypes alive: the collapse diagnostics, the head's initialisation, the anti-collapse
projector, the reward scored before a batch's own candidates are enqueued, the reward's space, the SSL
schedule, and the invariants every variant keeps (no RL gradient in the representation, a frozen
downstream representation including its normalisation statistics, snapshots that refuse a mismatch)."""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from protorl.agents import ProtoAgent
from protorl.agents.diagnostics import collapse_message, projection_diagnostics, sinkhorn_entropy
from protorl.agents.proto.agent import ProtoConfig
from protorl.agents.proto.math import ANTI_COLLAPSE, Projector, ProtoHead, knn_reward, sinkhorn
from protorl.storage.snapshots import SnapshotError, check_architecture
from tests.agents import update
from tests.runs import assert_ok, read_csv, run

VARIANTS = [variant for variant in ANTI_COLLAPSE if variant != "none"]


def state_agent(cfg: ProtoConfig, mode: str = "pretrain", seed: int = 0) -> ProtoAgent:
    """A ProtoAgent on 4-d state observations (the point mass: x, y, vx, vy)."""
    torch.manual_seed(seed)
    return ProtoAgent("states", (4,), (2,), cfg, torch.device("cpu"), mode)


def head_tensors(agent: ProtoAgent) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of the head and the projector target."""
    tensors = {f"head.{k}": v.detach().clone() for k, v in agent.head.state_dict().items()}
    tensors.update({f"target.{k}": v.detach().clone() for k, v in agent.projector_target.state_dict().items()})
    return tensors


# -- diagnostics -------------------------------------------------------------------------------------------
def test_diagnostics_of_identical_projections_say_collapsed():
    prototypes = F.normalize(torch.randn(16, 8), dim=1)
    raw = torch.randn(1, 8).repeat(32, 1) * 5.0  # 32 copies of one projection
    metrics = projection_diagnostics(raw, prototypes=prototypes)
    assert metrics["repr/distinct_prototypes"] == 1
    assert metrics["repr/projection_spread"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["repr/shared_direction"] == pytest.approx(1.0, abs=1e-6)


def test_diagnostics_of_random_directions_say_spread():
    torch.manual_seed(0)
    prototypes = F.normalize(torch.randn(64, 128), dim=1)
    raw = torch.randn(256, 128)
    metrics = projection_diagnostics(raw, prototypes=prototypes)
    assert metrics["repr/projection_spread"] == pytest.approx(math.sqrt(2), abs=0.03)  # random unit vectors in 128-d
    assert metrics["repr/shared_direction"] < 0.1
    assert metrics["repr/distinct_prototypes"] > 50  # most of the 64 prototypes are someone's nearest
    assert "repr/distinct_prototypes" not in projection_diagnostics(raw)  # agents without prototypes


def test_sinkhorn_entropy_is_log_m_for_uniform_targets_and_the_warning_fires_only_then():
    m = 512
    assert sinkhorn_entropy(torch.full((8, m), 1.0 / m)) == pytest.approx(math.log(m), rel=1e-6)
    one_hot = torch.zeros(8, m)
    one_hot[:, 3] = 1.0
    assert sinkhorn_entropy(one_hot) == pytest.approx(0.0, abs=1e-6)
    # Sinkhorn of identical scores gives uniform targets: the collapsed fixed point
    assert sinkhorn_entropy(sinkhorn(torch.ones(32, m) * 0.7 / 0.1)) == pytest.approx(math.log(m), abs=1e-5)
    row = {"frames": 2000, "repr/distinct_prototypes": 1.0, "repr/projection_spread": 0.01}
    assert "collapsed at frame 2000" in collapse_message({**row, "repr/target_entropy": math.log(m) - 0.001}, m)
    assert collapse_message({**row, "repr/target_entropy": math.log(m) - 0.3}, m) is None
    assert collapse_message({"frames": 2000}, m) is None  # agents without prototypes: no verdict


@pytest.mark.parametrize("variant", ANTI_COLLAPSE)
def test_a_collapsed_encoder_is_reported_whatever_the_anti_collapse_step(variant):
    """Every frame encoded alike (up to 1e-4): centring and BatchNorm turn the residual noise into well-spread
    directions, but the shared direction of the linear outputs still sees the collapse, and the run warns."""
    torch.manual_seed(0)
    agent = state_agent(ProtoConfig(anti_collapse=variant, num_prototypes=128, proj_dim=32, hidden_dim=32,
                                    state_hidden_dim=64))
    features = torch.rand(1, 64).repeat(256, 1) + 1e-4 * torch.randn(256, 64)  # ReLU-like, all >= 0
    linear = agent.head.projector.linear(features)
    used = agent.head.projector.anti_collapse_step(linear, batch_stats=True)
    metrics = projection_diagnostics(linear.detach(), used.detach(), agent.head.prototypes.detach())
    assert metrics["repr/shared_direction"] > 0.9999
    message = collapse_message({"frames": 1000, **metrics}, 128)
    assert message is not None and "nearly the same point" in message
    healthy = agent.head.projector.linear(torch.rand(256, 64))  # distinct frames: no warning
    assert collapse_message({"frames": 1000, **projection_diagnostics(healthy.detach())}, 128) is None


# -- initialisation ----------------------------------------------------------------------------------------
def test_head_is_initialised_like_the_papers_code():
    """Orthogonal weights and zero biases in projector and predictor, orthogonal unit-norm prototypes."""
    torch.manual_seed(0)
    head = ProtoHead(repr_dim=300, proj_dim=16, pred_hidden_dim=32, num_prototypes=64)
    weight = head.projector.linear.weight  # (16, 300): orthonormal rows
    torch.testing.assert_close(weight @ weight.t(), torch.eye(16), atol=1e-5, rtol=0)
    for layer in (head.projector.linear, head.predictor[0], head.predictor[2]):
        assert torch.count_nonzero(layer.bias) == 0
    first = head.predictor[0].weight  # (32, 16): orthonormal columns
    torch.testing.assert_close(first.t() @ first, torch.eye(16), atol=1e-5, rtol=0)
    prototypes = head.prototypes.detach()
    torch.testing.assert_close(prototypes.norm(dim=1), torch.ones(64))
    # orthogonal columns, then unit rows: the singular values stay close together; a Gaussian init's do not
    singular = torch.linalg.svdvals(prototypes)
    assert singular.max() / singular.min() < 1.6
    torch.manual_seed(0)
    gaussian = torch.linalg.svdvals(F.normalize(torch.randn(64, 16), dim=1))
    assert gaussian.max() / gaussian.min() > 1.6


# -- the anti-collapse projector -----------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_projector_centres_with_batch_statistics_and_tracks_them(variant):
    torch.manual_seed(0)
    projector = Projector(10, 6, variant, momentum=0.1)
    y = torch.rand(64, 10) + 1.0  # positive features, as after a ReLU
    out = projector(y, batch_stats=True)
    projector.update_statistics(projector.linear(y), out)  # what the SSL step does after its gradient step
    torch.testing.assert_close(out.mean(dim=0), torch.zeros(6), atol=1e-5, rtol=0)
    if variant == "batchnorm":
        torch.testing.assert_close(out.var(dim=0, correction=0), torch.ones(6), atol=1e-3, rtol=0)
    # the first batch sets the running statistics exactly, so one frame alone is projected like in its batch
    tolerance = 0.02 if variant == "batchnorm" else 1e-5  # BatchNorm's running variance is the unbiased one
    torch.testing.assert_close(projector(y[:1]), out[:1], atol=tolerance, rtol=tolerance)
    # with running statistics, a frame's projection does not depend on the rest of its batch
    torch.testing.assert_close(projector(y[:5])[:1], projector(y[:1]))
    projector.eval()  # batch statistics without updating the running ones
    before = {k: v.clone() for k, v in projector.state_dict().items()}
    projector.update_statistics(projector.linear(y * 3.0), projector(y * 3.0, batch_stats=True))
    assert all(torch.equal(before[k], v) for k, v in projector.state_dict().items())


def test_paper_projector_is_a_plain_linear_map():
    torch.manual_seed(0)
    projector = Projector(10, 6, "none")
    y = torch.rand(8, 10)
    torch.testing.assert_close(projector(y, batch_stats=True), projector.linear(y))
    assert {name for name, _ in projector.named_parameters()} == {"linear.weight", "linear.bias"}


def test_unknown_anti_collapse_is_refused():
    with pytest.raises(ValueError, match="anti_collapse"):
        Projector(10, 6, "whiten")


# -- the reward: order and space -----------------------------------------------------------------------------
def mean_reward_of_spread_projections(batch_size: int, before_enqueue: bool, space: str = "sphere") -> float:
    """Mean k-NN reward of well-spread random projections after the queue (M x T = 512 x 4) has filled."""
    cfg = ProtoConfig(num_prototypes=512, proj_dim=128, candidates_per_prototype=4, batch_size=batch_size,
                      reward_before_enqueue=before_enqueue, reward_space=space, hidden_dim=32, state_hidden_dim=32)
    agent = state_agent(cfg)
    rewards = [agent.enqueue_and_score(torch.randn(batch_size, 128)).mean().item() for _ in range(8)]
    return float(np.mean(rewards[4:]))


@pytest.mark.slow
def test_reward_before_enqueue_does_not_shrink_with_the_batch_size():
    """Random unit projections are ~1.41 apart whatever the batch: the reward must say so at B = 32 as at 512."""
    small, large = (mean_reward_of_spread_projections(b, before_enqueue=True) for b in (32, 512))
    assert small > 1.0 and large > 1.0
    assert small == pytest.approx(large, rel=0.1)
    # the paper's order scores each frame against copies of itself at small batches (the reason for the option)
    paper_small, paper_large = (mean_reward_of_spread_projections(b, before_enqueue=False) for b in (32, 512))
    assert paper_small < 0.01 < 1.0 < paper_large


def test_raw_reward_space_is_in_units_of_the_projection_spread():
    """Random projections of any scale: distances between typical points are about sqrt(2) in the raw space."""
    cfg = ProtoConfig(num_prototypes=64, proj_dim=32, candidates_per_prototype=4, batch_size=64, reward_space="raw",
                      anti_collapse="center", hidden_dim=32, state_hidden_dim=32)
    agent = state_agent(cfg)
    with torch.no_grad():
        agent.head.projector.running_spread.fill_(25.0 * 32)  # projections of std 5 per dimension
    points = agent.head.reward_embedding(5.0 * torch.randn(512, 32), "raw")
    assert torch.pdist(points).median().item() == pytest.approx(math.sqrt(2), rel=0.05)


def test_centred_projections_on_the_sphere_reward_the_mean():
    """Why the variant measures the reward before L2 normalisation: on the sphere, a frame projected near the
    mean of centred projections gets an arbitrary direction, far from every candidate, however often it is seen."""
    torch.manual_seed(0)
    head = ProtoHead(repr_dim=8, proj_dim=16, pred_hidden_dim=8, num_prototypes=8, anti_collapse="center")
    plane = torch.linalg.qr(torch.randn(16, 2)).Q.t()  # (2, 16): frames of a 2-d arena, projected linearly
    cloud = torch.randn(2048, 2) @ plane  # centred projections of frames seen often
    near_mean, typical = 0.01 * torch.randn(64, 2) @ plane, torch.randn(64, 2) @ plane
    with torch.no_grad():
        head.projector.running_spread.fill_(2.0)  # the cloud's mean squared distance from its mean

    def reward(points: torch.Tensor, space: str) -> float:
        return knn_reward(head.reward_embedding(points, space), head.reward_embedding(cloud, space)).mean().item()

    assert reward(near_mean, "sphere") > 0.9 * reward(typical, "sphere")  # on the sphere the mean is as novel
    assert reward(near_mean, "raw") < 0.5 * reward(typical, "raw")  # in the raw space it is where data is densest
    with pytest.raises(ValueError, match="reward_space"):
        head.reward_embedding(cloud, "cosine")


# -- the SSL schedule ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("ema_every", [2, 1])
def test_ssl_update_every_2_trains_the_representation_on_even_updates_only(make_cfg, replay, ema_every):
    """ssl_update_every=2 with encoder_target_update_every=2 is the paper's code (SSL and EMA together every 2nd
    update); the EMA keeps its own schedule, so with 1 the target also moves on the updates without SSL."""
    cfg = make_cfg(ssl_update_every=2, encoder_target_update_every=ema_every)
    torch.manual_seed(0)
    agent = ProtoAgent("pixels", (9, 32, 32), (2,), cfg, torch.device("cpu"), "pretrain")
    update(agent, replay, 0)  # the online network now differs from the target
    for step, trains in ((1, False), (2, True), (3, False), (4, True)):
        encoder = [p.detach().clone() for p in agent.encoder.parameters()]
        target = [p.detach().clone() for p in agent.encoder_target.parameters()]
        metrics = update(agent, replay, step)
        changed = not all(torch.equal(a, b) for a, b in zip(encoder, agent.encoder.parameters(), strict=True))
        target_moved = not all(torch.equal(a, b) for a, b in zip(target, agent.encoder_target.parameters(),
                                                                  strict=True))
        assert changed == trains and ("repr_loss" in metrics) == trains, step
        assert target_moved == (step % ema_every == 0), step
        assert "critic_loss" in metrics and "intr_reward_mean" in metrics  # SAC and the reward every update


# -- invariants of every variant ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ANTI_COLLAPSE)
def test_rl_side_cannot_steer_the_representation(make_cfg, replay, variant):
    """Black box: perturbing the actor and critic leaves every representation tensor (head parameters and
    statistics, encoder, targets), the queue and the SSL losses bitwise identical over a few updates. If any RL
    gradient reached the representation, the runs would diverge, since their critic and actor losses differ."""
    cfg = make_cfg(anti_collapse=variant, reward_before_enqueue=True, reward_space="raw")
    runs = []
    for perturb in (False, True):
        torch.manual_seed(0)
        agent = ProtoAgent("pixels", (9, 32, 32), (2,), cfg, torch.device("cpu"), "pretrain")
        if perturb:
            generator = torch.Generator().manual_seed(99)
            with torch.no_grad():
                for p in [*agent.sac.actor.parameters(), *agent.sac.critic.parameters()]:
                    p.add_(torch.randn(p.shape, generator=generator))
            agent.sac.critic_target.load_state_dict(agent.sac.critic.state_dict())
        torch.manual_seed(5)
        twin_replay = copy.deepcopy(replay)
        metrics = [update(agent, twin_replay, step) for step in range(4)]
        tensors = head_tensors(agent)
        for name, module in (("encoder", agent.encoder), ("encoder_target", agent.encoder_target)):
            tensors.update({f"{name}.{k}": v for k, v in module.state_dict().items()})
        runs.append((tensors, agent.queue.items.clone(), metrics))
    (first, queue_a, metrics_a), (second, queue_b, metrics_b) = runs
    assert [m["critic_loss"] for m in metrics_a] != [m["critic_loss"] for m in metrics_b]  # the RL side did differ
    assert [k for k in first if not torch.equal(first[k], second[k])] == []
    assert torch.equal(queue_a, queue_b)
    assert [m["repr_loss"] for m in metrics_a] == [m["repr_loss"] for m in metrics_b]


@pytest.mark.parametrize("variant", VARIANTS)
def test_pretraining_moves_the_normalisation_statistics(make_cfg, replay, variant):
    agent = ProtoAgent("pixels", (9, 32, 32), (2,), make_cfg(anti_collapse=variant), torch.device("cpu"), "pretrain")
    before = agent.head.projector.running_mean.clone()
    update(agent, replay, 0)
    assert not torch.equal(before, agent.head.projector.running_mean)
    assert int(agent.head.projector.batches_seen) == 1


@pytest.mark.parametrize("variant", ANTI_COLLAPSE)
def test_downstream_representation_is_frozen_statistics_included(make_cfg, replay, variant):
    """Fine-tuning updates and acting leave every head parameter and buffer (running mean, variance, spread)
    exactly as the snapshot had them, while the queue keeps being refreshed."""
    cfg = make_cfg(anti_collapse=variant, reward_before_enqueue=True, reward_space="raw")
    torch.manual_seed(0)
    pretrained = ProtoAgent("pixels", (9, 32, 32), (2,), cfg, torch.device("cpu"), "pretrain")
    for step in range(3):
        update(pretrained, replay, step)
    state = copy.deepcopy(pretrained.representation_state())
    agent = ProtoAgent("pixels", (9, 32, 32), (2,), cfg, torch.device("cpu"), "frozen")
    agent.load_pretrained(state)
    frozen = head_tensors(agent)
    queue = agent.queue.items.clone()
    for step in range(3):
        update(agent, replay, step)
    agent.act(replay.sample(1).obs[0].numpy(), sample=True)
    after = head_tensors(agent)
    assert all(torch.equal(frozen[k], after[k]) for k in frozen), [k for k in frozen if not torch.equal(frozen[k],
                                                                                                          after[k])]
    assert not agent.head.training and not agent.head.projector.training
    assert not torch.equal(queue, agent.queue.items)


def test_snapshot_of_another_variant_is_refused(make_cfg):
    saved = {**dataclasses.asdict(make_cfg()), "anti_collapse": "center"}
    with pytest.raises(SnapshotError, match="anti_collapse"):
        check_architecture("snap.pt", saved, make_cfg(anti_collapse="none"))
    check_architecture("snap.pt", saved, make_cfg(anti_collapse="center"))
    with pytest.raises(SnapshotError, match="reward_space"):  # the queue holds points of the snapshot's space
        check_architecture("snap.pt", {**saved, "reward_space": "raw"}, make_cfg(anti_collapse="center"))


def test_state_of_a_variant_does_not_load_into_the_paper_head(make_cfg):
    """The statistics are part of the state: a centred head's state is not silently dropped by a plain one."""
    centred = ProtoAgent("states", (4,), (2,), make_cfg(anti_collapse="center"), torch.device("cpu"), "pretrain")
    plain = ProtoAgent("states", (4,), (2,), make_cfg(anti_collapse="none"), torch.device("cpu"), "frozen")
    with pytest.raises(RuntimeError, match="running_mean"):
        plain.load_pretrained(centred.representation_state())


# -- end to end: real pre-training runs from states ---------------------------------------------------------
SMALL_MAZE = ["preset=small", "env.obs=states", "task=point_mass_maze_explore", "pretrain_frames=3000",
              "logging.progress_bar=false", "logging.tensorboard=false", "runtime.threads=1"]


@pytest.fixture(scope="module")
def small_runs(tmp_path_factory):
    """3k frames of the U-maze from states with the small preset's variant, and the same with the paper's algorithm,
    on the CPU: the outcomes were measured on its random streams (a GPU draws other numbers; with them the paper's
    algorithm, at this tiny size, had not yet collapsed by 3k frames on an H200)."""
    root = tmp_path_factory.mktemp("alive")
    runs = {}
    for name, extra in (("variant", []), ("paper", ["agent=proto"])):
        result = run("pretrain", *SMALL_MAZE, *extra, "runtime.device=cpu", run_dir=root / name)
        assert_ok(result)
        runs[name] = (root / name, result.stdout + result.stderr)
    return runs


@pytest.mark.research
def test_small_preset_keeps_the_representation_alive(small_runs):
    run_dir, output = small_runs["variant"]
    columns, rows = read_csv(run_dir / "pretrain" / "train.csv")
    assert {"repr/distinct_prototypes", "repr/target_entropy", "repr/projection_spread",
            "repr/shared_direction"} <= set(columns)
    last = rows[-1]
    assert float(last["repr/distinct_prototypes"]) >= 8
    assert float(last["intr_reward_mean"]) >= 1e-3
    assert float(last["repr/target_entropy"]) < math.log(512) - 0.1
    assert "has collapsed" not in output


@pytest.mark.research
def test_the_papers_algorithm_collapses_and_the_run_says_so_once(small_runs):
    run_dir, output = small_runs["paper"]
    assert output.count("the representation has collapsed at frame") == 1, output
    assert "has collapsed" in (run_dir / "pretrain.log").read_text()  # Hydra names the log after the command
    rows = read_csv(run_dir / "pretrain" / "train.csv")[1]
    frame = int(output.split("the representation has collapsed at frame ")[1].split(":")[0])
    row = next(row for row in rows if int(row["frames"]) == frame)  # the row the warning was raised on
    assert float(row["repr/target_entropy"]) > math.log(512) - 0.01 or float(row["repr/shared_direction"]) > 0.9999
    assert float(row["repr/distinct_prototypes"]) <= 3
