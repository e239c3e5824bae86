"""Sentiment rewards: a classifier's positive-class logit on query + response, as the CORY paper's IMDB task."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from marllm.models.policy import resolve_device
from marllm.utils.references import model_load_error


class TextScoreReward:
    """Task reward ``score(sample[query_key] + response)`` from any batched text scorer.

    Args:
        score_texts: maps a list of texts to one float per text.
        query_key: the sample field prepended to the response.
    """

    def __init__(self, score_texts: Callable[[list[str]], Sequence[float]], query_key: str = "query"):
        self.score_texts = score_texts
        self.query_key = query_key
        self.__name__ = type(self).__name__

    def __call__(self, samples: list[dict[str, Any]], responses: list[str]) -> np.ndarray:
        if len(samples) != len(responses):
            raise ValueError(f"{self.__name__}: {len(samples)} samples but {len(responses)} responses")
        texts = []
        for i, (sample, response) in enumerate(zip(samples, responses, strict=True)):
            if self.query_key not in sample:
                raise KeyError(
                    f"{self.__name__}: sample {i} has no {self.query_key!r} field (fields: {sorted(sample)})"
                )
            texts.append(sample[self.query_key] + response)
        return np.asarray(self.score_texts(texts), dtype=np.float64)


class ClassifierReward(TextScoreReward):
    """The logit of ``positive_label`` of a Hugging Face sequence classifier (the paper: lvwerra/distilbert-imdb).

    Args:
        model_name_or_path: hub id or local directory of an ``AutoModelForSequenceClassification``.
        positive_label: the label name (``config.id2label``) whose logit is the reward.
        batch_size: texts per forward pass.
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        max_length: texts are truncated to this many tokens.
    """

    def __init__(
        self,
        model_name_or_path: str,
        positive_label: str = "POSITIVE",
        batch_size: int = 64,
        device: str = "auto",
        max_length: int = 512,
    ):
        self.device = resolve_device(device)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
        except (OSError, ValueError) as error:
            raise model_load_error(model_name_or_path, "tokenizer", error, key="task.reward_model") from error
        # Encoder classifiers read absolute positions from the left: pad on the right whatever the saved setting.
        self.tokenizer.padding_side = "right"
        try:
            model = AutoModelForSequenceClassification.from_pretrained(model_name_or_path)
        except (OSError, ValueError) as error:
            raise model_load_error(model_name_or_path, "weights", error, key="task.reward_model") from error
        self.model = model.to(self.device).eval()
        labels = {str(name): int(index) for index, name in self.model.config.id2label.items()}
        if positive_label not in labels:
            raise ValueError(
                f"classifier {model_name_or_path!r} has no label {positive_label!r}; its labels are {sorted(labels)}"
            )
        self.positive_index = labels[positive_label]
        self.batch_size = batch_size
        self.max_length = max_length
        super().__init__(self.positive_logits)

    @torch.no_grad()
    def positive_logits(self, texts: list[str]) -> np.ndarray:
        scores = []
        for start in range(0, len(texts), self.batch_size):
            encoded = self.tokenizer(
                texts[start : start + self.batch_size],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.max_length,
            ).to(self.device)
            logits = self.model(**encoded).logits  # (b, num_labels)
            scores.append(logits[:, self.positive_index].float().cpu())
        return torch.cat(scores).numpy() if scores else np.zeros(0)
