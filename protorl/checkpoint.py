"""Safe files for training state: atomic writes with a free-disk check, safe reads, rotation.

Snapshots (what fine-tuning needs) and checkpoints (everything needed to resume a phase exactly) are
both written by `atomic_save` and read by `safe_load`: tensors and plain data only, so loading a file
never runs pickled code.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

CHECKPOINT_VERSION = 3  # 2: per-agent optimisers, physical states, analysis state; 3: the projector with its statistics


class SnapshotError(ValueError):
    """A snapshot or checkpoint is missing, unreadable or does not fit; the message names file and problem."""


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written (e.g. the disk is too full); the message says why."""


def payload_bytes(payload) -> int:
    """Approximate size on disk of a nested structure of tensors."""
    if isinstance(payload, torch.Tensor):
        return payload.numel() * payload.element_size()
    if isinstance(payload, dict):
        return sum(payload_bytes(v) for v in payload.values())
    if isinstance(payload, (list, tuple)):
        return sum(payload_bytes(v) for v in payload)
    return 64


def atomic_save(payload: dict, path: Path, margin_bytes: int = 64 * 2**20) -> Path:
    """Write `payload` to `path` via a temporary file, fsync and rename; check free disk first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    needed = payload_bytes(payload) + margin_bytes
    free = shutil.disk_usage(path.parent).free
    if free < needed:
        raise CheckpointError(f"cannot write {path}: it needs about {needed / 2**20:.0f} MiB and only "
                              f"{free / 2**20:.0f} MiB are free on that disk")
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def safe_load(path: str | Path, what: str) -> dict:
    """Read a file written by `atomic_save` without executing pickled code; `what` names it in errors."""
    path = Path(path)
    if not path.is_file():
        raise SnapshotError(f"{what} {path}: no such file")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for corrupt, truncated or unsafe files
        raise SnapshotError(f"{what} {path}: cannot be read as a protorl {what} ({error})") from None
    if not isinstance(payload, dict):
        raise SnapshotError(f"{what} {path}: not a protorl {what}")
    return payload


def save_checkpoint(state: dict, directory: Path, frames: int, keep: int) -> Path:
    """Write `checkpoint_<frames>.pt` and delete all but the newest `keep` checkpoints."""
    path = atomic_save({"checkpoint_version": CHECKPOINT_VERSION, **state},
                       directory / f"checkpoint_{frames}.pt")
    for old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def list_checkpoints(directory: Path) -> list[Path]:
    """Checkpoints in `directory`, oldest first."""
    paths = directory.glob("checkpoint_*.pt") if directory.is_dir() else []
    return sorted(paths, key=lambda p: int(p.stem.split("_")[-1]))


def load_checkpoint(path: Path) -> dict:
    payload = safe_load(path, "checkpoint")
    if payload.get("checkpoint_version") != CHECKPOINT_VERSION:
        raise SnapshotError(f"checkpoint {path}: not a protorl checkpoint of version {CHECKPOINT_VERSION} (found "
                            f"{payload.get('checkpoint_version')!r}, e.g. from an older protorl); start over with "
                            "resume=false or in a new run directory")
    return payload
