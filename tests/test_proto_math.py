"""Tests of the Proto-RL math in `protorl.agents.proto.math` against the paper (section 4, appendix D)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from protorl.agents.proto.math import (
    CandidateQueue,
    ProtoHead,
    cluster_assignment_loss,
    knn_reward,
    sample_candidates,
    sinkhorn,
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _unit(rows: int, dim: int, gen: torch.Generator, dtype=torch.float32) -> torch.Tensor:
    return F.normalize(torch.randn(rows, dim, generator=gen, dtype=dtype), dim=1)


def _realistic_scores(batch: int, num_prototypes: int, seed: int, tau: float = 0.1,
                      dtype=torch.float32) -> torch.Tensor:
    """Dot products of unit projections and unit prototypes divided by a temperature, as in training."""
    gen = _gen(seed)
    z = _unit(batch, 16, gen, dtype)
    c = _unit(num_prototypes, 16, gen, dtype)
    return z @ c.t() / tau


def paper_sinkhorn(scores: torch.Tensor, n: int = 3) -> torch.Tensor:
    """Literal transcription of appendix D's `sinkhorn` (with the typo sum(Q, dim=0) read as sum(S, dim=0))."""
    batch, num_prototypes = scores.shape
    s = torch.exp(scores).t()  # (M, B)
    s = s / s.sum()
    r = torch.ones(num_prototypes, dtype=scores.dtype) / num_prototypes
    c = torch.ones(batch, dtype=scores.dtype) / batch
    for _ in range(n):
        u = s.sum(dim=1)
        s = s * (r / u).unsqueeze(1)
        s = s * (c / s.sum(dim=0)).unsqueeze(0)
    return (s / s.sum(dim=0, keepdim=True)).t()


def _marginal_deviation(q: torch.Tensor) -> float:
    """Largest deviation of a prototype's mass from the equal share B / M."""
    batch, num_prototypes = q.shape
    return (q.sum(dim=0) - batch / num_prototypes).abs().max().item()


# -- sinkhorn -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(32, 32), (64, 16), (10, 40)])
@pytest.mark.parametrize("n_iters", [0, 1, 3, 7])
def test_sinkhorn_rows_are_distributions(shape, n_iters):
    q = sinkhorn(_realistic_scores(*shape, seed=1), n_iters=n_iters)
    assert q.shape == shape
    assert q.dtype == torch.float32
    assert (q >= 0).all()
    torch.testing.assert_close(q.sum(dim=1), torch.ones(shape[0]), atol=1e-5, rtol=0)


def test_sinkhorn_equalises_prototype_marginals():
    scores = _realistic_scores(32, 32, seed=2)
    softmax_dev = _marginal_deviation(torch.softmax(scores, dim=1))
    sinkhorn_dev = _marginal_deviation(sinkhorn(scores, n_iters=3))
    # Without the equal-partition constraint some prototypes get well over twice their share.
    assert softmax_dev > 1.0
    # Three Sinkhorn iterations bring every prototype within 20% of its share B / M = 1 ...
    assert sinkhorn_dev < 0.2
    # ... and much closer than the plain softmax.
    assert sinkhorn_dev < softmax_dev / 5


def test_sinkhorn_more_iterations_move_marginals_closer_to_uniform():
    scores = _realistic_scores(32, 32, seed=3)
    devs = [_marginal_deviation(sinkhorn(scores, n_iters=n)) for n in (0, 1, 3, 10, 50)]
    assert all(a > b for a, b in itertools.pairwise(devs)), devs
    assert devs[-1] < 1e-4


@pytest.mark.parametrize("shape", [(32, 32), (48, 12), (8, 24)])
@pytest.mark.parametrize("n_iters", [0, 1, 3, 5])
def test_sinkhorn_matches_paper_pseudocode(shape, n_iters):
    scores = _realistic_scores(*shape, seed=4, dtype=torch.float64)
    expected = paper_sinkhorn(scores, n=n_iters)
    actual = sinkhorn(scores, n_iters=n_iters)
    assert actual.dtype == torch.float64
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=0)


def test_sinkhorn_matches_paper_pseudocode_float32_input():
    scores64 = _realistic_scores(40, 20, seed=5, dtype=torch.float64)
    actual = sinkhorn(scores64.float(), n_iters=3)
    torch.testing.assert_close(actual.double(), paper_sinkhorn(scores64, n=3), atol=1e-5, rtol=0)


def test_sinkhorn_float64_input_keeps_float64_precision():
    scores = _realistic_scores(32, 16, seed=6, dtype=torch.float64)
    torch.testing.assert_close(sinkhorn(scores, n_iters=3), paper_sinkhorn(scores, n=3), atol=1e-10, rtol=0)


