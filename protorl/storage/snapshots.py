"""Pre-training snapshots: the representation, queue and actor, plus the config and the env spec (and, if asked
for, the replay buffer).

Files are written with `torch.save` and the digest of their content, and read with `weights_only=True`, so loading
one runs no pickled code. `load_snapshot` refuses a file that is not as it was written, that lacks what its agent
needs, or whose spec does not match the downstream environment.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from protorl.agents import Agent, agent_class
from protorl.config import AgentConfig, architecture_keys
from protorl.errors import ConfigError, SnapshotError, first_line
from protorl.storage.atomic import atomic_save, safe_load
from protorl.storage.digests import archive_digest, file_sha256
from protorl.storage.run_files import PRETRAIN_DIR, read_run_config

# 2: the projector as `linear` plus its statistics; 3: each agent's own config keys; 4: always with a digest
FORMAT_VERSION = 4
READABLE_VERSIONS = (3, 4)  # format 3 differs only in that it may lack a digest

SPEC_KEYS = ("domain", "obs_type", "obs_shape", "action_shape", "action_repeat")  # what `Env.spec()` holds

__all__ = ["SnapshotError", "check_architecture", "check_spec", "load_snapshot", "save_snapshot", "snapshot_agent",
           "snapshot_digest"]


def save_snapshot(path: Path, agent_state: dict, env_spec: dict, config: dict, frames: int,
                  replay: dict | None = None) -> Path:
    """Write with the digest of its content, atomically (temp file, fsync, rename) so a crash never leaves a
    half-written snapshot. `replay`: a `ReplayBuffer.state_dict()` with physical states, for fine-tuning on the
    pre-training's data."""
    payload = {"format_version": FORMAT_VERSION, "agent": agent_state, "env_spec": env_spec,
               "config": config, "frames": frames}
    if replay is not None:
        payload["replay"] = replay
    return atomic_save(payload, path)




def load_snapshot(path: str | Path, env_spec: dict | None = None, agent: AgentConfig | None = None) -> dict:
    """Read a snapshot, checked against its digest and for every network and statistic its agent needs; check
    it was made for a matching env spec and agent architecture, if given. The payload also holds the file's
    `path` and `sha256`: the digest written with it, or for a snapshot written before digests existed the SHA-256
    of the file."""
    path = Path(path)
    payload, digest = safe_load(path, "snapshot", SnapshotError, ("format_version", FORMAT_VERSION))
    if "checkpoint_version" in payload:
        raise SnapshotError(f"snapshot {path}: a training checkpoint (for resuming its own run), not a snapshot: "
                            "fine-tune from a pre-training's pretrain/snapshots/snapshot_<frames>.pt")
    if payload.get("format_version") not in READABLE_VERSIONS:
        raise SnapshotError(f"snapshot {path}: not a protorl snapshot of format version {FORMAT_VERSION} (found "
                            f"{payload.get('format_version')!r}; older snapshots predate each agent's own "
                            "config keys: pre-train again)")
    missing = [key for key in ("agent", "env_spec", "config", "frames") if key not in payload]
    if missing:
        raise SnapshotError(f"snapshot {path}: incomplete, missing {', '.join(missing)}")
    check_structure(path, payload)
    check_weights_finite(path, payload["agent"])
    if env_spec is not None:
        check_spec(path, payload["env_spec"], env_spec)
    if agent is not None:
        check_architecture(path, payload["config"]["agent"], agent)
    payload["path"] = str(path)
    payload["sha256"] = digest or file_sha256(path)
    return payload


def snapshot_digest(path: Path) -> str:
    """The digest a snapshot carries, checked against its content without loading it (`UnreadableFileError`
    otherwise); for a snapshot written before digests existed, the SHA-256 of the file."""
    try:
        with open(path, "rb") as file:
            return archive_digest(file, path, "snapshot") or file_sha256(path)
    except OSError as error:
        raise SnapshotError(f"snapshot {path}: cannot be read ({error.strerror or error})") from None


def check_structure(path: Path, payload: dict) -> None:
    """`SnapshotError` naming what is missing or does not fit, unless the snapshot holds an environment spec, its
    agent's config, and every network and statistic of that agent at that config's sizes."""
    not_dicts = [key for key in ("agent", "env_spec", "config") if not isinstance(payload[key], dict)]
    if not_dicts:
        raise SnapshotError(f"snapshot {path}: incomplete, its {', '.join(not_dicts)} not a dictionary")
    if not isinstance(payload["frames"], int):
        raise SnapshotError(f"snapshot {path}: incomplete, its frames {payload['frames']!r} not a frame count")
    meta = torch.device("meta")
    with meta:  # shapes without values: nothing is allocated
        expected = snapshot_agent(path, payload, meta).snapshot_state()
    if "critic" not in payload["agent"]:  # snapshots of an earlier protorl: agent.init_critic refuses them
        del expected["critic"]
    differences = _differences(expected, payload["agent"], "agent")
    if differences:
        shown = "; ".join(differences[:4]) + (f"; and {len(differences) - 4} more" if len(differences) > 4 else "")
        raise SnapshotError(f"snapshot {path}: its networks are not those its config describes: {shown}")


def check_weights_finite(path: Path, agent_state: dict) -> None:
    """`SnapshotError` naming the tensors of a snapshot's agent that hold NaN or infinite values."""
    bad = _non_finite(agent_state, "agent")
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise SnapshotError(f"snapshot {path}: {shown} hold non-finite values (NaN or infinity): the pre-training "
                            "had diverged when it was written; use an earlier snapshot")


