"""The files of a study directory, named once: the study file as run, its expansion into runs, a failed run's error."""

STUDY_FILE = "study.yaml"
"""The study file as it was run (variants, grid and seeds made explicit)."""
EXPANSION_FILE = "study.json"
"""Every run of the study with its overrides and directory; what ``marllm study report`` reads."""
ERROR_FILE = "error.txt"
"""In a run's directory: the error a failed run stopped with."""
