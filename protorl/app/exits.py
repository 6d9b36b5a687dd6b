"""How a command ends for its user: one `protorl: error:` line and exit status 2 for what the user can fix, one line
and status 130 for Ctrl-C."""

from __future__ import annotations

import signal
import sys
import threading

INTERRUPTED_STATUS = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C


def exit_interrupted(interrupt: KeyboardInterrupt) -> None:
    """One line saying where Ctrl-C stopped the run and how to resume it; exit status 130. A further Ctrl-C while
    the process exits changes nothing (Python's shutdown would otherwise let it kill the process by the signal)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    where = str(interrupt) or ("interrupted; rerun the same command to resume: completed phases are kept and a "
                               "phase resumes from its last checkpoint")
    print(f"protorl: {where}", file=sys.stderr, flush=True)
    sys.exit(INTERRUPTED_STATUS)


def exit_with(error: Exception | str, status: int = 2) -> None:
    """`protorl: error: <error>` on stderr, then exit with `status`."""
    print(f"protorl: error: {error}", file=sys.stderr, flush=True)
    sys.exit(status)


def one_line(error: BaseException) -> str:
    """An error (Hydra's and OmegaConf's included) as one line: its message, then its cause's, without the
    config search path and the full-key details."""
    parts = []
    for part in (error, error.__cause__):
        text = str(part or "").split("Config search path")[0].split("full_key:")[0]
        text = " ".join(text.replace("\t", " ").split())
        if text and text not in parts:
            parts.append(text)
    return ": ".join(parts) or type(error).__name__
