"""The CORY paper's sentiment task: continue the opening of a movie review so that it reads positive.

Query: the first 2–8 tokens (policy tokenizer) of a review. Pioneer prompt: the query. Observer prompt:
``I can make this sentence "<query + pioneer response>" more positive: <query>``. Reward: the positive-class logit
of a sentiment classifier on query + response.

Every review (of any dataset, a local file included) is cut to its opening, and reviews shorter than
``min_text_chars`` are dropped: that is the paper's recipe, not a way to use prompts of one's own. Prompts used as
written are the plain text task's (:mod:`marllm.tasks.text`, ``task.name: text``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np

from marllm.assets import offline_assets, resolve_dataset
from marllm.assets.references import check_dataset_reference, check_model_reference
from marllm.tasks.base import TaskParts, load_text_dataset, local_file
from marllm.utils.data_formats import suffix_list

if TYPE_CHECKING:
    import datasets
    from transformers import PreTrainedTokenizerBase

    from marllm.rewards.sentiment import TextScoreReward

PIONEER_TEMPLATE = "{query}"
OBSERVER_TEMPLATE = 'I can make this sentence "{query}{pioneer}" more positive: {query}'


@dataclass
class SentimentTask:
    """Configuration of the sentiment task: the opening (``query_min_tokens`` to ``query_max_tokens`` tokens) of each
    review of at least ``min_text_chars`` characters; the rest of the review is dropped.

    Attributes:
        dataset: hub id (``imdb``), local file, or ``marllm:offline-reviews`` (the embedded offline corpus).
        split: training split; for the offline corpus ``heldout`` (reviews neither the base model nor the reward
            model trained on) or ``train``.
        eval_split: split whose queries evaluate agents deployed alone (None: the training split's queries, which
            the report then calls training queries).
        text_column: column holding the review.
        min_text_chars: reviews shorter than this are dropped (as in the paper's setup, 200).
        max_samples: keep at most this many reviews (None: all).
        query_min_tokens, query_max_tokens: query length range in policy tokens, drawn per review.
        reward_model: hub id or directory of a Hugging Face sequence classifier, a directory of marllm's n-gram
            classifier, or ``marllm:offline-sentiment``.
        positive_label: the classifier label whose logit is the reward.
        reward_batch_size: texts per classifier forward pass.
    """

    name: Literal["sentiment"] = "sentiment"
    dataset: str = "imdb"
    split: str = "train"
    eval_split: str | None = "test"
    text_column: str = "text"
    min_text_chars: int = 200
    max_samples: int | None = None
    query_min_tokens: int = 2
    query_max_tokens: int = 8
    reward_model: str = "lvwerra/distilbert-imdb"
    positive_label: str = "POSITIVE"
    reward_batch_size: int = 64
    binary_reward: ClassVar[bool] = False
    """The reward is a classifier's logit, not 0/1: pass@k does not apply."""

    def __post_init__(self) -> None:
        if not 1 <= self.query_min_tokens <= self.query_max_tokens:
            raise ValueError(
                f"task.query_min_tokens ({self.query_min_tokens}) and task.query_max_tokens "
                f"({self.query_max_tokens}) must satisfy 1 <= min <= max"
            )
        if self.max_samples is not None and self.max_samples < 1:
            raise ValueError(f"task.max_samples must be >= 1 or null, got {self.max_samples}")
        if self.reward_batch_size < 1:
            raise ValueError(f"task.reward_batch_size must be >= 1, got {self.reward_batch_size}")

    def build(self, tokenizer: PreTrainedTokenizerBase, seed: int, device: str = "auto") -> TaskParts:
        """Load reviews, cut them into queries with ``tokenizer``, and load the reward model.

        A local file is one split: when both splits name it, it is read once.
        """
        source = resolve_dataset(self.dataset, self.split)
        reviews = self._load(source, self.split)
        train = self.queries(reviews, tokenizer, seed)
        evaluation = None
        if self.eval_split is not None and self.eval_split != self.split:
            eval_source = resolve_dataset(self.dataset, self.eval_split)
            if eval_source != source or local_file(source) is None:
                reviews = self._load(eval_source, self.eval_split)
            evaluation = self.queries(reviews, tokenizer, seed + 1)
        return TaskParts(
            dataset=train,
            templates=self.default_templates(),
            reward_fn=self.reward(device),
            eval_dataset=evaluation,
        )

    def default_templates(self) -> dict[str, str]:
        return {"pioneer": PIONEER_TEMPLATE, "observer": OBSERVER_TEMPLATE}

    def check_references(self) -> None:
        """Check that ``dataset`` and ``reward_model`` exist, locally or in the cache while the hub is offline."""
        local = f"a local {suffix_list()} file"
        check_dataset_reference(self.dataset, "task.dataset", local, asset="offline-reviews")
        check_model_reference(self.reward_model, "task.reward_model", asset="offline-sentiment")

    def load_split(self, split: str) -> datasets.Dataset:
        """The reviews of ``split``, checked: a non-empty dataset whose ``text_column`` holds non-blank text."""
        return self._load(resolve_dataset(self.dataset, split), split)

    def _load(self, source: str, split: str) -> datasets.Dataset:
        """The reviews in ``source`` (the resolved ``dataset``), checked as :meth:`load_split` says."""
        return load_text_dataset(source, split, text_columns=[self.text_column], name=f"{self.dataset}:{split}")

    def queries(self, reviews: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, seed: int) -> datasets.Dataset:
        """Keep reviews of at least ``min_text_chars`` and add a ``query`` column: their first k tokens.

        ``reviews``: as :meth:`load_split` returns them, checked (``text_column`` holds non-blank strings).
        """
        source = f"{self.dataset}:{self.split}"
        column = self.text_column
        reviews = reviews.filter(lambda batch: [len(t) >= self.min_text_chars for t in batch[column]], batched=True)
        if len(reviews) == 0:
            raise ValueError(f"dataset {source!r} has no review of at least {self.min_text_chars} characters")
        if self.max_samples is not None:
            reviews = reviews.select(range(min(self.max_samples, len(reviews))))
        lengths = np.random.default_rng(seed).integers(
            self.query_min_tokens, self.query_max_tokens + 1, size=len(reviews)
        )

        def cut(batch: dict[str, list], indices: list[int]) -> dict[str, list]:
            return {"query": text_openings(tokenizer, batch[column], [int(lengths[i]) for i in indices])}

        return reviews.map(cut, batched=True, with_indices=True)

    def reward(self, device: str = "auto") -> TextScoreReward:
        """The classifier's positive logit on query + response."""
        # Imported here: both load torch, which the config (it imports this task to check it) must not.
        from marllm.assets.offline.sentiment_classifier import VOCABULARY_FILE, SentimentClassifier
        from marllm.rewards.sentiment import ClassifierReward, TextScoreReward

        assets = offline_assets(self.reward_model, "offline-sentiment", "task.reward_model")
        directory = assets.reward_model_dir if assets is not None else Path(self.reward_model)
        if (directory / VOCABULARY_FILE).is_file():
            # marllm's own n-gram classifier (the offline reward model, or one saved elsewhere)
            classifier = SentimentClassifier.load(directory)
            return TextScoreReward(classifier.positive_logits)
        return ClassifierReward(self.reward_model, self.positive_label, self.reward_batch_size, device)


def text_openings(tokenizer: PreTrainedTokenizerBase, texts: list[str], counts: list[int]) -> list[str]:
    """The opening of each text that its first ``count`` tokens cover, cut on a character boundary.

    A byte-level tokenizer splits a multi-byte character (an emoji, an Arabic letter) over several tokens, so
    decoding a token prefix can end in half a character (``'\ufffd'``). A fast tokenizer's offsets are character
    offsets, and a token holding part of a character spans the whole character: the text is cut at the furthest end
    offset of its first ``count`` tokens, so each opening is a prefix of its text. A slow tokenizer's decoded prefix
    loses a trailing partial character instead.
    """
    # Only the first max(counts) tokens matter: truncating keeps them as they are and skips the rest of each review.
    cut = {"add_special_tokens": False, "truncation": True, "max_length": max(counts, default=1)}
    if not tokenizer.is_fast:
        ids = tokenizer(texts, **cut)["input_ids"]
        heads = [row[:count] for row, count in zip(ids, counts, strict=True)]
        return [text.rstrip("\ufffd") for text in tokenizer.batch_decode(heads)]
    offsets = tokenizer(texts, return_offsets_mapping=True, **cut)["offset_mapping"]
    return [
        text[: max((end for _, end in spans[:count]), default=0)]
        for text, spans, count in zip(texts, offsets, counts, strict=True)
    ]
