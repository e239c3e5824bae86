"""Shared helpers of the offline-asset tests (no tests here): tiny corpus CSVs and a tiny recipe."""

from __future__ import annotations

import csv
import random
from pathlib import Path

from marllm.assets.offline import BaseModelRecipe, ClassifierRecipe, CorpusRecipe, OfflineRecipe

POSITIVE = ["wonderful", "moving", "superb", "brilliant", "charming", "delightful"]
NEGATIVE = ["terrible", "boring", "awful", "stupid", "dull", "clumsy"]
NEUTRAL = ["the", "film", "plot", "a", "story", "of", "actor", "scene", "and", "is", "with", "director"]

REVIEWS_CSV = "polarity-en-pang&lee1.csv"
SNIPPETS_CSV = "polarity-en-pang&lee2.csv"


def _text(rng: random.Random, words: list[str], n_words: int) -> str:
    return " ".join(rng.choice(words if rng.random() < 0.3 else NEUTRAL) for _ in range(n_words)) + " ."


def write_polarity_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    """Write ``"label","text"`` rows as pattern does: every field quoted, a UTF-8 BOM before the first label."""
    with path.open("w", encoding="utf-8-sig", newline="") as handle:
        csv.writer(handle, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    return path


def write_tiny_corpus(directory: Path, n_reviews: int = 12, n_snippets: int = 24, seed: int = 0) -> Path:
    """Both corpus CSVs with half positive, half negative rows; returns ``directory``."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    reviews = [
        ("1" if i % 2 == 0 else "-1", _text(rng, POSITIVE if i % 2 == 0 else NEGATIVE, 80) + " \n second line .")
        for i in range(n_reviews)
    ]
    snippets = [
        ("1" if i % 2 == 0 else "-1", _text(rng, POSITIVE if i % 2 == 0 else NEGATIVE, 12)) for i in range(n_snippets)
    ]
    write_polarity_csv(directory / REVIEWS_CSV, reviews)
    write_polarity_csv(directory / SNIPPETS_CSV, snippets)
    return directory


def tiny_recipe(**base_model: object) -> OfflineRecipe:
    """A recipe that prepares in a few seconds: 1-layer GPT-2, a few steps, small vocabulary."""
    settings = dict(
        vocab_size=300, min_frequency=2, n_layer=1, n_embd=32, n_head=2, n_positions=64, block_size=32,
        batch_size=4, max_steps=3, warmup_steps=1, arithmetic_fraction=0.2, eval_max_tokens=256,
        sample_new_tokens=4,
    )
    settings.update(base_model)
    return OfflineRecipe(
        corpus=CorpusRecipe(seed=0, heldout_fraction=0.25),
        base_model=BaseModelRecipe(**settings),
        classifier=ClassifierRecipe(window_words=10, calibration_folds=2, min_count=1),
    )
