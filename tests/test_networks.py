"""Encoder, actor and critic architectures (appendix C.2 and C.4) and the EMA helper."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from protorl.agents import SAC
from protorl.agents.networks import (
    CPU_MICRO_BATCH,
    Actor,
    Critic,
    PixelEncoder,
    StateEncoder,
    micro_batch_for,
    soft_update,
)
from protorl.config import AgentConfig
from tests.agents import PIXEL_OBS_SHAPE, tiny_agent, tiny_config


def test_pixel_encoder_paper_shape():
    encoder = PixelEncoder((9, 84, 84))
    assert encoder.repr_dim == 39200 == 32 * 35 * 35
    out = encoder(torch.randint(0, 256, (2, 9, 84, 84), dtype=torch.uint8))
    assert out.shape == (2, 39200)
    assert out.dtype == torch.float32


@pytest.mark.parametrize(("size", "side"), [(64, 25), (32, 9), (100, 43)])
def test_pixel_encoder_repr_dim_follows_input_shape(size, side):
    encoder = PixelEncoder((9, size, size))
    assert encoder.repr_dim == 32 * side * side
    out = encoder(torch.zeros(3, 9, size, size, dtype=torch.uint8))
    assert out.shape == (3, encoder.repr_dim)


def test_pixel_encoder_other_channel_count():
    encoder = PixelEncoder((6, 64, 48))  # 2 stacked frames, non-square
    assert encoder.repr_dim == 32 * 25 * 17
    assert encoder(torch.zeros(1, 6, 64, 48, dtype=torch.uint8)).shape == (1, 32 * 25 * 17)


def test_pixel_encoder_layers():
    encoder = PixelEncoder((9, 84, 84))
    convs = [m for m in encoder.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 4
    assert [c.stride for c in convs] == [(2, 2), (1, 1), (1, 1), (1, 1)]
    assert all(c.kernel_size == (3, 3) for c in convs)
    assert all(c.out_channels == 32 for c in convs)
    assert convs[0].in_channels == 9 and all(c.in_channels == 32 for c in convs[1:])
    assert all(c.padding == (0, 0) for c in convs)
    # a ReLU after every conv layer, nothing else
    layers = list(encoder.convnet)
    assert [type(m) for m in layers] == [nn.Conv2d, nn.ReLU] * 4


def test_pixel_encoder_scales_pixels_to_unit_range():
    """uint8 pixels are divided by 255: feeding x (uint8) equals feeding x / 255 through the raw convnet."""
    torch.manual_seed(0)
    encoder = PixelEncoder((9, 32, 32))
    obs = torch.randint(0, 256, (4, 9, 32, 32), dtype=torch.uint8)
    expected = encoder.convnet(obs.float() / 255.0).permute(0, 2, 3, 1).flatten(1)  # (H, W, C) order
    torch.testing.assert_close(encoder(obs), expected, rtol=1e-5, atol=1e-6)
    # outputs are ReLU features: non-negative
    assert (encoder(obs) >= 0).all()


def _encoder_grads(encoder: PixelEncoder, obs: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, list]:
    encoder.zero_grad(set_to_none=True)
    features = encoder(obs)
    (features * weights).sum().backward()  # a loss that weighs every sample and feature differently
    return features.detach(), [p.grad.clone() for p in encoder.parameters()]


@pytest.mark.parametrize("micro_batch", [1, 3, 8])
def test_micro_batched_encoder_equals_whole_batch_pass(micro_batch):
    """Convolving in micro-batches (autograd accumulating the weight gradients over them) gives the
    whole-batch features and gradients, to float rounding, for micro-batches that do and do not divide B."""
    torch.manual_seed(0)
    whole = PixelEncoder((9, 32, 32))
    split = PixelEncoder((9, 32, 32), micro_batch=micro_batch)
    split.load_state_dict(whole.state_dict())
    obs = torch.randint(0, 256, (10, 9, 32, 32), dtype=torch.uint8)
    weights = torch.randn(10, whole.repr_dim)
    features, grads = _encoder_grads(whole, obs, weights)
    split_features, split_grads = _encoder_grads(split, obs, weights)
    torch.testing.assert_close(split_features, features, rtol=1e-5, atol=1e-6)
    for got, expected in zip(split_grads, grads, strict=True):  # sums over B in another order: relative to norm
        assert (got - expected).norm() <= 1e-5 * expected.norm()
    assert any((g != 0).any() for g in grads)  # the comparison is not of zeros


def test_default_cpu_slicing_leaves_batches_up_to_its_size_exactly_as_whole():
    """On a CPU the default slicing (`CPU_MICRO_BATCH`) gives bitwise the whole-batch features for any batch, and
    bitwise the whole-batch gradients for a batch of its size (one slice): runs at batch <= CPU_MICRO_BATCH compute
    exactly what an unsliced encoder computes."""
    torch.manual_seed(0)
    whole = PixelEncoder((9, 84, 84))
    split = PixelEncoder((9, 84, 84), micro_batch=micro_batch_for(torch.device("cpu"), None))
    split.load_state_dict(whole.state_dict())
    obs = torch.randint(0, 256, (2 * CPU_MICRO_BATCH + 3, 9, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        assert torch.equal(split(obs), whole(obs))
    first = obs[:CPU_MICRO_BATCH]
    weights = torch.randn(CPU_MICRO_BATCH, whole.repr_dim)
    features, grads = _encoder_grads(whole, first, weights)
    split_features, split_grads = _encoder_grads(split, first, weights)
    assert torch.equal(split_features, features)
    assert all(torch.equal(got, expected) for got, expected in zip(split_grads, grads, strict=True))


def test_bf16_autocast_encoder_is_close_to_float32():
    torch.manual_seed(0)
    encoder = PixelEncoder((9, 32, 32))
    bf16 = PixelEncoder((9, 32, 32), bf16=True)
    bf16.load_state_dict(encoder.state_dict())
    obs = torch.randint(0, 256, (4, 9, 32, 32), dtype=torch.uint8)
    expected, got = encoder(obs), bf16(obs)
    assert got.dtype == torch.float32 and not torch.equal(got, expected)  # it did compute in bfloat16
    assert (got - expected).norm() / expected.norm() < 0.02


def test_state_encoder_shape():
    encoder = StateEncoder((5,), hidden_dim=64)
    assert encoder.repr_dim == 64
    out = encoder(torch.randn(3, 5, dtype=torch.float64))
    assert out.shape == (3, 64) and out.dtype == torch.float32


@pytest.mark.parametrize("scale", [1.0, 1e4, 1e8])
def test_actor_log_std_within_bounds_for_extreme_inputs(scale):
    torch.manual_seed(0)
    low, high = -10.0, 2.0
    actor = Actor(repr_dim=20, action_dim=3, feature_dim=8, hidden_dim=16, hidden_depth=2,
                  log_std_bounds=(low, high))
    # make the policy's raw log-std outputs huge in both directions
    with torch.no_grad():
        last = actor.policy[-1]
        last.weight.mul_(scale)
        last.bias[3:] = torch.tensor([scale * 1e3, -scale * 1e3, 0.0])
    features = torch.randn(64, 20) * scale
    dist = actor(features)
    log_std = dist.scale.log()
    assert torch.isfinite(log_std).all()
    assert (log_std >= low - 1e-5).all() and (log_std <= high + 1e-5).all()
    if scale >= 1e4:  # the bounds are actually reached at the extremes
        assert log_std[:, 0].min() > high - 1e-3
        assert log_std[:, 1].max() < low + 1e-3
    action = dist.rsample()
    assert action.shape == (64, 3)
    assert (action.abs() <= 1).all()
    assert (dist.mean.abs() <= 1).all()


@pytest.mark.slow
def test_actor_critic_trunks_default_config():
    cfg = AgentConfig()
    sac = SAC(repr_dim=39200, action_dim=6, cfg=cfg, device=torch.device("cpu"))
    for module in (sac.actor, sac.critic, sac.critic_target):
        trunk = list(module.trunk)
        assert [type(m) for m in trunk] == [nn.Linear, nn.LayerNorm]
        assert (trunk[0].in_features, trunk[0].out_features) == (39200, 50)
        assert trunk[1].normalized_shape == (50,)
    # policy MLP: 50 -> 1024 -> 1024 -> 2|A| (hidden_depth 2); Q heads take [h, a]
    linears = [m for m in sac.actor.policy if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(50, 1024), (1024, 1024), (1024, 12)]
    for head in (sac.critic.q1, sac.critic.q2):
        linears = [m for m in head if isinstance(m, nn.Linear)]
        assert [(m.in_features, m.out_features) for m in linears] == [(56, 1024), (1024, 1024), (1024, 1)]
    assert sac.actor.log_std_bounds == (-10.0, 2.0)
    assert sac.target_entropy == -6.0
    assert math.isclose(sac.alpha.item(), 0.1, rel_tol=1e-6)


def test_critic_returns_two_independent_q_heads():
    torch.manual_seed(0)
    critic = Critic(repr_dim=20, action_dim=3, feature_dim=8, hidden_dim=16, hidden_depth=2)
    q1, q2 = critic(torch.randn(5, 20), torch.rand(5, 3) * 2 - 1)
    assert q1.shape == (5, 1) and q2.shape == (5, 1)
    assert not torch.equal(q1, q2)
    assert not set(map(id, critic.q1.parameters())) & set(map(id, critic.q2.parameters()))
    # the action is an input: changing it changes both Q values
    features = torch.randn(5, 20)
    a, b = critic(features, torch.zeros(5, 3)), critic(features, torch.ones(5, 3))
    assert not torch.allclose(a[0], b[0]) and not torch.allclose(a[1], b[1])


def test_soft_update_moves_target_by_tau():
    torch.manual_seed(0)
    online = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    target = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    with torch.no_grad():
        for p in target.parameters():
            p.normal_()
    before = [p.detach().clone() for p in target.parameters()]
    online_before = [p.detach().clone() for p in online.parameters()]
    tau = 0.05
    soft_update(online, target, tau)
    for p_online, p_old, p_new, p_online_before in zip(online.parameters(), before, target.parameters(),
                                                        online_before, strict=True):
        torch.testing.assert_close(p_new, tau * p_online + (1 - tau) * p_old, rtol=0, atol=1e-6)
        torch.testing.assert_close(p_new - p_old, tau * (p_online - p_old), rtol=1e-4, atol=1e-7)
        assert torch.equal(p_online, p_online_before)  # the online network is untouched


def test_soft_update_extremes():
    torch.manual_seed(0)
    online, target = nn.Linear(4, 3), nn.Linear(4, 3)
    old = [p.detach().clone() for p in target.parameters()]
    soft_update(online, target, 0.0)
    assert all(torch.equal(p, o) for p, o in zip(target.parameters(), old, strict=True))
    soft_update(online, target, 1.0)
    assert all(torch.equal(p, o) for p, o in zip(target.parameters(), online.parameters(), strict=True))


@pytest.mark.slow
def test_compiled_encoder_of_an_agent_gives_the_eager_features_and_keeps_its_state_dict():
    """`agent.compile_encoder` compiles Proto-RL's pixel encoders in place: the same features, and snapshots and
    checkpoints keep their keys."""
    eager = tiny_agent("proto", "pretrain", seed=0)
    compiled = tiny_agent("proto", "pretrain", cfg=tiny_config("proto", compile_encoder=True), seed=0)
    assert compiled.encoder.state_dict().keys() == eager.encoder.state_dict().keys()
    obs = torch.randint(0, 256, (4, *PIXEL_OBS_SHAPE), dtype=torch.uint8)
    with torch.no_grad():
        torch.testing.assert_close(compiled.encoder(obs), eager.encoder(obs), rtol=1e-5, atol=1e-6)
