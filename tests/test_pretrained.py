"""`protorl.load_pretrained`: a snapshot in your own code."""

from __future__ import annotations

import copy
import dataclasses
import re

import numpy as np
import pytest
import torch

import protorl
from protorl.errors import ConfigError, ProtorlError, SnapshotError
from protorl.storage.snapshots import save_snapshot
from tests.agents import PIXEL_OBS_SHAPE, POINT_MASS_ACTION_SHAPE, tiny_agent, update


def snapshot_of(agent, path, replay=None):
    """Save `agent`'s representation as pre-training would (after 3 updates on `replay`, if given)."""
    if replay is not None:
        for step in range(3):
            update(agent, replay, step)
    spec = {"domain": "point_mass", "obs_type": "pixels", "obs_shape": list(PIXEL_OBS_SHAPE),
            "action_shape": list(POINT_MASS_ACTION_SHAPE), "action_repeat": 2}
    return save_snapshot(path, copy.deepcopy(agent.representation_state()), spec,
                         {"agent": dataclasses.asdict(agent.cfg)}, 1000)


@pytest.mark.parametrize("name", ["proto", "icm", "apt", "random"])
def test_encode_equals_the_agents_own_encoder(name, tmp_path, replay):
    agent = tiny_agent(name, "pretrain", seed=0)
    path = snapshot_of(agent, tmp_path / "snapshot.pt", replay)
    pretrained = protorl.load_pretrained(path, device="cpu")
    batch = replay.sample(4).obs  # uint8 (4, 9, 32, 32)
    with torch.no_grad():
        expected, expected_one = agent.encoder(batch), agent.encoder(batch[:1])[0]
    assert torch.equal(pretrained.encode(batch), expected)
    assert torch.equal(pretrained.encode(batch[0].numpy()), expected_one)  # one observation, as numpy
    assert not any(p.requires_grad for p in pretrained.agent.encoder.parameters())
    obs = batch[0].numpy()
    assert np.array_equal(pretrained.act(obs), agent.act(obs, sample=False))  # the exploration actor
    if name == "proto":
        # normalised once more on loading (they are unit-norm already): equal up to the last bit
        torch.testing.assert_close(pretrained.prototypes, agent.head.prototypes.detach(), rtol=0, atol=1e-6)
        z = pretrained.project(batch)
        assert z.shape == (4, agent.cfg.proj_dim) and torch.allclose(z.norm(dim=1), torch.ones(4))
    else:
        assert pretrained.prototypes is None
        with pytest.raises(SnapshotError, match="project"):
            pretrained.project(batch)


def test_wrong_shapes_and_files_are_refused(tmp_path, replay):
    pretrained = protorl.load_pretrained(snapshot_of(tiny_agent("proto", "pretrain", seed=0), tmp_path / "s.pt"),
                                         device="cpu")
    with pytest.raises(ConfigError, match=r"expects \(B, 9, 32, 32\)"):
        pretrained.encode(np.zeros((2, 3, 32, 32), dtype=np.uint8))
    with pytest.raises(ConfigError, match=r"of shape \(32, 32, 9\): .* \(channels first\)"):  # the shape given
        pretrained.encode(np.zeros((32, 32, 9), dtype=np.uint8))
    not_a_snapshot = tmp_path / "notes.pt"
    not_a_snapshot.write_text("hello")
    with pytest.raises(SnapshotError):
        protorl.load_pretrained(not_a_snapshot)
    with pytest.raises(SnapshotError, match="no such file"):
        protorl.load_pretrained(tmp_path / "missing.pt")
    with pytest.raises(SnapshotError, match="/dev/zero: not a regular file"):  # there, but endless: never read
        protorl.load_pretrained("/dev/zero")


@pytest.fixture
def pixel_snapshot(tmp_path):
    return snapshot_of(tiny_agent("proto", "pretrain", seed=0), tmp_path / "snapshot.pt")


@pytest.mark.parametrize("dtype", [np.float32, np.bool_, np.int64])
def test_encode_refuses_pixels_that_are_not_uint8(pixel_snapshot, dtype):
    """Float frames in [0, 1], bools or ints would be encoded as something else than what the encoder saw: refused."""
    pretrained = protorl.load_pretrained(pixel_snapshot, device="cpu")
    frames = np.zeros((2, *pretrained.obs_shape), dtype=np.uint8)
    with pytest.raises(ConfigError, match="uint8 pixels"):
        pretrained.encode(frames.astype(dtype))


@pytest.mark.parametrize("path, device, fragment", [
    (None, "cpu", "expected the path of a snapshot file"),
    ("PATH", "cuda:7", "invalid device 'cuda:7'"),
    ("PATH", "tpu", "invalid device 'tpu'"),
])
def test_load_pretrained_refuses_what_it_cannot_use_in_one_line(pixel_snapshot, path, device, fragment):
    with pytest.raises(ProtorlError, match=re.escape(fragment)) as error:
        protorl.load_pretrained(pixel_snapshot if path == "PATH" else path, device=device)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("call, obs, fragment", [
    ("encode", [[0.0] * 4], "expects uint8 pixels"),  # a list, of floats
    ("encode", "frames", "expected an array of numbers"),
    ("encode", None, "expected an array of numbers"),
    ("act", np.zeros(3, dtype=np.uint8), "act() takes one observation (9, 32, 32)"),
    ("act", np.zeros((2, 9, 32, 32), dtype=np.uint8), "act() takes one observation (9, 32, 32)"),
])
def test_observations_it_cannot_use_are_one_line(pixel_snapshot, call, obs, fragment):
    pretrained = protorl.load_pretrained(pixel_snapshot, device="cpu")
    with pytest.raises(ConfigError, match=re.escape(fragment)) as error:
        getattr(pretrained, call)(obs)
    assert "\n" not in str(error.value)


def test_encode_takes_a_list(tmp_path):
    """A nested list of numbers is an observation like an array (from states: floats)."""
    agent = tiny_agent("proto", "pretrain", seed=0, obs_type="states", obs_shape=(4,))
    spec = {"domain": "point_mass", "obs_type": "states", "obs_shape": [4],
            "action_shape": list(POINT_MASS_ACTION_SHAPE), "action_repeat": 2}
    path = save_snapshot(tmp_path / "s.pt", agent.snapshot_state(), spec, {"agent": dataclasses.asdict(agent.cfg)}, 10)
    pretrained = protorl.load_pretrained(path, device="cpu")
    obs = [[0.1, -0.2, 0.3, 0.0]]
    assert torch.equal(pretrained.encode(obs), pretrained.encode(np.asarray(obs, dtype=np.float32)))
    assert pretrained.act(obs[0]).shape == POINT_MASS_ACTION_SHAPE