@pytest.mark.parametrize("case", ["huge_positive", "huge_negative", "all_equal", "duplicated_rows"])
def test_sinkhorn_is_finite_for_extreme_scores(case):
    base = _realistic_scores(24, 24, seed=7)
    if case == "huge_positive":
        scores = base * 1e4
    elif case == "huge_negative":
        scores = base * 1e4 - 1e4
    elif case == "all_equal":
        scores = torch.full((24, 24), 3.0)
    else:
        scores = base[:6].repeat(4, 1)
    q = sinkhorn(scores, n_iters=3)
    assert torch.isfinite(q).all()
    assert (q >= 0).all()
    torch.testing.assert_close(q.sum(dim=1), torch.ones(24), atol=1e-5, rtol=0)
    if case == "all_equal":
        torch.testing.assert_close(q, torch.full((24, 24), 1 / 24), atol=1e-6, rtol=0)
    if case == "duplicated_rows":
        torch.testing.assert_close(q[:6], q[6:12], atol=1e-6, rtol=0)
        torch.testing.assert_close(q[:6], q[18:], atol=1e-6, rtol=0)


def test_sinkhorn_huge_scores_agree_with_the_paper_where_it_is_finite():
    # Scores shifted by a constant give the same assignments: the paper's version overflows at 1e4 but the
    # shift-invariant result can be checked on the shifted-down scores.
    base = _realistic_scores(16, 16, seed=8, dtype=torch.float64)
    shifted = base + 800.0  # exp(800 + 10) overflows float64
    assert not torch.isfinite(torch.exp(shifted)).all()
    # (atol allows for the float32 rounding of scores near 800; a failure here would be NaN or garbage)
    torch.testing.assert_close(sinkhorn(shifted, n_iters=3), paper_sinkhorn(base, n=3), atol=5e-5, rtol=0)


# -- knn_reward ---------------------------------------------------------------------------------------


def _brute_force_knn(z: torch.Tensor, queue: torch.Tensor, k: int) -> torch.Tensor:
    out = []
    for row in z.double().tolist():
        distances = sorted(
            math.sqrt(sum((a - b) ** 2 for a, b in zip(row, entry, strict=True))) for entry in queue.double().tolist()
        )
        out.append([distances[k - 1]])
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_knn_reward_matches_brute_force(k):
    gen = _gen(10)
    z = _unit(40, 8, gen)  # > 25 rows, so torch.cdist takes its matrix-multiply path
    queue = _unit(60, 8, gen)
    reward = knn_reward(z, queue, k=k)
    assert reward.shape == (40, 1)
    torch.testing.assert_close(reward.double(), _brute_force_knn(z, queue, k), atol=1e-5, rtol=0)


def test_knn_reward_is_accurate_for_nearby_embeddings():
    """Early in training all frames look alike and unit-norm projections sit within ~1e-3 of each other.
    The plain matrix-multiply distance form would return float32 noise (~1e-3) there."""
    gen = _gen(15)
    direction = torch.nn.functional.normalize(torch.randn(1, 128, generator=gen, dtype=torch.float64), dim=1)
    points = torch.nn.functional.normalize(direction + 1e-3 * torch.randn(600, 128, generator=gen,
                                                                          dtype=torch.float64), dim=1)
    z64, queue64 = points[:100], points[100:]
    exact = _brute_force_knn(z64[:10], queue64, 3)
    assert exact.max() < 2e-2  # the regime this test is about
    torch.testing.assert_close(knn_reward(z64[:10], queue64, k=3), exact, rtol=1e-9, atol=0)
    reward32 = knn_reward(z64[:10].float(), queue64.float(), k=3).double()
    torch.testing.assert_close(reward32, exact, rtol=1e-3, atol=1e-6)


def test_knn_reward_is_kth_not_first_or_last():
    gen = _gen(11)
    z = _unit(30, 6, gen)
    queue = _unit(50, 6, gen)
    third = knn_reward(z, queue, k=3)
    assert (third > knn_reward(z, queue, k=1) + 1e-4).all()
    assert (third < knn_reward(z, queue, k=50) - 1e-4).all()


def test_knn_reward_unnormalised_inputs_match_brute_force():
    gen = _gen(12)
    z = torch.randn(7, 5, generator=gen) * 3
    queue = torch.randn(9, 5, generator=gen) * 3
    torch.testing.assert_close(knn_reward(z, queue, k=2).double(), _brute_force_knn(z, queue, 2),
                               atol=1e-4, rtol=0)


