"""Pre-training snapshots: round trip, environment checks and safe loading of untrusted files."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import pickle
import re
import zipfile

import pytest
import torch
from torch import nn

from protorl.agents.optim import ShapeOnlyAdam, make_adam
from protorl.storage.snapshots import FORMAT_VERSION, SnapshotError, load_snapshot, save_snapshot
from tests.agents import update


@pytest.fixture
def agent_state(build_agent, replay):
    agent = build_agent("pretrain", seed=0)
    update(agent, replay, 0)
    return agent.representation_state()


@pytest.fixture
def saved(tmp_path, agent_state, point_mass_spec, tiny_cfg):
    config = {"task": "point_mass_easy", "seed": 1, "env": {"camera_id": None}, "snapshots": {"at_frames": [100, 200]},
              "agent": dataclasses.asdict(tiny_cfg)}
    path = save_snapshot(tmp_path / "snaps" / "snapshot_100.pt", agent_state, point_mass_spec, config, 100)
    return path, agent_state, point_mass_spec, config


def _assert_state_equal(a, b, where="state"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b) and a.dtype == b.dtype, where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for key in a:
            _assert_state_equal(a[key], b[key], f"{where}.{key}")
    else:
        assert a == b, where


def test_round_trip(saved, build_agent):
    path, agent_state, spec, config = saved
    assert path.is_file()
    assert not list(path.parent.glob("*.tmp"))  # the atomic write leaves no temp file
    payload = load_snapshot(path, env_spec=spec)
    assert payload["format_version"] == FORMAT_VERSION
    assert payload["frames"] == 100
    assert payload["env_spec"] == spec
    assert payload["config"] == config
    _assert_state_equal(agent_state, payload["agent"], "agent")
    # loading without a spec check works as well, and the state fits a fresh fine-tune agent
    payload = load_snapshot(str(path))
    agent = build_agent("frozen", seed=4)
    agent.load_pretrained(payload["agent"])
    _assert_state_equal(agent_state["encoder"], agent.encoder.state_dict(), "encoder")
    _assert_state_equal(agent_state["queue"], agent.queue.state_dict(), "queue")


def test_save_overwrites_atomically(saved, agent_state, point_mass_spec):
    path, _, _, config = saved
    save_snapshot(path, agent_state, point_mass_spec, {**config, "second": True}, 200)
    payload = load_snapshot(path)
    assert payload["frames"] == 200 and payload["config"] == {**config, "second": True}
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


@pytest.mark.parametrize(
    ("changes", "fields"),
    [
        ({"domain": "walker"}, ["domain"]),
        ({"obs_shape": [9, 84, 84]}, ["obs_shape"]),
        ({"domain": "cheetah", "obs_shape": [9, 64, 64], "action_shape": [6]},
         ["domain", "obs_shape", "action_shape"]),
        ({"obs_type": "states", "obs_shape": [4]}, ["obs_type", "obs_shape"]),
        ({"action_repeat": 4}, ["action_repeat"]),
    ],
)
def test_mismatched_env_spec_is_refused(saved, changes, fields):
    path, _, spec, _ = saved
    other = {**spec, **changes}
    with pytest.raises(SnapshotError) as info:
        load_snapshot(path, env_spec=other)
    message = str(info.value)
    assert str(path) in message
    for field in fields:
        assert re.search(rf"\b{field}\b", message), (field, message)
        assert repr(spec[field]) in message and repr(other[field]) in message  # both values are shown
    for field in set(spec) - set(fields):
        assert not re.search(rf"\b{field}:", message), (field, message)


def test_missing_file(tmp_path):
    missing = tmp_path / "nope" / "snapshot_5.pt"
    with pytest.raises(SnapshotError, match=re.escape(str(missing))):
        load_snapshot(missing)
    with pytest.raises(SnapshotError, match=re.escape(str(tmp_path))):
        load_snapshot(tmp_path)  # a directory is not a snapshot either


def test_a_directory_or_a_checkpoint_is_named_for_what_it_is(saved, tmp_path):
    """A run's directory or one of its training checkpoints passed where a snapshot goes: said so, in one line."""
    from protorl.storage.checkpoints import save_checkpoint

    with pytest.raises(SnapshotError, match="a directory, not a file"):
        load_snapshot(saved[0].parent)
    checkpoint = save_checkpoint({"phase": "pretrain", "agent_steps": 10}, tmp_path / "checkpoints", 20, keep=1)
    with pytest.raises(SnapshotError, match="a training checkpoint .* not a snapshot"):
        load_snapshot(checkpoint)


