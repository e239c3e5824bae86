"""``marllm train --nproc N``: a thin launcher that runs the same command on N data-parallel ranks through torchrun.

torchrun (``torch.distributed.run``) starts the ranks on this machine (``--standalone``: a local rendezvous on a free
port), restarts nothing (a failed rank fails the run) and sets each rank's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``,
from which :func:`marllm.run.train.train` joins the process group. Launching torchrun by hand does the same:
``torchrun --nproc-per-node N -m marllm.cli train CONFIG …``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Sequence
from types import FrameType

from marllm.parallel.distributed import launched_world_size


def torchrun_command(nproc: int, train_arguments: Sequence[str]) -> list[str]:
    """The torchrun command line that runs ``marllm train TRAIN_ARGUMENTS`` on ``nproc`` local ranks."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "marllm.cli",
        "train",
        *train_arguments,
    ]


def launch_ranks(nproc: int, train_arguments: Sequence[str]) -> int:
    """Run ``marllm train TRAIN_ARGUMENTS`` on ``nproc`` ranks and return torchrun's exit status.

    torchrun runs in its own session, so that a Ctrl-C at the terminal reaches this process only; it is passed on
    once, as SIGTERM, and torchrun hands it to every rank: they stop after their current iteration with a
    checkpoint. torchrun kills ranks that are not done 30 s after that; the run then resumes from its latest
    checkpoint like any stopped run.
    """
    if launched_world_size() > 1:
        raise RuntimeError(
            "marllm train --nproc launches torchrun, but this process is already one of several ranks; run "
            "`marllm train` without --nproc under torchrun"
        )
    process = subprocess.Popen(torchrun_command(nproc, train_arguments), start_new_session=True)

    def forward(number: int, frame: FrameType | None) -> None:
        process.send_signal(signal.SIGTERM)

    previous = {number: signal.signal(number, forward) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        return process.wait()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
