"""Safe files for training state: atomic writes with a free-disk check, safe reads, rotation.

Snapshots (what fine-tuning needs) and checkpoints (everything needed to resume a phase exactly) are
both written by `atomic_save` and read by `safe_load`: tensors and plain data only, so loading a file
never runs pickled code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from pathlib import Path

import torch

from protorl.errors import CheckpointError, ProtorlError, UnreadableFileError

log = logging.getLogger("protorl")

# 2: per-agent optimisers, physical states, analysis state; 3: the projector with its statistics; 4: TensorBoard
# file sizes, paths relative to the phase directory
CHECKPOINT_VERSION = 4
CHECKPOINT_NAME = re.compile(r"checkpoint_(\d+)\.pt")
# the free space a write needs: the file's estimated size times this, plus FREE_SPACE_SLACK_BYTES
FREE_SPACE_FACTOR = 1.1
FREE_SPACE_SLACK_BYTES = 2**20


def payload_bytes(payload) -> int:
    """Approximate size on disk of a nested structure of tensors."""
    if isinstance(payload, torch.Tensor):
        return payload.numel() * payload.element_size()
    if isinstance(payload, dict):
        return sum(payload_bytes(v) for v in payload.values())
    if isinstance(payload, (list, tuple)):
        return sum(payload_bytes(v) for v in payload)
    return 64


def atomic_save(payload: dict, path: Path) -> Path:
    """Write `payload` to `path` via a temporary file, fsync and rename; check free disk first.

    The check asks for the payload's size times `FREE_SPACE_FACTOR` plus `FREE_SPACE_SLACK_BYTES`. Any write
    error (a full disk, a read-only directory) becomes one `CheckpointError` naming the file and the cause;
    the temporary file is removed and `path`, if it existed, is left as it was.
    """
    needed = int(payload_bytes(payload) * FREE_SPACE_FACTOR) + FREE_SPACE_SLACK_BYTES
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(path.parent).free
        if free < needed:
            raise CheckpointError(f"cannot write {path}: it needs about {needed / 2**20:.0f} MiB and only "
                                  f"{free / 2**20:.0f} MiB are free on that disk")
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as error:
        raise CheckpointError(f"cannot write {path}: {error.strerror or error}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return path


def write_text_atomic(path: Path, text: str) -> Path:
    """Write `text` to `path` whole or not at all: a temporary file, fsync'ed, then renamed over `path`."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def safe_load(path: str | Path, what: str, error: type[ProtorlError]) -> dict:
    """Read a file written by `atomic_save` without executing pickled code; `what` names it in errors, which are
    `error` (`UnreadableFileError` for a file that is not whole)."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{what} {path}: no such file")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except (MemoryError, InterruptedError):  # the machine's trouble, not the file's
        raise
    except Exception as cause:  # torch raises many types for corrupt, truncated or unsafe files
        raise UnreadableFileError(f"{what} {path}: cannot be read as a protorl {what} ({cause})") from None
    if not isinstance(payload, dict):
        raise error(f"{what} {path}: not a protorl {what}")
    return payload


def save_checkpoint(state: dict, directory: Path, frames: int, keep: int) -> Path:
    """Write `checkpoint_<frames>.pt` and delete all but the newest `keep` checkpoints."""
    path = atomic_save({"checkpoint_version": CHECKPOINT_VERSION, **state},
                       directory / f"checkpoint_{frames}.pt")
    for old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def list_checkpoints(directory: Path) -> list[Path]:
    """The checkpoints (`checkpoint_<frames>.pt`) in `directory`, oldest first; other files are not."""
    if not directory.is_dir():
        return []
    found = [(int(match[1]), path) for path in directory.iterdir() if (match := CHECKPOINT_NAME.fullmatch(path.name))]
    return [path for _, path in sorted(found)]


def drop_checkpoints(directory: Path) -> None:
    """Delete a completed phase's checkpoints (the directory too, once empty)."""
    for path in list_checkpoints(directory):
        path.unlink()
    remove_partial_writes(directory)
    with contextlib.suppress(OSError):
        directory.rmdir()


def remove_partial_writes(directory: Path) -> None:
    """Delete the temporary files that a write killed before its rename left in `directory`."""
    if directory.is_dir():
        for path in directory.glob("*.tmp"):
            path.unlink()


def load_checkpoint(path: Path) -> dict:
    payload = safe_load(path, "checkpoint", CheckpointError)
    if payload.get("checkpoint_version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"checkpoint {path}: not a protorl checkpoint of version {CHECKPOINT_VERSION} (found "
                              f"{payload.get('checkpoint_version')!r}, e.g. from an older protorl); start over with "
                              "start_over=true or in a new run directory")
    return payload


def load_newest_checkpoint(directory: Path) -> tuple[Path, dict] | None:
    """The newest intact checkpoint in `directory` and its contents, or None if there is none. An unreadable
    newest one (e.g. cut short by a full disk) is moved aside (`.unreadable`) with a warning and the one before it
    used; `UnreadableFileError` if none before it is left."""
    for path in reversed(list_checkpoints(directory)):
        try:
            return path, load_checkpoint(path)
        except UnreadableFileError as error:
            if not list_checkpoints(directory)[:-1]:
                raise
            log.warning("%s; moving it aside (.unreadable) and resuming from the checkpoint before it", error)
            path.rename(path.with_suffix(".pt.unreadable"))
    return None
