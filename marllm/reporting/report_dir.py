"""Where a report may be written: a directory holding no file under the report's names, or the report marllm wrote
there before (which the new one replaces, figures it no longer draws included)."""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

from marllm.run.run_dir import WrongDirectoryError
from marllm.run.run_files import REPORT_ENTRIES
from marllm.utils.files import read_json_object

SUMMARY_FILE = "summary.json"
REPORT_KIND = "marllm-run-report"
"""The ``kind`` of a report's ``summary.json``: what makes the files beside it marllm's."""


def claim_report_dir(out_dir: Path) -> list[str]:
    """Create ``out_dir`` if missing and return the report files in it that an earlier report wrote.

    Raises:
        WrongDirectoryError: ``out_dir`` holds a file under a report's name (``report.md``, ``summary.json``, a
            figure) but no ``summary.json`` of a marllm report: the user's file, which is never written over.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    present = [name for name in REPORT_ENTRIES if (out_dir / name).exists()]
    if present and not _is_marllm_report(out_dir / SUMMARY_FILE):
        raise WrongDirectoryError(
            f"{out_dir} holds {', '.join(present)} but no summary.json of a marllm report: files marllm did not "
            f"write, which a report never writes over; move them out of {out_dir}, or give the report another --out"
        )
    # Claimed before any figure is drawn: a report that fails halfway leaves a directory the next one may take.
    (out_dir / SUMMARY_FILE).write_text(json.dumps({"kind": REPORT_KIND, "status": "writing"}) + "\n")
    return present


def remove_stale(out_dir: Path, earlier: Collection[str], written: Collection[str]) -> None:
    """Delete the files of the earlier report that this one did not write again (a figure it had nothing to draw
    for), so that the directory holds one report."""
    for name in sorted(set(earlier) - set(written)):
        (out_dir / name).unlink(missing_ok=True)


def _is_marllm_report(summary: Path) -> bool:
    data = read_json_object(summary)
    # Reports written before summary.json named its kind are recognised by their keys.
    return data.get("kind") == REPORT_KIND or {"runs", "final", "figures", "final_k"} <= data.keys()
