"""Checkpoints: everything a phase needs to resume exactly, as `checkpoint_<frames>.pt` files, the newest few kept."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable
from pathlib import Path

from protorl.errors import CheckpointError, UnreadableFileError
from protorl.storage.atomic import atomic_save, remove_partial_writes, safe_load

log = logging.getLogger("protorl")

# 2: per-agent optimisers, physical states, analysis state; 3: the projector with its statistics; 4: TensorBoard
# file sizes, paths relative to the phase directory; 5: the run's settings (`settings`), and always a digest
CHECKPOINT_VERSION = 5
READABLE_VERSIONS = (4, 5)  # a version 4 checkpoint resumes too: identified by its phase, task and seed alone
CHECKPOINT_NAME = re.compile(r"checkpoint_(\d+)\.pt")


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


def checkpoint_frames(path: Path) -> int:
    """The frames a checkpoint was written at, from its name `checkpoint_<frames>.pt`."""
    return int(CHECKPOINT_NAME.fullmatch(path.name)[1])


def drop_checkpoints(directory: Path) -> None:
    """Delete a completed phase's checkpoints (the directory too, once empty)."""
    for path in list_checkpoints(directory):
        path.unlink()
    remove_partial_writes(directory)
    with contextlib.suppress(OSError):
        directory.rmdir()


def load_checkpoint(path: Path) -> dict:
    """The contents of a checkpoint, checked against its digest, its tensors mapping the file (a resume copies
    them into the trainer at once); `CheckpointError` (`UnreadableFileError` for a file that is not as it was
    written) otherwise."""
    payload, _ = safe_load(path, "checkpoint", CheckpointError, ("checkpoint_version", CHECKPOINT_VERSION),
                           mmap=True)
    if payload.get("checkpoint_version") not in READABLE_VERSIONS:
        raise CheckpointError(f"checkpoint {path}: not a protorl checkpoint of version {CHECKPOINT_VERSION} (found "
                              f"{payload.get('checkpoint_version')!r}, e.g. from an older protorl); start over with "
                              "start_over=true or in a new run directory")
    if payload["checkpoint_version"] >= CHECKPOINT_VERSION and not isinstance(payload.get("settings"), dict):
        raise UnreadableFileError(f"checkpoint {path}: incomplete, it holds no settings of its run")
    return payload


def load_newest_checkpoint(directory: Path, foreign: Callable[[dict], str | None] = lambda state: None
                           ) -> tuple[Path, dict] | None:
    """The newest intact checkpoint of this run in `directory` and its contents, or None if there is none. One
    that is not as it was written (cut short by a full disk, corrupted since) is moved aside (`.unreadable`), one
    of another run (`foreign(state)` says how it differs) aside as `.other-run`, each with a warning, and the one
    before it is tried; None once none is left, so that the phase starts again."""
    for path in reversed(list_checkpoints(directory)):
        fallback = "resuming from the checkpoint before it" if list_checkpoints(directory)[:-1] else \
            "no checkpoint is left before it: the phase starts again"
        try:
            state = load_checkpoint(path)
        except UnreadableFileError as error:
            log.warning("%s; moving it aside (.unreadable), %s", error, fallback)
            path.rename(path.with_suffix(".pt.unreadable"))
            continue
        difference = foreign(state)
        if difference is None:
            return path, state
        log.warning("checkpoint %s is of another run (%s); moving it aside (.other-run), %s", path, difference,
                    fallback)
        path.rename(path.with_suffix(".pt.other-run"))
    return None
