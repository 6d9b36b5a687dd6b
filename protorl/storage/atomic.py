"""Safe files: atomic writes with a free-disk check, and reads that verify what they read and never run pickled code.

Snapshots (what fine-tuning needs), checkpoints (everything needed to resume a phase exactly), `config.yaml` and
`result.json` are all written here: to a temporary file renamed into place, so a killed write leaves the old file
or none. Snapshots and checkpoints carry the digest of their content (`protorl.storage.digests`); `safe_load`
checks it and reads tensors and plain data only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import shutil
import signal
import threading
from pathlib import Path

import torch

from protorl.errors import CheckpointError, ProtorlError, UnreadableFileError, first_line
from protorl.storage.digests import archive_digest, seal_archive

log = logging.getLogger("protorl")

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
    """Write `payload` with the digest of its content to `path` via a temporary file, fsync and rename; check free
    disk first.

    The check asks for the payload's size times `FREE_SPACE_FACTOR` plus `FREE_SPACE_SLACK_BYTES`. Any write
    error (a full disk, a read-only directory) becomes one `CheckpointError` naming the file and the cause; the
    temporary file is removed and `path`, if it existed, is left as it was. Ctrl-C during the write takes effect
    once the file is written.
    """
    needed = int(payload_bytes(payload) * FREE_SPACE_FACTOR) + FREE_SPACE_SLACK_BYTES
    tmp = path.with_suffix(path.suffix + ".tmp")
    with _interrupts_deferred():
        _write_archive(payload, path, tmp, needed)
    return path


def _write_archive(payload: dict, path: Path, tmp: Path, needed: int) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(path.parent).free
        if free < needed:
            raise CheckpointError(f"cannot write {path}: it needs about {needed / 2**20:.0f} MiB and only "
                                  f"{free / 2**20:.0f} MiB are free on that disk")
        with open(tmp, "w+b") as f:
            torch.save(payload, f)
            seal_archive(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as error:
        raise CheckpointError(f"cannot write {path}: {error.strerror or error}") from None
    except RuntimeError as error:  # torch's archive writer reports a failed write of the file as its own error
        cause = _write_failure(error)
        if isinstance(cause, KeyboardInterrupt):  # Ctrl-C during the write: the interrupt it is
            raise cause from None
        if isinstance(cause, OSError):
            raise CheckpointError(f"cannot write {path}: {cause.strerror or cause}") from None
        raise
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def _interrupts_deferred():
    """Ctrl-C during the block takes effect at its end, once the file is whole (or its write has failed): torch's
    archive writer, interrupted inside a record, can abort the whole process. Only the main thread handles signals;
    elsewhere nothing is deferred."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is None:  # None: a handler not Python's
        yield
        return
    pending: list = []
    signal.signal(signal.SIGINT, lambda signum, frame: pending.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending and callable(previous):
            previous(signal.SIGINT, pending[-1])
        elif pending and previous == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)


def _write_failure(error: BaseException) -> BaseException | None:
    """The interrupt or OS error that made torch's writer fail (kept as the context of its `RuntimeError`)."""
    cause = error.__context__
    while cause is not None and not isinstance(cause, KeyboardInterrupt | OSError):
        cause = cause.__context__
    return cause


def write_text_atomic(path: Path, text: str) -> Path:
    """Write `text` to `path` whole or not at all: a temporary file, fsync'ed, then renamed over `path`; on an
    error (which propagates) the temporary file is removed and `path`, if it existed, is left as it was."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return path


def safe_load(path: str | Path, what: str, error: type[ProtorlError], sealed_from: tuple[str, int],
              mmap: bool = False) -> tuple[dict, str | None]:
    """Read a file written by `atomic_save`, checked against its digest, without executing pickled code; returns
    its payload and its digest (None, with a warning, for a file written before digests existed). `what` names it
    in errors, which are `error` (`UnreadableFileError` for a file that is not whole or not as it was written).
    `sealed_from`: (key, version) from which on the payload's `key` says the file was written with a digest: such
    a file without one has lost it (`UnreadableFileError`), and only older ones are read unverified.

    `mmap`: the payload's tensors map the file (`torch.load(mmap=True)`: privately, copy on write) instead of
    being read into memory. For a payload that the caller copies out at once (a checkpoint), this spares the copy
    `torch.load` would make, about what checking the digest costs."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{what} {path}: a directory, not a file")
    if not path.exists():
        raise error(f"{what} {path}: no such file")
    if not path.is_file():  # a device, a pipe, a socket: nothing protorl wrote, and possibly without end
        raise error(f"{what} {path}: not a regular file")
    try:
        with open(path, "rb") as file:
            digest = archive_digest(file, path, what)
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except (MemoryError, InterruptedError, ProtorlError):  # the machine's trouble, or said already
        raise
    except OSError as cause:
        raise error(f"{what} {path}: cannot be read ({cause.strerror or cause})") from None
    except pickle.UnpicklingError:  # torch's advice to load it unsafely is not for protorl's files
        raise UnreadableFileError(f"{what} {path}: holds something other than tensors and plain data (objects "
                                  "whose loading could run code, or a corrupted file): refused") from None
    except Exception as cause:  # torch raises many types for corrupt, truncated or unsafe files
        raise UnreadableFileError(f"{what} {path}: cannot be read as a protorl {what} "
                                  f"({first_line(cause)})") from None
    if not isinstance(payload, dict):
        raise error(f"{what} {path}: not a protorl {what}")
    key, first = sealed_from
    if digest is None and isinstance(payload.get(key), int) and payload[key] >= first:
        raise UnreadableFileError(f"{what} {path}: has no digest, although its {key} {payload[key]} is always "
                                  "written with one: the file changed after it was written")
    if digest is None and path.resolve() not in _unverified:
        _unverified.add(path.resolve())
        log.warning("%s %s was written without a digest (%s %s, by protorl 0.2.0 or earlier): it is read, but its "
                    "content cannot be verified", what, path, key, payload.get(key))
    return payload, digest


_unverified: set[Path] = set()  # the files without a digest that this process has warned about


def remove_partial_writes(directory: Path) -> None:
    """Delete the temporary files that a write killed before its rename left in `directory`."""
    if directory.is_dir():
        for path in directory.glob("*.tmp"):
            path.unlink()