def test_truncated_file(saved, tmp_path):
    path, *_ = saved
    data = path.read_bytes()
    for cut in (len(data) // 2, 100, 0):
        truncated = tmp_path / f"truncated_{cut}.pt"
        truncated.write_bytes(data[:cut])
        with pytest.raises(SnapshotError, match=re.escape(str(truncated))):
            load_snapshot(truncated)


def test_random_bytes(tmp_path):
    path = tmp_path / "garbage.pt"
    path.write_bytes(os.urandom(4096))
    with pytest.raises(SnapshotError, match=re.escape(str(path))):
        load_snapshot(path)


@pytest.mark.parametrize("payload", [{"format_version": FORMAT_VERSION + 1}, {"agent": {}}, [1, 2, 3],
                                     torch.zeros(3)])
def test_wrong_payload_is_not_a_snapshot(tmp_path, payload):
    path = tmp_path / "other.pt"
    torch.save(payload, path)
    with pytest.raises(SnapshotError, match=re.escape(str(path))):
        load_snapshot(path)


class _Exploit:
    """Pickles to a call of os.system: loading the pickle with plain pickle.load would run the command."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_code_executing_pickle_is_refused(tmp_path, writer):
    marker = tmp_path / "pwned_xyz"
    exploit = {"format_version": FORMAT_VERSION, "agent": _Exploit(f"touch {marker}"), "env_spec": {},
               "config": {}, "frames": 1}
    path = tmp_path / "evil.pt"
    if writer == "torch.save":
        torch.save(exploit, path)
    else:
        with open(path, "wb") as f:
            pickle.dump(exploit, f)
    # control: the file really does run the command when unpickled unsafely (in a throwaway check)
    control = tmp_path / "control"
    control_path = tmp_path / "control.pkl"
    with open(control_path, "wb") as f:
        pickle.dump(_Exploit(f"touch {control}"), f)
    with open(control_path, "rb") as f:
        pickle.load(f)
    assert control.exists()

    with pytest.raises(SnapshotError, match=re.escape(str(path))):
        load_snapshot(path, env_spec={"domain": "point_mass"})
    assert not marker.exists()


def test_incomplete_snapshot_is_refused(tmp_path, point_mass_spec):
    path = tmp_path / "incomplete.pt"
    torch.save({"format_version": FORMAT_VERSION, "frames": 3}, path)
    with pytest.raises(SnapshotError, match=re.escape(str(path))):
        load_snapshot(path, env_spec=point_mass_spec)


def test_a_snapshot_carries_the_digest_of_its_content_and_older_readers_still_read_it(saved):
    """The digest is the archive's zip comment, the SHA-256 of every byte before it: any zip reader shows it, and
    `torch.load`, as protorl 0.2.0 reads snapshots, ignores it."""
    path, agent_state, *_ = saved
    data = path.read_bytes()
    comment = zipfile.ZipFile(path).comment
    assert comment == b"protorl sha256 " + hashlib.sha256(data[: -len(comment)]).hexdigest().encode()
    assert load_snapshot(path)["sha256"] == comment.decode().removeprefix("protorl sha256 ")
    _assert_state_equal(agent_state, torch.load(path, weights_only=True)["agent"], "agent")


def test_a_snapshot_written_before_digests_loads_with_a_note(saved, tmp_path, caplog):
    path, agent_state, *_ = saved
    older = tmp_path / "older.pt"
    torch.save({**torch.load(path, weights_only=True), "format_version": 3}, older)  # what 0.2.0 wrote: no digest
    with caplog.at_level(logging.WARNING, logger="protorl"):
        payload = load_snapshot(older)
        load_snapshot(older)
    _assert_state_equal(agent_state, payload["agent"], "agent")
    assert payload["sha256"] == hashlib.sha256(older.read_bytes()).hexdigest()
    notes = [record.getMessage() for record in caplog.records if "cannot be verified" in record.getMessage()]
    assert len(notes) == 1 and str(older) in notes[0]  # once per file


@pytest.mark.parametrize("change, fragment", [
    (lambda p: p.update(agent={}, env_spec={}, config={}, frames=0), "its env_spec has no domain"),
    (lambda p: p["config"].pop("agent"), "its config names no agent"),
    (lambda p: p["config"]["agent"].update(name="nope"), "pre-trained by agent 'nope', which is not installed"),
    (lambda p: p["config"]["agent"].update(feature_dim="wide"), "its agent cannot be built"),
    (lambda p: p.update(frames="many"), "its frames 'many' not a frame count"),
    (lambda p: p["agent"].pop("head"), "agent.head is missing"),
    (lambda p: p["agent"]["encoder"].update(extra=torch.zeros(1)), "agent.encoder.extra is not the agent's"),
    (lambda p: p["agent"]["queue"].update(size=1.5), "agent.queue.size is of type float, not int"),
    (lambda p: p["agent"]["actor"].update({name: torch.zeros(3, dtype=torch.float64)
                                          for name in list(p["agent"]["actor"])[:1]}),
     "agent.actor.trunk.0.weight is (3,) float64, not ("),
])
def test_a_snapshot_lacking_what_its_agent_needs_is_refused_in_one_line(saved, tmp_path, change, fragment):
    path, *_ = saved
    payload = torch.load(path, weights_only=True)
    change(payload)
    broken = tmp_path / "broken.pt"
    save_snapshot(broken, payload["agent"], payload["env_spec"], payload["config"], payload["frames"])
    with pytest.raises(SnapshotError, match=re.escape(fragment)) as error:
        load_snapshot(broken)
    assert str(broken) in str(error.value) and "\n" not in str(error.value)


def test_a_file_that_is_not_a_snapshot_is_named_for_what_it_is(tmp_path):
    text = tmp_path / "notes.pt"
    text.write_text("hello\n")
    with pytest.raises(SnapshotError, match=re.escape(f"snapshot {text}: not a whole protorl snapshot (cut short, "
                                                      "or not a file protorl wrote)")):
        load_snapshot(text)


def test_adam_on_the_meta_device_creates_the_state_adam_creates():
    """A snapshot is checked against its agent built on the meta device (shapes without values), Adam included."""
    real = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    with torch.device("meta"):
        shapes_only = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    for net in (real, shapes_only):
        net(torch.zeros(5, 3, device=next(net.parameters()).device)).sum().backward()
    adam, meta_adam = make_adam(real.parameters(), 1e-3), make_adam(shapes_only.parameters(), 1e-3)
    assert isinstance(meta_adam, ShapeOnlyAdam) and not isinstance(adam, ShapeOnlyAdam)
    adam.step()
    meta_adam.step()
    for param, meta_param in zip(real.parameters(), shapes_only.parameters(), strict=True):
        state, meta_state = adam.state[param], meta_adam.state[meta_param]
        assert state.keys() == meta_state.keys()
        for key in state:
            assert (state[key].shape, state[key].dtype) == (meta_state[key].shape, meta_state[key].dtype), key