def test_knn_reward_zero_for_queue_members():
    gen = _gen(13)
    queue64 = _unit(64, 32, gen, torch.float64)
    z64 = queue64[10:50]
    assert knn_reward(z64, queue64, k=1).abs().max().item() < 1e-6
    # float32 via cdist's matrix-multiply form: |a|^2 + |b|^2 - 2ab loses ~sqrt(eps), far below the ~1.4
    # distance between random unit vectors in 32 dimensions.
    queue32 = queue64.float()
    assert knn_reward(queue32[10:50], queue32, k=1).abs().max().item() < 2e-3
    # the nearest *other* member is far away
    assert knn_reward(queue32[10:50], queue32, k=2).min().item() > 0.5


def test_knn_reward_counts_duplicate_queue_rows():
    gen = _gen(14)
    queue = _unit(6, 4, gen, torch.float64)
    queue = torch.cat([queue, queue[:1]])  # row 0 twice
    z = queue[:1]
    assert knn_reward(z, queue, k=2).item() == pytest.approx(0.0, abs=1e-6)
    assert knn_reward(z, queue, k=3).item() > 0.1


def test_knn_reward_accepts_exactly_k_rows_and_rejects_fewer():
    gen = _gen(15)
    z = _unit(4, 3, gen)
    queue = _unit(3, 3, gen)
    torch.testing.assert_close(knn_reward(z, queue, k=3).double(), _brute_force_knn(z, queue, 3),
                               atol=1e-5, rtol=0)
    with pytest.raises(ValueError):
        knn_reward(z, queue[:2], k=3)
    with pytest.raises(ValueError):
        knn_reward(z, queue[:0], k=1)


# -- cluster_assignment_loss --------------------------------------------------------------------------


def test_cluster_assignment_loss_by_hand_and_cross_entropy():
    gen = _gen(20)
    logits = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    log_p = torch.log_softmax(logits, dim=1)
    q = torch.softmax(torch.randn(6, 5, generator=gen, dtype=torch.float64) * 2, dim=1)
    expected = 0.0
    for b in range(6):
        expected += -sum(q[b, m].item() * log_p[b, m].item() for m in range(5))
    expected /= 6
    loss = cluster_assignment_loss(log_p, q)
    assert loss.shape == ()
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert loss.item() == pytest.approx(F.cross_entropy(logits, q).item(), abs=1e-12)


