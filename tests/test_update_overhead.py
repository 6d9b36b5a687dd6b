"""The update without per-op overhead computes what the plain PyTorch forms compute, bit for bit, and never
waits for the device: the policy distribution, the collapse diagnostics, the logged averages, and the count
of host synchronisations in every agent's update."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import distributions as pyd
from torch.utils._python_dispatch import TorchDispatchMode

from protorl.agents import BUILT_IN
from protorl.agents.diagnostics import projection_diagnostics
from protorl.agents.networks import Actor
from protorl.logs.logger import Logger
from protorl.replay import ReplayBuffer
from tests.agents import POINT_MASS_ACTION_SHAPE, tiny_agent, update

# aten operators that make an accelerator wait for its queue: a scalar read back, or an output shaped by the data
SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive",
            "repeat_interleave"}
STATE_SHAPE = (4,)


def _reference_distribution(dist):
    return pyd.TransformedDistribution(pyd.Normal(dist.loc, dist.scale), [pyd.TanhTransform(cache_size=1)])


def test_squashed_normal_is_torch_distributions_tanh_normal_bit_for_bit():
    torch.manual_seed(0)
    actor = Actor(10, 3, 8, 16, 2, (-10.0, 2.0))
    dist = actor(torch.randn(64, 10))
    reference = _reference_distribution(dist)
    torch.manual_seed(1)
    action = dist.rsample()
    log_prob = dist.log_prob(action)
    torch.manual_seed(1)
    ref_action = reference.rsample()
    ref_log_prob = reference.log_prob(ref_action)
    assert torch.equal(action, ref_action) and torch.equal(log_prob, ref_log_prob)
    weight = actor.policy[0].weight
    grad = torch.autograd.grad(log_prob.sum() + action.sum(), weight, retain_graph=True)[0]
    ref_grad = torch.autograd.grad(ref_log_prob.sum() + ref_action.sum(), weight)[0]
    assert torch.equal(grad, ref_grad)
    for seed in (2, 3):
        torch.manual_seed(seed)
        sample = dist.sample()
        torch.manual_seed(seed)
        assert torch.equal(sample, reference.sample())
    inside = torch.rand(64, 3) * 1.8 - 0.9  # actions it did not sample: the log-density through atanh
    assert torch.equal(dist.log_prob(inside), reference.log_prob(inside))


def test_distinct_prototypes_counts_what_torch_unique_counts():
    generator = torch.Generator().manual_seed(0)
    for spread in (0.01, 1.0, 100.0):
        raw = torch.randn(32, 16, generator=generator) * spread + 1.0
        prototypes = torch.nn.functional.normalize(torch.randn(64, 16, generator=generator), dim=1)
        nearest = (torch.nn.functional.normalize(raw, dim=1) @ prototypes.t()).argmax(dim=1)
        metrics = projection_diagnostics(raw, prototypes=prototypes)
        assert metrics["repr/distinct_prototypes"].item() == torch.unique(nearest).numel()


def test_logger_averages_tensor_metrics_as_it_averages_numbers_and_reports_non_finite(tmp_path):
    values = np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32)
    numbers = Logger(tmp_path / "numbers", ("a", "b", "c"), tensorboard=False)
    tensors = Logger(tmp_path / "tensors", ("a", "b", "c"), tensorboard=False)
    for row in values:
        numbers.accumulate({"a": float(row[0]), "b": float(row[1]), "c": float(row[2])})
        tensors.accumulate({"a": torch.tensor(row[0]), "b": torch.tensor(row[1], dtype=torch.float64),
                            "c": float(row[2])})
    episode = {"frames": 100}
    assert numbers.log_train(episode) == tensors.log_train(episode)
    tensors.accumulate({"a": torch.tensor(1.0), "b": torch.tensor(math.inf, dtype=torch.float64)})
    tensors.accumulate({"a": torch.tensor(math.nan), "b": torch.tensor(2.0, dtype=torch.float64)})
    bad = tensors.flush()
    assert set(bad) == {"a", "b"} and math.isnan(bad["a"]) and bad["b"] == math.inf
    assert tensors.flush() == {}
    numbers.close()
    tensors.close()


class _CountSyncs(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in SYNC_OPS:
            self.syncs.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _filled_replay(obs_type: str) -> ReplayBuffer:
    rng = np.random.default_rng(0)
    if obs_type == "states":
        replay = ReplayBuffer(STATE_SHAPE, np.float32, POINT_MASS_ACTION_SHAPE, 200, frame_stack=1)
        make = lambda: rng.normal(size=STATE_SHAPE).astype(np.float32)  # noqa: E731
    else:
        replay = ReplayBuffer((3, 32, 32), np.uint8, POINT_MASS_ACTION_SHAPE, 200, frame_stack=3)
        make = lambda: rng.integers(0, 256, (3, 32, 32), dtype=np.uint8)  # noqa: E731
    replay.add_first(make())
    for _ in range(60):
        replay.add(make(), rng.uniform(-1, 1, 2).astype(np.float32), float(rng.uniform()), 1.0)
    return replay


@pytest.mark.parametrize("obs_type", ["states", "pixels"])
@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_updates_wait_for_the_device_at_most_twice(name, obs_type):
    """Counted on a CPU: the aten operators that would make an accelerator's host wait, in each mode's update
    (even and odd steps: the actor and the EMAs update on every 2nd)."""
    replay = _filled_replay(obs_type)
    obs_shape = STATE_SHAPE if obs_type == "states" else (9, 32, 32)
    for mode in ("pretrain", "frozen", "online"):
        if not BUILT_IN[name].supports(mode):
            continue
        agent = tiny_agent(name, mode, seed=0, obs_type=obs_type, obs_shape=obs_shape)
        for step in range(3):  # the queue and the running statistics fill
            update(agent, replay, step)
        for step in (3, 4):
            with _CountSyncs() as counter:
                update(agent, replay, step)
            assert len(counter.syncs) <= 2, (mode, step, counter.syncs)
