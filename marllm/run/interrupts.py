"""Stopping a training run cleanly on SIGINT (Ctrl-C) or SIGTERM.

The first signal asks the loop to stop once the current iteration is done (it then writes a checkpoint); a second
one stops at once. Once training has ended and its checkpoint is written, the first signal stops at once.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(KeyboardInterrupt):
    """A training run stopped by SIGINT or SIGTERM.

    Attributes:
        signal_number: the signal (``signal.SIGINT`` or ``signal.SIGTERM``).
        run_dir: the run directory (None when the signal came before the run had one).
        completed: iterations completed and logged.
        planned: the run's ``iterations``.
        checkpoint: the iteration of the run's latest training checkpoint (None: none written).
        at_once: True when the run stopped without finishing what it was doing (a second signal, or a signal after
            training had ended); False when it finished its iteration and wrote a checkpoint first.
    """

    def __init__(
        self,
        signal_number: int,
        run_dir: Path | None = None,
        completed: int = 0,
        planned: int | None = None,
        checkpoint: int | None = None,
        at_once: bool = True,
    ):
        self.signal_number = signal_number
        self.run_dir = run_dir
        self.completed = completed
        self.planned = planned
        self.checkpoint = checkpoint
        self.at_once = at_once
        super().__init__(self.summary())

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signal_number).name

    @property
    def exit_status(self) -> int:
        """The shell's status for a process ended by this signal: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signal_number

    @property
    def resumable(self) -> bool:
        return self.checkpoint is not None

    def summary(self) -> str:
        """One line: what stopped the run, how far it got, and which checkpoint it leaves."""
        how = f"stopped at once by {self.signal_name}" if self.at_once else f"stopped by {self.signal_name}"
        done = f"{self.completed} of {self.planned}" if self.planned is not None else str(self.completed)
        if self.planned is not None and self.completed >= self.planned:
            where = f"after training ended ({done} iterations) and before the end-of-run evaluation was written"
        else:
            where = f"after {done} iterations"
        if self.checkpoint is None:
            kept = "no checkpoint was written"
        elif self.checkpoint == self.completed and not self.at_once:
            kept = f"checkpoint written at iteration {self.checkpoint}"
        else:
            kept = f"its latest checkpoint (iteration {self.checkpoint}) stays"
        return f"{how} {where}; {kept}"


class StopSignals:
    """A context manager that turns SIGINT and SIGTERM into a stop request while a run trains.

    While :attr:`graceful` is True, the first signal only sets :attr:`received` (the loop checks it between
    iterations) and prints what will happen; a second signal, or any signal once :attr:`graceful` is False, raises
    :class:`TrainingInterrupted` at once. The previous handlers are restored on exit. Outside the main thread
    (where Python cannot install handlers) nothing is installed and Ctrl-C stays a plain ``KeyboardInterrupt``.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self.graceful = True
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for number in SIGNALS:
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    @property
    def requested(self) -> bool:
        """Whether a signal asked the run to stop."""
        return self.received is not None

    def _handle(self, number: int, frame: FrameType | None) -> None:
        if self.graceful and self.received is None:
            self.received = number
            again = "press Ctrl-C again" if number == signal.SIGINT else "send it again"
            print(
                f"\nmarllm: {signal.Signals(number).name}: stopping after the current iteration and writing a "
                f"checkpoint ({again} to stop at once)",
                file=sys.stderr,
                flush=True,
            )
            return
        self.received = number
        raise TrainingInterrupted(number)