def test_cluster_assignment_loss_gradient_is_softmax_minus_target():
    gen = _gen(21)
    logits = torch.randn(4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    q = torch.softmax(torch.randn(4, 3, generator=gen, dtype=torch.float64), dim=1)
    cluster_assignment_loss(torch.log_softmax(logits, dim=1), q).backward()
    expected = (torch.softmax(logits.detach(), dim=1) - q) / 4
    torch.testing.assert_close(logits.grad, expected, atol=1e-12, rtol=0)


# -- sample_candidates --------------------------------------------------------------------------------


def test_sample_candidates_returns_rows_of_z():
    gen = _gen(30)
    z = _unit(20, 8, gen)
    prototypes = _unit(12, 8, gen)
    candidates = sample_candidates(z, prototypes, generator=_gen(31))
    assert candidates.shape == (12, 8)
    for row in candidates:
        assert (z == row).all(dim=1).any()
    torch.testing.assert_close(candidates, sample_candidates(z, prototypes, generator=_gen(31)))


def _picks(z: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Index in z of each candidate row."""
    matches = (candidates[:, None, :] == z[None, :, :]).all(dim=2)  # (M, B)
    assert (matches.sum(dim=1) == 1).all()
    return matches.float().argmax(dim=1)


def test_sample_candidates_follow_softmax_over_the_batch():
    gen = _gen(32)
    batch, dim, draws = 5, 3, 4000
    z = _unit(batch, dim, gen, torch.float64)
    # two prototypes, each repeated `draws` times: one call gives `draws` independent picks for each
    protos = torch.stack([z[2], -z[4]])
    prototypes = protos.repeat_interleave(draws, dim=0)
    picks = _picks(z, sample_candidates(z, prototypes, generator=_gen(33))).view(2, draws)
    for j in range(2):
        counts = torch.bincount(picks[j], minlength=batch).double()
        probs = torch.softmax(z @ protos[j], dim=0)  # softmax_i(z_i . c_j), no temperature
        expected = probs * draws
        chi2 = ((counts - expected) ** 2 / expected).sum().item()
        assert chi2 < 30.0, (counts, expected)  # 4 degrees of freedom: p < 1e-5
        assert counts.argmax().item() == (z @ protos[j]).argmax().item()
    # the preference is mild (scores in [-1, 1]) yet visible: the prototype's own row is picked most often
    counts0 = torch.bincount(picks[0], minlength=batch)
    assert counts0.argmax().item() == 2
    assert counts0.min().item() > 0


def test_sample_candidates_are_independent_per_prototype_not_one_shared_draw():
    gen = _gen(34)
    z = _unit(16, 4, gen)
    prototypes = z[:1].repeat(64, 1)
    picks = _picks(z, sample_candidates(z, prototypes, generator=_gen(35)))
    assert len(set(picks.tolist())) > 4


# -- CandidateQueue -----------------------------------------------------------------------------------


def _batch(batch_id: int, rows: int, dim: int) -> torch.Tensor:
    """Rows tagged (batch_id, row_index, ...)."""
    out = torch.zeros(rows, dim)
    out[:, 0] = batch_id
    out[:, 1] = torch.arange(rows)
    return out


def _row_set(t: torch.Tensor) -> list[tuple[float, ...]]:
    return sorted(tuple(r) for r in t.tolist())


def test_candidate_queue_keeps_the_last_T_batches():
    num_prototypes, horizon, dim = 4, 3, 5
    queue = CandidateQueue(num_prototypes * horizon, dim)
    assert queue.capacity == 12
    assert queue.filled().shape == (0, dim)
    batches = []
    for step in range(7):
        batches.append(_batch(step, num_prototypes, dim))
        queue.enqueue(batches[-1])
        assert queue.filled().shape == (min(num_prototypes * (step + 1), 12), dim)
        assert queue.pointer == (num_prototypes * (step + 1)) % 12
        expected = torch.cat(batches[-horizon:])
        assert _row_set(queue.filled()) == _row_set(expected)


def test_candidate_queue_wraps_inside_a_batch():
    queue = CandidateQueue(10, 3)
    rows = torch.arange(12 * 3, dtype=torch.float32).view(12, 3)
    for start in range(0, 12, 4):
        queue.enqueue(rows[start:start + 4])
    # 12 rows into 10 slots: rows 0 and 1 were overwritten by rows 10 and 11
    assert queue.pointer == 2
    assert _row_set(queue.filled()) == _row_set(rows[2:])
    queue.enqueue(rows[:1] + 1000)
    assert _row_set(queue.filled()) == _row_set(torch.cat([rows[3:], rows[:1] + 1000]))


def test_candidate_queue_state_dict_round_trip():
    queue = CandidateQueue(8, 4)
    queue.enqueue(_batch(1, 3, 4))
    queue.enqueue(_batch(2, 3, 4))
    state = queue.state_dict()
    queue.enqueue(_batch(3, 3, 4))  # must not leak into the saved state
    restored = CandidateQueue(8, 4)
    restored.load_state_dict(state)
    assert restored.pointer == 6 and restored.filled().shape == (6, 4)
    assert _row_set(restored.filled()) == _row_set(torch.cat([_batch(1, 3, 4), _batch(2, 3, 4)]))
    reference = CandidateQueue(8, 4)
    reference.enqueue(_batch(1, 3, 4))
    reference.enqueue(_batch(2, 3, 4))
    for step in (4, 5, 6):
        restored.enqueue(_batch(step, 3, 4))
        reference.enqueue(_batch(step, 3, 4))
        torch.testing.assert_close(restored.filled(), reference.filled())
        assert restored.pointer == reference.pointer


# -- ProtoHead ----------------------------------------------------------------------------------------


def test_proto_head_prototypes_unit_norm_after_normalize():
    torch.manual_seed(0)
    head = ProtoHead(repr_dim=10, proj_dim=8, pred_hidden_dim=16, num_prototypes=5)
    torch.testing.assert_close(head.prototypes.norm(dim=1), torch.ones(5))
    scale = torch.tensor([0.1, 2.0, 7.0, 0.5, 30.0])[:, None]
    with torch.no_grad():
        head.prototypes.mul_(scale)
    before = head.prototypes.detach().clone()
    assert not torch.allclose(before.norm(dim=1), torch.ones(5))
    head.normalize_prototypes_()
    assert isinstance(head.prototypes, torch.nn.Parameter)
    torch.testing.assert_close(head.prototypes.norm(dim=1), torch.ones(5))
    torch.testing.assert_close(head.prototypes.detach() * before.norm(dim=1, keepdim=True), before)


def test_proto_head_project_is_unit_norm_and_parallel_to_projector():
    torch.manual_seed(0)
    head = ProtoHead(repr_dim=10, proj_dim=8, pred_hidden_dim=16, num_prototypes=5)
    y = torch.randn(7, 10, generator=_gen(40)) * 5
    z = head.project(y)
    assert z.shape == (7, 8)
    torch.testing.assert_close(z.norm(dim=1), torch.ones(7))
    raw = head.projector(y)
    cosine = (z * raw).sum(dim=1) / raw.norm(dim=1)
    torch.testing.assert_close(cosine, torch.ones(7))
    assert head.predictor(z).shape == (7, 8)
