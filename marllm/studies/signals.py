"""How signals stop a study: SIGTERM takes the Ctrl-C path (a KeyboardInterrupt that remembers its signal), and
SIGINT is ignored while a worker process starts."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


class Terminated(KeyboardInterrupt):
    """SIGTERM, taking the Ctrl-C path (a KeyboardInterrupt) but remembering which signal it was."""

    signal_number = signal.SIGTERM
    received = False
    """Set when the handler ran: Ray re-raises an interrupt that reaches it inside ``ray.wait`` as a plain
    KeyboardInterrupt, so the exception alone cannot always tell."""


def stopping_signal(stop: KeyboardInterrupt) -> signal.Signals:
    """The signal that stopped a study: SIGTERM when :func:`sigterm_interrupts`' handler ran, else SIGINT."""
    return signal.SIGTERM if isinstance(stop, Terminated) or Terminated.received else signal.SIGINT


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """In the main thread, make SIGTERM raise :class:`Terminated` (the Ctrl-C path) for the block, then put back the
    handler it replaced where that was Python's (nothing is installed in another thread)."""

    def interrupt(number: int, frame: FrameType | None) -> None:
        Terminated.received = True
        raise Terminated

    Terminated.received = False
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, interrupt) if main else None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """Ignore SIGINT for a moment (a process spawned meanwhile inherits that until it installs its own handler)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
