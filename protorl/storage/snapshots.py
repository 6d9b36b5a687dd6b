"""Pre-training snapshots: the representation, queue and actor, plus the config and the env spec (and, if asked
for, the replay buffer).

Files are written with `torch.save` and read with `weights_only=True`, so loading one runs no pickled
code. `load_snapshot` refuses a file whose spec does not match the downstream environment.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from omegaconf import OmegaConf

from protorl.agents import agent_class
from protorl.config import AgentConfig
from protorl.errors import SnapshotError
from protorl.storage.atomic import atomic_save, safe_load
from protorl.storage.layout import PRETRAIN_DIR

FORMAT_VERSION = 3  # 2: the projector as `linear` plus its statistics; 3: each agent's own config keys

__all__ = ["SnapshotError", "check_architecture", "check_spec", "load_snapshot", "save_snapshot"]


def save_snapshot(path: Path, agent_state: dict, env_spec: dict, config: dict, frames: int,
                  replay: dict | None = None) -> Path:
    """Write atomically (temp file, fsync, rename) so a crash never leaves a half-written snapshot. `replay`: a
    `ReplayBuffer.state_dict()` with physical states, for fine-tuning on the pre-training's data."""
    payload = {"format_version": FORMAT_VERSION, "agent": agent_state, "env_spec": env_spec,
               "config": config, "frames": frames}
    if replay is not None:
        payload["replay"] = replay
    return atomic_save(payload, path)


# SAC's settings that fix which networks every snapshot holds and their shapes; each agent adds its own
# (`Agent.architecture_keys`)
ARCHITECTURE_KEYS = ("name", "feature_dim", "hidden_dim", "hidden_depth", "state_hidden_dim")


def load_snapshot(path: str | Path, env_spec: dict | None = None, agent_config=None) -> dict:
    """Read a snapshot; check it was made for a matching env spec and agent architecture, if given."""
    path = Path(path)
    payload = safe_load(path, "snapshot", SnapshotError)
    if "checkpoint_version" in payload:
        raise SnapshotError(f"snapshot {path}: a training checkpoint (for resuming its own run), not a snapshot: "
                            "fine-tune from a pre-training's pretrain/snapshots/snapshot_<frames>.pt")
    if payload.get("format_version") != FORMAT_VERSION:
        raise SnapshotError(f"snapshot {path}: not a protorl snapshot of format version {FORMAT_VERSION} (found "
                            f"{payload.get('format_version')!r}; older snapshots predate each agent's own "
                            "config keys: pre-train again)")
    missing = [key for key in ("agent", "env_spec", "config", "frames") if key not in payload]
    if missing:
        raise SnapshotError(f"snapshot {path}: incomplete, missing {', '.join(missing)}")
    if env_spec is not None:
        check_spec(path, payload["env_spec"], env_spec)
    if agent_config is not None:
        check_architecture(path, payload["config"].get("agent", {}), agent_config)
    payload["path"] = str(path)
    return payload


def check_spec(path: Path, saved: dict, current: dict) -> None:
    """Raise `SnapshotError` listing every field where the snapshot's env differs from this one."""
    differences = [f"{key}: snapshot has {saved.get(key)!r}, this environment has {current[key]!r}"
                   for key in current if saved.get(key) != current[key]]
    if differences:
        raise SnapshotError(f"snapshot {path} does not match the environment; fine-tune on a task of the "
                            f"snapshot's domain with the same observation settings. "
                            + "; ".join(differences))


def check_architecture(path: Path, saved_agent: dict, agent_config: AgentConfig) -> None:
    """Raise `SnapshotError` if the snapshot's networks were built with other sizes than `agent_config`."""
    if saved_agent.get("name") != agent_config.name:
        raise SnapshotError(f"snapshot {path} was pre-trained by agent {saved_agent.get('name')!r}, not "
                            f"{agent_config.name!r}: pass agent={saved_agent.get('name')} to finetune")
    agent = agent_class(agent_config.name)
    differences = [f"agent.{key}={saved_agent.get(key)!r} in the snapshot, {getattr(agent_config, key)!r} here"
                   for key in (*ARCHITECTURE_KEYS, *agent.architecture_keys)
                   if saved_agent.get(key) != getattr(agent_config, key)]
    if differences:
        raise SnapshotError(f"snapshot {path} was pre-trained with other network sizes; pass the snapshot's "
                            "values to finetune: " + "; ".join(differences))


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's content, in hex: what identifies a snapshot wherever it lives."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def snapshot_in_sweep(sweep_dir: str | Path, agent: str, pretrain_task: str, seed: int, frames: int) -> Path:
    """The snapshot at `frames` of the run in `sweep_dir` (a directory of run directories) that pre-trained
    `agent` on `pretrain_task` with `seed`; `SnapshotError` naming what is missing otherwise."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise SnapshotError(f"pretrain_sweep={sweep_dir}: no such directory")
    for config_file in sorted(sweep_dir.glob("*/config.yaml")):
        run = OmegaConf.load(config_file)
        if (run.agent.name, run.pretrain_env or run.env, run.seed) == (agent, pretrain_task, seed):
            snapshot = config_file.parent / PRETRAIN_DIR / "snapshots" / f"snapshot_{frames}.pt"
            if not snapshot.is_file():
                raise SnapshotError(f"pretrain_sweep={sweep_dir}: run {config_file.parent.name} has no snapshot "
                                    f"at pretrain_frames={frames} ({snapshot.name} is missing: unfinished, or not "
                                    "in its snapshot_at_frames)")
            return snapshot
    raise SnapshotError(f"pretrain_sweep={sweep_dir}: no run pre-trained agent {agent} on {pretrain_task} with "
                        f"seed {seed}")
