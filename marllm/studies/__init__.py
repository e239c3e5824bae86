"""Studies: a study file expands configs × variants × grid × seeds into ordinary runs, run by an executor.

See :mod:`marllm.studies.spec` for the study file and :mod:`marllm.studies.execute` for running one. The names
below are imported on first use, so that ``marllm.studies.report`` loads without the training stack.
"""

from __future__ import annotations

from marllm.utils.lazy_exports import lazy_exports

_EXPORTS = {
    "Executor": "marllm.studies.execute",
    "LocalExecutor": "marllm.studies.local_executor",
    "RayExecutor": "marllm.studies.ray_executor",
    "RunOutcome": "marllm.studies.worker",
    "run_study": "marllm.studies.execute",
    "Study": "marllm.studies.spec",
    "StudyRun": "marllm.studies.spec",
    "load_study": "marllm.studies.spec",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
