"""How torch's worker threads wait: briefly, so that a busy machine does not make them spin against its other work.

torch's CPU kernels run on an OpenMP thread pool (GNU libgomp in the PyPI wheels for Linux). Between two parallel
regions each idle thread spins for ``GOMP_SPINCOUNT`` iterations (300,000 by default, about a millisecond) before it
sleeps. On a machine with as many threads as cores and nothing else to run that costs nothing; but when another
process shares the cores, the spinning threads burn the time slices that the thread doing work needs, and every
region waits for its slowest thread: on 2 cores beside one busy single-threaded process the shared CORY workload ran
3.2x slower than alone, against 1.5x with a spin of 1,000 (``benchmarks/bench_busy_machine.py``). libgomp reads the
setting once, when it is loaded: it must be in the environment before torch is imported.
"""

from __future__ import annotations

import os

__all__ = ["SPIN_COUNT", "wait_briefly_when_idle"]

SPIN_COUNT = "1000"


def wait_briefly_when_idle(environ: dict[str, str] | None = None) -> bool:
    """Set ``GOMP_SPINCOUNT`` to :data:`SPIN_COUNT` unless ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` is already set
    (a user's own choice wins); return whether it was set. Call it before torch is imported: the ``marllm`` command
    does, and its study workers and ``--nproc`` ranks inherit it. Without effect on a torch already imported."""
    environ = os.environ if environ is None else environ
    if "GOMP_SPINCOUNT" in environ or "OMP_WAIT_POLICY" in environ:
        return False
    environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    return True
