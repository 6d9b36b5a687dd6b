"""Ctrl-C during a phase: the first press stops it at the next episode end, after a checkpoint there (where a
checkpoint resumes exactly); a second press stops it at once."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("protorl")


class StopRequest:
    """Whether Ctrl-C has asked the phase to stop (`requested`); a second Ctrl-C raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.requested = False

    def interrupt(self, signum: int, frame) -> None:
        """The SIGINT handler."""
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        log.warning("Ctrl-C: stopping at the end of this episode, after writing a checkpoint there "
                    "(Ctrl-C again stops now)")


@contextmanager
def stop_request() -> Iterator[StopRequest]:
    """A `StopRequest` that Ctrl-C sets while the block runs. Only in the main thread, and only where Ctrl-C has
    Python's own handler: a handler someone else installed is left alone (the request then stays unset)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield request
        return
    signal.signal(signal.SIGINT, request.interrupt)
    try:
        yield request
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
