"""Numerical robustness of Sinkhorn, the k-NN reward and candidate sampling at extreme inputs.

"Finite" here means: every output is a finite number and the output still means what it should
(Sinkhorn rows are distributions, k-NN rewards are distances >= 0 close to the exact ones,
candidates are rows of the batch). In training the projections z and prototypes are unit-norm (z may
be all-zero if a projection is), so dot products lie in [-1, 1] and Sinkhorn scores in [-1/tau, 1/tau];
the extremes below go well beyond that. test_proto_math.py covers the moderate extremes (scores
scaled by 1e4, all-equal and duplicated score rows, duplicated queue rows).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from protorl.agents.proto.math import CandidateQueue, knn_reward, sample_candidates, sinkhorn
from protorl.replay import ReplayBuffer
from tests.agents import update

INF = float("inf")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _unit(rows: int, dim: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(rows, dim, generator=_gen(seed)), dim=1)


def _exact_knn(z: torch.Tensor, queue: torch.Tensor, k: int = 3) -> torch.Tensor:
    """k-th nearest distance in float64 by explicit differences (no cancellation): (B, 1)."""
    distances = (z.double()[:, None, :] - queue.double()[None, :, :]).norm(dim=2)
    return distances.sort(dim=1).values[:, k - 1:k]


def _assert_assignments(q: torch.Tensor, shape: tuple[int, int]) -> None:
    """q is a (B, M) float32 matrix of finite, non-negative rows summing to 1."""
    assert q.shape == shape and q.dtype == torch.float32
    assert torch.isfinite(q).all(), q
    assert (q >= 0).all()
    torch.testing.assert_close(q.sum(dim=1), torch.ones(shape[0]), atol=1e-5, rtol=0)


# -- knn_reward ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [8, 40])  # 40 > 25 rows: torch.cdist's matrix-multiply path
def test_knn_reward_all_zero_queue_is_the_distance_to_the_origin(batch):
    """The queue's storage starts as zeros (CandidateQueue before any enqueue)."""
    z = _unit(batch, 16, seed=1) * torch.linspace(0.5, 2.0, batch)[:, None]
    queue = CandidateQueue(64, 16).items
    assert not queue.any()
    reward = knn_reward(z, queue, k=3)
    assert torch.isfinite(reward).all()
    torch.testing.assert_close(reward, z.norm(dim=1, keepdim=True), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batch", [8, 40])
def test_knn_reward_all_zero_z_is_the_kth_smallest_queue_norm(batch):
    queue = _unit(64, 16, seed=2) * torch.linspace(0.1, 3.0, 64)[:, None]
    reward = knn_reward(torch.zeros(batch, 16), queue, k=3)
    assert torch.isfinite(reward).all()
    torch.testing.assert_close(reward, queue.norm(dim=1).sort().values[2].expand(batch, 1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scale", [0.0, 1e-30, 1.0, 1e6])
@pytest.mark.parametrize(("batch", "queue_size"), [(8, 16), (40, 64), (3, 3)])
def test_knn_reward_identical_embeddings_give_exactly_zero(scale, batch, queue_size):
    """All frames alike (early training, a black screen): every z and queue row the same vector."""
    row = _unit(1, 32, seed=3) * scale
    reward = knn_reward(row.repeat(batch, 1), row.repeat(queue_size, 1), k=3)
    assert reward.shape == (batch, 1)
    assert torch.isfinite(reward).all()
    assert torch.equal(reward, torch.zeros(batch, 1)), reward


@pytest.mark.parametrize(("z_scale", "queue_scale"), [(1e6, 1e6), (1e6, 1.0), (1.0, 1e6)])
def test_knn_reward_large_magnitudes_are_accurate(z_scale, queue_scale):
    z = torch.randn(40, 16, generator=_gen(4)) * z_scale
    queue = torch.randn(64, 16, generator=_gen(5)) * queue_scale
    reward = knn_reward(z, queue, k=3)
    assert reward.dtype == torch.float32 and torch.isfinite(reward).all()
    torch.testing.assert_close(reward.double(), _exact_knn(z, queue), rtol=1e-5, atol=0)


@pytest.mark.parametrize(("z_scale", "queue_scale"), [(1e-30, 1e-30), (1e-30, 1.0), (1.0, 1e-30)])
def test_knn_reward_tiny_magnitudes_are_finite(z_scale, queue_scale):
    """Where every point is ~1e-30 the squared distances (~1e-60) underflow float32 and the reward is 0
    instead of ~1e-30: finite and off by less than 1e-29, far below any reward that matters."""
    z = torch.randn(40, 16, generator=_gen(6)) * z_scale
    queue = torch.randn(64, 16, generator=_gen(7)) * queue_scale
    reward = knn_reward(z, queue, k=3)
    assert reward.dtype == torch.float32 and torch.isfinite(reward).all()
    assert (reward >= 0).all()
    exact = _exact_knn(z, queue)
    torch.testing.assert_close(reward.double(), exact, rtol=1e-5, atol=1e-29)
    if max(z_scale, queue_scale) >= 1.0:  # the large points fix the scale: accurate, not just small
        torch.testing.assert_close(reward.double(), exact, rtol=1e-5, atol=0)


# -- sinkhorn -----------------------------------------------------------------------------------------


def _sign_pattern(batch: int, num_prototypes: int, seed: int) -> torch.Tensor:
    """+-1 with at least one +1 in every row and every column."""
    signs = torch.where(torch.randn(batch, num_prototypes, generator=_gen(seed)) > 0.5, 1.0, -1.0)
    signs[torch.arange(batch), torch.arange(batch) % num_prototypes] = 1.0
    signs[torch.arange(num_prototypes) % batch, torch.arange(num_prototypes)] = 1.0
    return signs


@pytest.mark.parametrize(("batch", "num_prototypes"), [(24, 24), (32, 8), (8, 32)])
def test_sinkhorn_plus_minus_1e30_puts_no_mass_on_minus_1e30(batch, num_prototypes):
    signs = _sign_pattern(batch, num_prototypes, seed=10)
    q = sinkhorn(signs * 1e30)
    _assert_assignments(q, (batch, num_prototypes))
    assert (q[signs < 0] == 0).all()  # exp(-2e30) relative to the +1e30 entries


@pytest.mark.parametrize("case", ["one_plus_1e30", "one_minus_1e30", "all_plus_1e30", "all_minus_1e30",
                                  "all_minus_1e30_but_one"])
def test_sinkhorn_single_1e30_entries_and_constants(case):
    scores = torch.randn(16, 12, generator=_gen(11))
    if case == "one_plus_1e30":
        scores[3, 5] = 1e30
    elif case == "one_minus_1e30":
        scores[3, 5] = -1e30
    elif case == "all_plus_1e30":
        scores = torch.full((16, 12), 1e30)
    elif case == "all_minus_1e30":
        scores = torch.full((16, 12), -1e30)
    else:
        scores = torch.full((16, 12), -1e30)
        scores[3, 5] = 0.5
    q = sinkhorn(scores)
    _assert_assignments(q, (16, 12))
    if case == "one_plus_1e30":
        assert q[3, 5] > 0.5  # sample 3 goes (mostly) to prototype 5
    if case == "one_minus_1e30":
        assert q[3, 5] == 0
    if case.startswith("all_plus") or case == "all_minus_1e30":
        torch.testing.assert_close(q, torch.full((16, 12), 1 / 12), atol=1e-6, rtol=0)
    if case == "all_minus_1e30_but_one":
        assert q[3, 5] == q[3].max() and q[3, 5] > 1 / 12
        others = torch.cat([torch.arange(5), torch.arange(6, 12)])
        torch.testing.assert_close(q[[0, 1, 2, 4]][:, others], torch.full((4, 11), 1 / 11), atol=1e-6, rtol=0)


@pytest.mark.parametrize("tau", [1e-3, 1e-30, 1e-37])
def test_sinkhorn_finite_for_tiny_temperatures(tau):
    """Scores as training builds them, z . c / tau, with temperatures far below the paper's 0.1."""
    scores = _unit(32, 16, seed=12) @ _unit(16, 16, seed=13).t() / tau
    assert torch.isfinite(scores).all()
    q = sinkhorn(scores)
    _assert_assignments(q, (32, 16))
    assert (q.argmax(dim=1) == scores.argmax(dim=1)).float().mean() > 0.5


@pytest.mark.parametrize("scale", [1.0, 1e30])
def test_sinkhorn_single_sample_is_uniform(scale):
    """B = 1: the equal partition gives each prototype 1/M of the one sample, whatever the scores."""
    scores = torch.randn(1, 16, generator=_gen(14)) * scale
    q = sinkhorn(scores)
    _assert_assignments(q, (1, 16))
    torch.testing.assert_close(q, torch.full((1, 16), 1 / 16), atol=1e-6, rtol=0)


@pytest.mark.parametrize("scale", [1.0, 1e30])
def test_sinkhorn_single_prototype_takes_everything(scale):
    scores = torch.randn(16, 1, generator=_gen(15)) * scale
    q = sinkhorn(scores)
    _assert_assignments(q, (16, 1))
    assert torch.equal(q, torch.ones(16, 1))


@pytest.mark.parametrize("value", [0.0, -1e30, 1e30])
def test_sinkhorn_one_by_one(value):
    assert torch.equal(sinkhorn(torch.tensor([[value]])), torch.ones(1, 1))


def test_sinkhorn_minus_inf_mask_that_leaves_every_row_and_column_an_option():
    scores = torch.randn(6, 5, generator=_gen(16))
    scores[0, 1:] = -INF  # sample 0 may only go to prototype 0 ...
    scores[1:, 0] = -INF  # ... and prototype 0 may only take sample 0
    q = sinkhorn(scores)
    _assert_assignments(q, (6, 5))
    assert (q[scores == -INF] == 0).all()
    assert q[0, 0] == 1


@pytest.mark.parametrize("case", ["all_but_one", "prototype_column", "sample_row", "one_by_one"])
def test_sinkhorn_infeasible_minus_inf_mask_is_not_hidden(case):
    """-inf lies outside sinkhorn's contract (finite scores) and outside training's range. When some
    sample or prototype has no finite score, no equal partition exists; the result must not pass for
    one: it is NaN, which makes repr_loss NaN and the Trainer stop with TrainingDiverged."""
    scores = torch.randn(6, 5, generator=_gen(17))
    if case == "all_but_one":
        scores = torch.full((6, 5), -INF)
        scores[2, 3] = 0.5
    elif case == "prototype_column":
        scores[:, 2] = -INF
    elif case == "sample_row":
        scores[4, :] = -INF
    else:
        scores = torch.tensor([[-INF]])
    assert not torch.isfinite(sinkhorn(scores)).all()


@pytest.mark.parametrize("scores", [[[3e38, -3e38]], [[-3e38] * 4, [-3e38, -3e38, 3e38, -3e38]]])
def test_sinkhorn_finite_for_any_finite_float32_scores(scores):
    scores = torch.tensor(scores)
    assert torch.isfinite(scores).all()
    _assert_assignments(sinkhorn(scores), tuple(scores.shape))


# -- sample_candidates --------------------------------------------------------------------------------


def _pick_indices(z: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """For each candidate, the indices of the rows of z it equals: asserts it equals at least one."""
    matches = (candidates[:, None, :] == z[None, :, :]).all(dim=2)  # (M, B)
    assert matches.any(dim=1).all(), "a candidate is not a row of z"
    return matches


@pytest.mark.parametrize("scale", [1.0, 1e15])  # 1e15: dot products of 1e30, identical over the batch
def test_sample_candidates_identical_rows(scale):
    z = _unit(1, 8, seed=20).repeat(16, 1) * scale
    prototypes = _unit(12, 8, seed=21) * scale
    candidates = sample_candidates(z, prototypes, generator=_gen(22))
    assert candidates.shape == (12, 8)
    assert torch.isfinite(candidates).all()
    _pick_indices(z, candidates)


def test_sample_candidates_extreme_dot_products_pick_the_argmax():
    """Dot products of +-1e30: the softmax over the batch is one-hot, so each prototype takes its
    best-matching row (and never an out-of-range or non-finite one)."""
    z = _unit(10, 8, seed=23) * 1e15
    prototypes = _unit(32, 8, seed=24) * 1e15
    dots = prototypes @ z.t()
    assert dots.abs().max() > 1e29 and torch.isfinite(dots).all()
    for seed in range(3):
        candidates = sample_candidates(z, prototypes, generator=_gen(seed))
        assert candidates.shape == (32, 8) and torch.isfinite(candidates).all()
        assert torch.equal(candidates, z[dots.argmax(dim=1)])


def test_sample_candidates_extreme_negative_dot_products_stay_in_the_batch():
    """Every dot product hugely negative (prototype opposite the whole batch): still rows of z."""
    z = F.normalize(_unit(10, 8, seed=25) + 3 * torch.eye(8)[0], dim=1) * 1e15  # all near +e_0
    prototypes = -F.normalize(torch.eye(8)[:1] + 0.01 * _unit(4, 8, seed=26), dim=1) * 1e15
    dots = prototypes @ z.t()
    assert (dots < -1e29).all()
    candidates = sample_candidates(z, prototypes, generator=_gen(27))
    assert torch.isfinite(candidates).all()
    assert (_pick_indices(z, candidates).sum(dim=1) == 1).all()
    assert torch.equal(candidates, z[dots.argmax(dim=1)])


# -- the agent ----------------------------------------------------------------------------------------


@pytest.fixture
def black_replay(random_replay) -> ReplayBuffer:
    """conftest's random replay buffer with every frame zero (a black screen) and every reward 0."""
    random_replay.frames[:] = 0
    random_replay.rewards[:] = 0.0
    assert len(random_replay) >= 8
    return random_replay


@pytest.mark.parametrize("phase", ["pretrain", "frozen"])
def test_update_on_a_black_screen_is_finite(build_agent, black_replay, phase):
    """All-zero frames give all-zero conv features (biases start at 0), identical projections and
    a zero-variance LayerNorm input in the SAC trunks: every metric and parameter must stay finite."""
    agent = build_agent(phase, seed=0)
    metrics = {}
    for step in range(4):  # steps 0 and 2 also update the actor and temperature
        step_metrics = update(agent, black_replay, step)
        bad = {k: v for k, v in step_metrics.items() if not torch.isfinite(v).all()}
        assert not bad, f"step {step}: {bad}"
        metrics.update(step_metrics)
    expected = {"critic_loss", "critic_q", "actor_loss", "alpha", "intr_reward_mean", "intr_reward_std"}
    expected |= {"repr_loss"} if phase == "pretrain" else {"extr_reward_mean"}
    assert expected <= set(metrics), sorted(metrics)
    assert metrics["intr_reward_mean"] == pytest.approx(0.0, abs=1e-6)  # every projection is the same
    modules = {"encoder": agent.encoder, "head": agent.head, "actor": agent.sac.actor, "critic": agent.sac.critic}
    for name, module in modules.items():
        for pname, p in module.named_parameters():
            assert torch.isfinite(p).all(), f"{name}.{pname}"
    assert torch.isfinite(agent.queue.filled()).all()


def test_update_metrics_finite_with_batch_size_one(build_agent, make_cfg, random_replay):
    agent = build_agent("pretrain", cfg=make_cfg(batch_size=1), seed=0)
    metrics = update(agent, random_replay, 0)
    bad = {k: v for k, v in metrics.items() if not torch.isfinite(v).all()}
    assert not bad
