"""Digests that make a changed file visible: every checkpoint, snapshot and result record carries the SHA-256 of
its content, written with it and checked whenever it is read.

Checkpoints and snapshots are zip archives (`torch.save`'s format). Their digest is the archive's zip comment,
`protorl sha256 <64 hex digits>`: the SHA-256 of every byte of the file before the comment. A zip reader ignores
the comment, so torch and earlier protorl versions read these files as before, and `unzip -z FILE` shows the digest.
A file written before digests existed ends with a zip archive's end record and no comment: it is read, but its
content cannot be verified. Result records (`result.json`) hold theirs under the key `sha256`.

A digest detects corruption (a disk, a copy, a flipped bit), not tampering: anyone who can change a file can
write a new digest for it. That files never run code when read is `torch.load(weights_only=True)`'s part.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import BinaryIO

from protorl.errors import UnreadableFileError

DIGEST_MARK = b"protorl sha256 "
COMMENT_SIZE = len(DIGEST_MARK) + 64
END_SIGNATURE = b"PK\x05\x06"  # a zip archive's end-of-central-directory record: 22 bytes, its comment's length last
END_SIZE = 22
CHUNK_BYTES = 2**20
RECORD_DIGEST_KEY = "sha256"
RECORD_VERSION_KEY = "record_version"
RECORD_VERSION = 2  # 2: always written with its digest (a record without `record_version` may be without one)


def sha256_of(file: BinaryIO, length: int) -> str:
    """The SHA-256 of the first `length` bytes of `file`, in hex, read in chunks; the file is left after them."""
    digest = hashlib.sha256()
    file.seek(0)
    while length > 0:
        block = file.read(min(CHUNK_BYTES, length))
        if not block:
            break
        digest.update(block)
        length -= len(block)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's whole content, in hex (what `sha256sum` prints)."""
    with open(path, "rb") as file:
        return sha256_of(file, os.fstat(file.fileno()).st_size)


def seal_archive(file: BinaryIO) -> str:
    """Attach the digest to the zip archive `torch.save` has just written to `file` (opened for reading and
    writing) as its comment; returns the digest."""
    size = file.seek(0, os.SEEK_END)
    file.seek(size - END_SIZE)
    end = file.read(END_SIZE)
    if not (end.startswith(END_SIGNATURE) and end.endswith(b"\0\0")):
        raise RuntimeError("torch.save wrote no zip archive without a comment: protorl cannot attach its digest")
    file.seek(size - 2)
    file.write(COMMENT_SIZE.to_bytes(2, "little"))
    digest = sha256_of(file, size)
    file.seek(size)
    file.write(DIGEST_MARK + digest.encode())
    return digest


def archive_digest(file: BinaryIO, path: Path, what: str) -> str | None:
    """The digest that the archive in `file` carries, checked against its content; None for an archive written
    without one. `UnreadableFileError` naming `what` and `path` if the content does not match its digest, or if
    the file does not end as an archive does (cut short, or not a file protorl wrote)."""
    size = file.seek(0, os.SEEK_END)
    file.seek(max(size - END_SIZE - COMMENT_SIZE, 0))
    tail = file.read()
    end, comment = tail[:END_SIZE], tail[END_SIZE:]
    if (len(tail) == END_SIZE + COMMENT_SIZE and end.startswith(END_SIGNATURE)
            and end[-2:] == COMMENT_SIZE.to_bytes(2, "little") and comment.startswith(DIGEST_MARK)):
        written = comment[len(DIGEST_MARK):].decode("ascii", errors="replace")
        found = sha256_of(file, size - COMMENT_SIZE)
        if found != written:
            raise UnreadableFileError(f"{what} {path}: its content does not match the digest written with it "
                                      f"(SHA-256 {found} now, {written} when written): the file changed after it "
                                      "was written (a disk or copy error)")
        return written
    if tail[-END_SIZE:].startswith(END_SIGNATURE) and tail.endswith(b"\0\0"):
        return None
    raise UnreadableFileError(f"{what} {path}: not a whole protorl {what} (cut short, or not a file protorl wrote)")


def written_digest(path: Path) -> str | None:
    """The digest an archive carries in its comment, read from its last bytes only (its content is not hashed);
    None for a file without one. `OSError` if it cannot be read."""
    with open(path, "rb") as file:
        size = file.seek(0, os.SEEK_END)
        file.seek(max(size - COMMENT_SIZE, 0))
        comment = file.read()
    return comment[len(DIGEST_MARK):].decode("ascii", errors="replace") if comment.startswith(DIGEST_MARK) else None


def sealed_record(data: dict) -> str:
    """`data` as the JSON text of a result record of `RECORD_VERSION`, with the digest of its content under
    `RECORD_DIGEST_KEY`."""
    data = {**data, RECORD_VERSION_KEY: RECORD_VERSION}
    return json.dumps({**data, RECORD_DIGEST_KEY: _record_sha256(data)}, indent=1)


def unsealed_record(text: str) -> dict:
    """The data of a result record's JSON text, checked against its digest (a record written before digests
    existed has none, and is taken as it is); `ValueError` saying what is wrong otherwise."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if RECORD_DIGEST_KEY not in data:
        if RECORD_VERSION_KEY in data:
            raise ValueError(f"it has no digest, although its {RECORD_VERSION_KEY} {data[RECORD_VERSION_KEY]!r} is "
                             "always written with one: it changed after it was written")
        return data
    written = data.pop(RECORD_DIGEST_KEY)
    if written != _record_sha256(data):
        raise ValueError("its content does not match the digest written with it")
    data.pop(RECORD_VERSION_KEY, None)
    return data


def _record_sha256(data: dict) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
