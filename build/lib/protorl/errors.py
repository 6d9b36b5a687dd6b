"""protorl's errors: one hierarchy, so the command line turns every one of them into one line for the user.

    ProtorlError                  what the user can fix; its message says what to change
    ├── ConfigError               an invalid configuration value, or a run directory that refuses the config
    ├── SnapshotError             a snapshot that cannot be read, or was made for another env or agent
    ├── CheckpointError           a checkpoint that cannot be written, read, or resumed by this run
    │   └── UnreadableFileError   a checkpoint or snapshot file that is not whole
    ├── ResultsError              run or sweep directories that cannot be reported, analysed or aggregated
    └── TrainingDiverged          a loss or metric became NaN or infinite

    RunInterrupted                Ctrl-C stopped a run (a KeyboardInterrupt, not an error)
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ProtorlError(Exception):
    """An error the user can fix; the message names what is wrong and what to change."""


class ConfigError(ProtorlError, ValueError):
    """A configuration value is invalid; the message names the key and the accepted values."""


class SnapshotError(ProtorlError):
    """A snapshot cannot be read, or was pre-trained for another environment or agent architecture."""


class CheckpointError(ProtorlError):
    """A checkpoint cannot be written, read, or resumed by this run."""


class UnreadableFileError(CheckpointError, SnapshotError):
    """A checkpoint or snapshot file is not whole (cut short, corrupted, or not a protorl file)."""


class ResultsError(ProtorlError, ValueError):
    """Run or sweep directories cannot be reported, analysed or aggregated as asked."""


class TrainingDiverged(ProtorlError, RuntimeError):
    """A loss or metric became NaN or infinite; the message names it and the last good checkpoint."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run; the message says at which frame, and which checkpoint a rerun resumes from."""


def did_you_mean(name: str, options: Iterable[str]) -> str:
    """" (did you mean X?)" naming the options closest to a mistyped `name`; "" if none is close."""
    close = difflib.get_close_matches(name, list(options), n=3, cutoff=0.8)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its type's name if it has none): what a one-line report shows."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