def _non_finite(tree: object, where: str) -> list[str]:
    if isinstance(tree, dict):
        return [name for key, value in tree.items() for name in _non_finite(value, f"{where}.{key}")]
    if isinstance(tree, torch.Tensor) and tree.is_floating_point() and not bool(torch.isfinite(tree).all()):
        return [where]
    return []


def snapshot_agent(path: Path, payload: dict, device: torch.device) -> Agent:
    """A fresh agent of the kind and sizes a snapshot's config and env spec describe, on `device`, in the
    downstream mode (its weights not loaded); `SnapshotError` naming what the snapshot lacks to build it."""
    spec, saved = payload["env_spec"], payload["config"].get("agent")
    missing = [key for key in SPEC_KEYS if key not in spec]
    if missing:
        raise SnapshotError(f"snapshot {path}: incomplete, its env_spec has no {', '.join(missing)}")
    if not isinstance(saved, dict) or "name" not in saved:
        raise SnapshotError(f"snapshot {path}: incomplete, its config names no agent")
    try:
        cls = agent_class(str(saved["name"]))
    except ConfigError:
        raise SnapshotError(f"snapshot {path} was pre-trained by agent {saved['name']!r}, which is not installed "
                            "here") from None
    unknown = sorted(set(saved) - {field.name for field in dataclasses.fields(cls.config_class)})
    if unknown:
        raise SnapshotError(f"snapshot {path}: its agent config has keys {', '.join(unknown)} that agent "
                            f"{cls.name!r} does not know")
    try:
        return cls(spec["obs_type"], tuple(spec["obs_shape"]), tuple(spec["action_shape"]),
                   cls.config_class(**saved), device, "frozen")
    except Exception as error:  # any value of the file's config the agent cannot be built with
        raise SnapshotError(f"snapshot {path}: its agent cannot be built from its config and env spec "
                            f"({first_line(error)})") from None


def _differences(expected: object, found: object, where: str) -> list[str]:
    """Where `found` (a snapshot's entry) lacks or departs from the keys, tensor shapes and types of `expected`."""
    if isinstance(expected, dict):
        if not isinstance(found, dict):
            return [f"{where} is not a dictionary"]
        return ([f"{where}.{key} is missing" for key in expected if key not in found]
                + [f"{where}.{key} is not the agent's" for key in found if key not in expected]
                + [line for key in expected if key in found
                   for line in _differences(expected[key], found[key], f"{where}.{key}")])
    if isinstance(expected, torch.Tensor):
        if not isinstance(found, torch.Tensor):
            return [f"{where} is not a tensor"]
        if (found.shape, found.dtype) != (expected.shape, expected.dtype):
            return [f"{where} is {_described(found)}, not {_described(expected)}"]
        return []
    return [] if type(found) is type(expected) else [f"{where} is of type {type(found).__name__}, not "
                                                     f"{type(expected).__name__}"]


def _described(tensor: torch.Tensor) -> str:
    return f"{tuple(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')}"


def check_spec(path: Path, saved: dict, current: dict) -> None:
    """Raise `SnapshotError` listing every field where the snapshot's env differs from this one."""
    differences = [f"{key}: snapshot has {saved.get(key)!r}, this environment has {current[key]!r}"
                   for key in current if saved.get(key) != current[key]]
    if differences:
        raise SnapshotError(f"snapshot {path} does not match the environment; fine-tune on a task of the "
                            f"snapshot's domain with the same observation settings. "
                            + "; ".join(differences))


def check_architecture(path: Path, saved_agent: dict, agent: AgentConfig) -> None:
    """Raise `SnapshotError` if the snapshot's networks were built with other sizes than `agent`."""
    if saved_agent.get("name") != agent.name:
        raise SnapshotError(f"snapshot {path} was pre-trained by agent {saved_agent.get('name')!r}, not "
                            f"{agent.name!r}: pass agent={saved_agent.get('name')} to finetune")
    differences = [f"agent.{key}={saved_agent.get(key)!r} in the snapshot, {getattr(agent, key)!r} here"
                   for key in architecture_keys(agent_class(agent.name).config_class)
                   if saved_agent.get(key) != getattr(agent, key)]
    if differences:
        raise SnapshotError(f"snapshot {path} was pre-trained with other network sizes; pass the snapshot's "
                            "values to finetune: " + "; ".join(differences))


def snapshot_in_sweep(sweep_dir: str | Path, agent: str, pretrain_task: str, seed: int, frames: int) -> Path:
    """The snapshot at `frames` of the run in `sweep_dir` (a directory of run directories) that pre-trained
    `agent` on `pretrain_task` with `seed`; `SnapshotError` naming what is missing otherwise."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise SnapshotError(f"pretrain_sweep={sweep_dir}: no such directory")
    for config_file in sorted(sweep_dir.glob("*/config.yaml")):
        run = read_run_config(config_file)
        if (run.agent.name, run.pretrain_task or run.task, run.seed) == (agent, pretrain_task, seed):
            snapshot = config_file.parent / PRETRAIN_DIR / "snapshots" / f"snapshot_{frames}.pt"
            if not snapshot.is_file():
                raise SnapshotError(f"pretrain_sweep={sweep_dir}: run {config_file.parent.name} has no snapshot "
                                    f"at pretrain_frames={frames} ({snapshot.name} is missing: unfinished, or not "
                                    "in its snapshots.at_frames)")
            return snapshot
    raise SnapshotError(f"pretrain_sweep={sweep_dir}: no run pre-trained agent {agent} on {pretrain_task} with "
                        f"seed {seed}")
