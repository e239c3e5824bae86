"""An n-gram sentiment classifier: the offline stand-in for ``lvwerra/distilbert-imdb`` as the RL reward.

The model is linear in the binary presence of word uni- and bi-grams: ``logit = bias + sum of the weights of
the n-grams present``. It is fitted as binarised multinomial naive Bayes (log-count ratios), which is strong
on small sentiment corpora, and then Platt-calibrated on cross-fitted scores so that ``positive_logits`` is the
log-odds of the positive class on short text (the calibration pulls NB's over-confident sums back to honest
odds). Short text is in-distribution because the reviews are fitted as windows of ``window_words`` words,
alongside the one-sentence snippets.

Storage is safe and plain: ``weights.safetensors`` (``weight`` per vocabulary entry, ``bias``),
``vocabulary.json`` (the n-grams, in weight order) and ``config.json`` (format and hyperparameters); no pickle.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

__all__ = [
    "SENTIMENT_PROBES",
    "ClassifierRecipe",
    "SentimentClassifier",
    "review_windows",
    "train_reward_model",
]

FORMAT = "marllm-ngram-sentiment"
FORMAT_VERSION = 1
WEIGHTS_FILE = "weights.safetensors"
VOCABULARY_FILE = "vocabulary.json"
CONFIG_FILE = "config.json"
#: words (with inner apostrophes, as in "didn't") and single punctuation marks, on lower-cased text
TOKEN_PATTERN = r"[a-z0-9]+(?:'[a-z0-9]+)*|[^\sa-z0-9]"
#: short texts whose scores the prepare step reports, as a sanity check of the reward's grading
SENTIMENT_PROBES = (
    "this movie was wonderful",
    "this film is a masterpiece , i loved every minute",
    "this movie was",
    "the plot follows a man who moves to a small town",
    "this movie was terrible",
    "a boring , stupid mess with awful acting",
)


@dataclass(frozen=True)
class ClassifierRecipe:
    """How the reward classifier is fitted.

    Args:
        ngram_max: longest word n-gram used as a feature (1 = unigrams, 2 = uni- and bigrams).
        min_count: an n-gram must occur in this many training examples to get a weight.
        alpha: additive smoothing of the naive Bayes counts; larger shrinks rare n-grams towards 0.
        window_words: reviews are fitted as consecutive windows of this many words, labelled with the review's
            label, so that the scores suit the ~10-25 word texts the RL scores.
        snippet_weight: weight of a snippet relative to a review window (snippets are cleanly labelled).
        calibrate_on_snippets: fit the Platt calibration on snippets only. A window of plot summary from a
            positive review is not positive text, so windows' noisy labels would shrink every score towards 0.
        calibration_folds: folds of the cross-fitting that produces held-in scores for Platt calibration.
        seed: seed of the fold assignment.
    """

    ngram_max: int = 2
    min_count: int = 2
    alpha: float = 3.0
    window_words: int = 20
    snippet_weight: float = 6.0
    calibration_folds: int = 3
    calibrate_on_snippets: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("ngram_max", "min_count", "window_words"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ClassifierRecipe.{name} must be a positive int, got {value!r}")
        if self.calibration_folds < 2:
            raise ValueError(f"ClassifierRecipe.calibration_folds must be >= 2, got {self.calibration_folds}")
        if self.alpha <= 0 or self.snippet_weight <= 0:
            raise ValueError("ClassifierRecipe.alpha and snippet_weight must be > 0")


def review_windows(text: str, window_words: int) -> list[str]:
    """Cut ``text`` into consecutive windows of ``window_words`` words.

    A last window shorter than half the length is dropped unless it is the only one.
    """
    words = text.split()
    windows = [" ".join(words[i : i + window_words]) for i in range(0, len(words), window_words)]
    if len(windows) > 1 and len(words) % window_words and len(words) % window_words < window_words / 2:
        windows.pop()
    return windows


class SentimentClassifier:
    """Linear sentiment model over binary word n-gram presence; scores whole batches with one ``embedding_bag``.

    Args:
        vocabulary: the n-grams with a weight (words joined by one space), in weight order.
        weight: one weight per vocabulary entry (log-odds contribution of the n-gram's presence).
        bias: log-odds of text with no known n-gram.
        ngram_max: longest n-gram extracted from a text.
        metadata: free-form JSON-safe facts stored in ``config.json`` (hyperparameters, metrics).
    """

    def __init__(self, vocabulary: Sequence[str], weight: np.ndarray | torch.Tensor, bias: float,
                 ngram_max: int = 2, metadata: dict[str, Any] | None = None) -> None:
        weight = torch.as_tensor(np.asarray(weight, dtype=np.float32)).reshape(-1)
        if len(vocabulary) != len(weight):
            raise ValueError(f"vocabulary has {len(vocabulary)} entries but weight has {len(weight)}")
        if not torch.isfinite(weight).all() or not math.isfinite(bias):
            raise ValueError("SentimentClassifier weights and bias must be finite")
        self.vocabulary = list(vocabulary)
        self.index = {gram: i for i, gram in enumerate(self.vocabulary)}
        if len(self.index) != len(self.vocabulary):
            raise ValueError("SentimentClassifier vocabulary has duplicate entries")
        self.weight = weight
        self.bias = float(bias)
        self.ngram_max = ngram_max
        self.metadata = dict(metadata or {})
        self._token = re.compile(TOKEN_PATTERN)

    # ----- features -----------------------------------------------------------------------------------------
    def ngrams(self, text: str) -> set[str]:
        """The set of word n-grams (n = 1..ngram_max) of lower-cased ``text``."""
        words = self._token.findall(text.lower())
        return {" ".join(words[i : i + n]) for n in range(1, self.ngram_max + 1) for i in range(len(words) - n + 1)}

    def feature_ids(self, text: str) -> list[int]:
        """Vocabulary ids of the n-grams present in ``text`` (unknown n-grams contribute nothing)."""
        index = self.index
        return sorted(index[g] for g in self.ngrams(text) if g in index)

    def _bags(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(texts, str):
            raise TypeError("pass a sequence of texts, not a single string")
        ids = [self.feature_ids(text) for text in texts]
        lengths = np.array([len(row) for row in ids], dtype=np.int64)
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64))
        flat = torch.tensor([i for row in ids for i in row], dtype=torch.long)
        return flat, offsets

    # ----- scoring ------------------------------------------------------------------------------------------
    def positive_logits(self, texts: Sequence[str]) -> np.ndarray:
        """Log-odds of the positive class for each text, as a float32 array of ``len(texts)``."""
        if len(texts) == 0:
            return np.zeros(0, dtype=np.float32)
        flat, offsets = self._bags(texts)
        with torch.no_grad():
            sums = torch.nn.functional.embedding_bag(flat, self.weight[:, None], offsets, mode="sum")  # (B, 1)
        return (sums[:, 0] + self.bias).numpy()

    def predict(self, texts: Sequence[str]) -> np.ndarray:
        """Labels, 1 (positive) where the logit is positive, else 0, as an int64 array."""
        return (self.positive_logits(texts) > 0).astype(np.int64)

    # ----- fitting ------------------------------------------------------------------------------------------
    @classmethod
    def fit(cls, texts: Sequence[str], labels: Sequence[int], sample_weight: Sequence[float] | None = None,
            groups: Sequence[int] | None = None, calibration_weight: Sequence[float] | None = None,
            recipe: ClassifierRecipe | None = None) -> SentimentClassifier:
        """Fit naive Bayes log-count ratios, calibrated by Platt scaling on cross-fitted scores.

        Args:
            texts, labels: training examples, labels 1 (positive) or 0 (negative); both classes needed.
            sample_weight: per-example weight (default 1).
            groups: examples with the same group share a cross-fitting fold (the windows of one review), so
                the calibration never scores text whose neighbours it was fitted on. Default: one per example.
            calibration_weight: per-example weight in the Platt fit (default ``sample_weight``); 0 leaves an
                example out, e.g. noisily labelled review windows when clean snippets define the odds.
            recipe: hyperparameters (default :class:`ClassifierRecipe`).
        """
        recipe = recipe or ClassifierRecipe()
        n, y, w, group, cal_w = _fit_arrays(texts, labels, sample_weight, groups, calibration_weight)

        probe = cls([], np.zeros(0), 0.0, recipe.ngram_max)
        grams = [probe.ngrams(text) for text in texts]
        counts: dict[str, int] = {}
        for bag in grams:
            for gram in bag:
                counts[gram] = counts.get(gram, 0) + 1
        vocabulary = sorted(gram for gram, count in counts.items() if count >= recipe.min_count)
        index = {gram: i for i, gram in enumerate(vocabulary)}
        ids = [np.fromiter((index[g] for g in bag if g in index), dtype=np.int64) for bag in grams]
        lengths = np.array([len(i) for i in ids])
        flat = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
        owner = np.repeat(np.arange(n), lengths)  # example of each entry of ``flat``

        def log_count_ratios(mask: np.ndarray) -> tuple[np.ndarray, float]:
            entry = mask[owner]
            pos = np.bincount(flat[entry], weights=(w * (y == 1))[owner][entry], minlength=len(vocabulary))
            neg = np.bincount(flat[entry], weights=(w * (y == 0))[owner][entry], minlength=len(vocabulary))
            pos, neg = pos + recipe.alpha, neg + recipe.alpha
            ratio = np.log(pos / pos.sum()) - np.log(neg / neg.sum())
            prior = math.log(w[mask & (y == 1)].sum() / w[mask & (y == 0)].sum())
            return ratio, prior

        def scores(ratio: np.ndarray, prior: float, mask: np.ndarray) -> np.ndarray:
            entry = mask[owner]
            return prior + np.bincount(owner[entry], weights=ratio[flat[entry]], minlength=n)[mask]

        unique_groups = np.unique(group)
        fold_of_group = np.random.default_rng(recipe.seed).permutation(len(unique_groups)) % recipe.calibration_folds
        fold = fold_of_group[np.searchsorted(unique_groups, group)]
        held_scores = np.zeros(n)
        for k in range(recipe.calibration_folds):
            inside = fold != k
            if len(np.unique(y[inside])) < 2:
                raise ValueError(
                    f"too few examples to cross-fit {recipe.calibration_folds} folds: fold {k} leaves one class"
                )
            ratio, prior = log_count_ratios(inside)
            held_scores[~inside] = scores(ratio, prior, ~inside)
        scale, shift = _platt(held_scores, y, cal_w)

        ratio, prior = log_count_ratios(np.ones(n, dtype=bool))
        metadata = {"recipe": asdict(recipe), "calibration": {"scale": scale, "shift": shift},
                    "training_examples": n}
        return cls(vocabulary, scale * ratio, scale * prior + shift, recipe.ngram_max, metadata)

    # ----- storage ------------------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        """Write ``weights.safetensors``, ``vocabulary.json`` and ``config.json`` into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_file({"weight": self.weight.contiguous(), "bias": torch.tensor([self.bias], dtype=torch.float32)},
                  str(directory / WEIGHTS_FILE))
        (directory / VOCABULARY_FILE).write_text(json.dumps(self.vocabulary, ensure_ascii=False), encoding="utf-8")
        config = {"format": FORMAT, "format_version": FORMAT_VERSION, "ngram_max": self.ngram_max,
                  "token_pattern": TOKEN_PATTERN, "labels": {"0": "negative", "1": "positive"},
                  "metadata": self.metadata}
        (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")

    @classmethod
    def load(cls, directory: str | Path) -> SentimentClassifier:
        """Load a classifier written by :meth:`save`.

        Raises:
            FileNotFoundError: a file is missing.
            ValueError: a file is unreadable, of another format, or inconsistent with the others.
        """
        directory = Path(directory)
        for name in (CONFIG_FILE, VOCABULARY_FILE, WEIGHTS_FILE):
            if not (directory / name).is_file():
                raise FileNotFoundError(f"sentiment classifier file {directory / name} is missing")
        try:
            config = json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8"))
            vocabulary = json.loads((directory / VOCABULARY_FILE).read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"sentiment classifier in {directory} has an unreadable JSON file: {error}") from error
        if config.get("format") != FORMAT or config.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{directory / CONFIG_FILE} describes format {config.get('format')!r} v{config.get('format_version')}; "
                f"expected {FORMAT!r} v{FORMAT_VERSION}"
            )
        if config.get("token_pattern") != TOKEN_PATTERN:
            raise ValueError(f"{directory / CONFIG_FILE} uses another tokenisation than this version of marllm")
        try:
            tensors = load_file(str(directory / WEIGHTS_FILE))
        except Exception as error:  # safetensors raises its own error types for truncated headers/data
            raise ValueError(f"cannot read {directory / WEIGHTS_FILE}: {error}") from error
        if set(tensors) != {"weight", "bias"} or tensors["bias"].numel() != 1:
            raise ValueError(f"{directory / WEIGHTS_FILE} must hold 'weight' and a one-element 'bias'")
        if not isinstance(vocabulary, list) or not all(isinstance(g, str) for g in vocabulary):
            raise ValueError(f"{directory / VOCABULARY_FILE} must be a JSON list of strings")
        try:
            return cls(vocabulary, tensors["weight"].numpy(), float(tensors["bias"]), int(config["ngram_max"]),
                       config.get("metadata"))
        except ValueError as error:
            raise ValueError(f"sentiment classifier in {directory} is inconsistent: {error}") from error


def _fit_arrays(
    texts: Sequence[str], labels: Sequence[int], sample_weight: Sequence[float] | None,
    groups: Sequence[int] | None, calibration_weight: Sequence[float] | None,
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:meth:`SentimentClassifier.fit`'s inputs checked, as arrays: ``(n, labels, sample weights, groups, calibration
    weights)``, the defaults filled in."""
    n = len(texts)
    y = np.asarray(labels, dtype=np.int64)
    if len(y) != n:
        raise ValueError(f"fit got {n} texts but {len(y)} labels")
    if n == 0 or not set(np.unique(y)) <= {0, 1} or len(np.unique(y)) != 2:
        raise ValueError(f"fit needs labels 0 and 1, each at least once; got {sorted(set(y.tolist()))}")
    w = np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    group = np.arange(n) if groups is None else np.asarray(groups)
    cal_w = w if calibration_weight is None else np.asarray(calibration_weight, dtype=np.float64)
    if len(w) != n or len(group) != n or len(cal_w) != n:
        raise ValueError("sample_weight, groups and calibration_weight must have one entry per text")
    if (w < 0).any() or (cal_w < 0).any() or cal_w.sum() <= 0:
        raise ValueError("weights must be non-negative and calibration_weight must not be all zero")
    return n, y, w, group, cal_w


def _platt(scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """Weighted logistic fit of ``labels`` on ``scale * scores + shift``; returns (scale, shift)."""
    s = torch.as_tensor(scores, dtype=torch.float64)
    y = torch.as_tensor(labels, dtype=torch.float64)
    w = torch.as_tensor(weights / weights.sum(), dtype=torch.float64)
    params = torch.tensor([1.0, 0.0], dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([params], max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = (torch.nn.functional.binary_cross_entropy_with_logits(params[0] * s + params[1], y,
                                                                      reduction="none") * w).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    scale, shift = params.detach().tolist()
    if not (math.isfinite(scale) and math.isfinite(shift)) or scale <= 0:
        raise ValueError(f"calibration failed (scale {scale}, shift {shift}): the n-gram scores carry no signal")
    return scale, shift


def train_reward_model(train_rows: Sequence[dict[str, Any]], heldout_rows: Sequence[dict[str, Any]],
                       recipe: ClassifierRecipe, out_dir: Path) -> dict[str, Any]:
    """Fit the classifier on train snippets and review windows, save it to ``out_dir``, return its metrics.

    Metrics: accuracy on held-out whole reviews, held-out snippets and held-out review windows, the
    standard deviation of logits on held-out snippets, and the scores of :data:`SENTIMENT_PROBES`.
    """
    texts, labels, weights, groups, calibration = [], [], [], [], []
    for row_id, row in enumerate(train_rows):
        pieces = [row["text"]] if row["source"] == "snippet" else review_windows(row["text"], recipe.window_words)
        weight = recipe.snippet_weight if row["source"] == "snippet" else 1.0
        texts.extend(pieces)
        labels.extend([row["label"]] * len(pieces))
        weights.extend([weight] * len(pieces))
        groups.extend([row_id] * len(pieces))
        in_calibration = row["source"] == "snippet" or not recipe.calibrate_on_snippets
        calibration.extend([float(in_calibration)] * len(pieces))
    if recipe.calibrate_on_snippets and not any(calibration):
        raise ValueError("calibrate_on_snippets needs snippet rows in the training split")
    classifier = SentimentClassifier.fit(texts, labels, weights, groups, calibration, recipe)

    def accuracy(rows: Sequence[dict[str, Any]]) -> float | None:
        if not rows:
            return None
        return float(np.mean(classifier.predict([r["text"] for r in rows]) == np.array([r["label"] for r in rows])))

    reviews = [r for r in heldout_rows if r["source"] == "review"]
    snippets = [r for r in heldout_rows if r["source"] == "snippet"]
    windows = [
        {"text": w, "label": r["label"]} for r in reviews for w in review_windows(r["text"], recipe.window_words)
    ]
    snippet_logits = classifier.positive_logits([r["text"] for r in snippets])
    metrics = {
        "heldout_review_accuracy": accuracy(reviews),
        "heldout_snippet_accuracy": accuracy(snippets),
        "heldout_window_accuracy": accuracy(windows),
        "heldout_snippet_logit_std": float(snippet_logits.std()) if len(snippets) else None,
        "vocabulary_size": len(classifier.vocabulary),
        "training_examples": len(texts),
        "calibration": classifier.metadata["calibration"],
        "probe_scores": dict(zip(SENTIMENT_PROBES, map(float, classifier.positive_logits(SENTIMENT_PROBES)),
                                 strict=True)),
    }
    classifier.metadata["heldout"] = {k: metrics[k] for k in ("heldout_review_accuracy", "heldout_snippet_accuracy")}
    classifier.save(out_dir)
    return metrics
