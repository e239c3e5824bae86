"""The n-gram sentiment classifier used as the offline reward: scoring, fitting, safe storage."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from marllm.assets.offline.sentiment_classifier import (
    ClassifierRecipe,
    SentimentClassifier,
    review_windows,
    train_reward_model,
)
from tests.offline_support import NEGATIVE, NEUTRAL, POSITIVE


def hand_made() -> SentimentClassifier:
    return SentimentClassifier(["good", "bad", "not good", "very"], np.array([1.0, -2.0, -3.0, 0.25]), 0.5)


def test_positive_logits_sum_present_ngram_weights_once_each():
    classifier = hand_made()
    logits = classifier.positive_logits(
        ["good", "not good", "Good, GOOD good!", "", "unknown words only", "very very bad", "bad good"]
    )
    # "not good" has the unigram "good" (+1), the bigram "not good" (-3) and the unknown "not" (0)
    expected = [1.5, 0.5 + 1 - 3, 1.5, 0.5, 0.5, 0.5 + 0.25 - 2, 0.5 - 2 + 1]
    np.testing.assert_allclose(logits, expected, rtol=1e-6)
    assert logits.dtype == np.float32 and logits.shape == (7,)
    np.testing.assert_array_equal(classifier.predict(["good", "bad", "not good"]), [1, 0, 0])
    assert classifier.positive_logits([]).shape == (0,)


def test_a_single_string_is_refused_rather_than_scored_per_character():
    with pytest.raises(TypeError, match="sequence of texts"):
        hand_made().positive_logits("good")


def test_constructor_rejects_inconsistent_models():
    with pytest.raises(ValueError, match="2 entries but weight has 3"):
        SentimentClassifier(["a", "b"], np.zeros(3), 0.0)
    with pytest.raises(ValueError, match="duplicate"):
        SentimentClassifier(["a", "a"], np.zeros(2), 0.0)
    with pytest.raises(ValueError, match="finite"):
        SentimentClassifier(["a"], np.array([np.nan]), 0.0)


def test_save_load_round_trip_gives_identical_logits(tmp_path):
    classifier = hand_made()
    classifier.save(tmp_path / "clf")
    assert sorted(p.name for p in (tmp_path / "clf").iterdir()) == [
        "config.json", "vocabulary.json", "weights.safetensors"
    ]
    loaded = SentimentClassifier.load(tmp_path / "clf")
    texts = ["good", "not good at all", "very bad"]
    np.testing.assert_array_equal(loaded.positive_logits(texts), classifier.positive_logits(texts))
    assert loaded.vocabulary == classifier.vocabulary and loaded.ngram_max == 2


def test_load_names_missing_truncated_and_foreign_files(tmp_path):
    hand_made().save(tmp_path / "clf")
    weights = tmp_path / "clf" / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:40])
    with pytest.raises(ValueError, match="weights.safetensors"):
        SentimentClassifier.load(tmp_path / "clf")

    hand_made().save(tmp_path / "clf2")
    (tmp_path / "clf2" / "vocabulary.json").write_text(json.dumps(["good", "bad"]))
    with pytest.raises(ValueError, match="inconsistent: vocabulary has 2 entries but weight has 4"):
        SentimentClassifier.load(tmp_path / "clf2")

    hand_made().save(tmp_path / "clf3")
    config = json.loads((tmp_path / "clf3" / "config.json").read_text())
    (tmp_path / "clf3" / "config.json").write_text(json.dumps({**config, "format": "pickle"}))
    with pytest.raises(ValueError, match="format 'pickle'"):
        SentimentClassifier.load(tmp_path / "clf3")

    (tmp_path / "clf3" / "vocabulary.json").unlink()
    with pytest.raises(FileNotFoundError, match="vocabulary.json"):
        SentimentClassifier.load(tmp_path / "clf3")


def synthetic(n: int, seed: int, length: int = 12) -> tuple[list[str], list[int]]:
    rng = random.Random(seed)
    texts, labels = [], []
    for i in range(n):
        label = i % 2
        cues = POSITIVE if label else NEGATIVE
        words = [rng.choice(cues) if rng.random() < 0.25 else rng.choice(NEUTRAL) for _ in range(length)]
        texts.append(" ".join(words))
        labels.append(label)
    return texts, labels


def test_fit_learns_graded_calibrated_scores():
    texts, labels = synthetic(400, seed=0)
    classifier = SentimentClassifier.fit(texts, labels, recipe=ClassifierRecipe(calibration_folds=2))
    test_texts, test_labels = synthetic(200, seed=1)
    accuracy = np.mean(classifier.predict(test_texts) == np.array(test_labels))
    assert accuracy > 0.9
    wonderful, neutral, terrible = classifier.positive_logits(
        ["the film is wonderful", "the film is", "the film is terrible"]
    )
    assert wonderful > neutral + 1 and neutral > terrible + 1
    assert abs(neutral) < 1  # neutral words appear equally in both classes
    assert classifier.metadata["calibration"]["scale"] > 0


def test_fit_rejects_single_class_and_mismatched_inputs():
    with pytest.raises(ValueError, match="labels 0 and 1"):
        SentimentClassifier.fit(["a", "b"], [1, 1])
    with pytest.raises(ValueError, match="2 texts but 1 labels"):
        SentimentClassifier.fit(["a", "b"], [1])
    with pytest.raises(ValueError, match="labels 0 and 1"):
        SentimentClassifier.fit(["a", "b"], [1, 2])


def test_review_windows_drop_only_a_short_tail():
    text = " ".join(str(i) for i in range(23))
    assert review_windows(text, 10) == [" ".join(map(str, range(0, 10))), " ".join(map(str, range(10, 20)))]
    assert review_windows(" ".join(str(i) for i in range(26)), 10)[-1] == " ".join(map(str, range(20, 26)))
    assert review_windows("only three words", 10) == ["only three words"]


def test_train_reward_model_reports_heldout_accuracy_and_saves(tmp_path):
    texts, labels = synthetic(120, seed=2, length=40)
    train = [{"text": t, "label": y, "source": "review"} for t, y in zip(texts[:60], labels[:60], strict=True)]
    train += [{"text": t[:60], "label": y, "source": "snippet"} for t, y in zip(texts[60:], labels[60:], strict=True)]
    held_texts, held_labels = synthetic(40, seed=3, length=40)
    heldout = [{"text": t, "label": y, "source": s} for t, y, s in
               zip(held_texts, held_labels, ["review", "snippet"] * 20, strict=True)]
    metrics = train_reward_model(train, heldout, ClassifierRecipe(window_words=10, calibration_folds=2), tmp_path)
    assert metrics["heldout_review_accuracy"] >= 0.9
    assert metrics["training_examples"] == 60 * 4 + 60  # four 10-word windows per 40-word review
    assert set(metrics["probe_scores"]) and all(np.isfinite(list(metrics["probe_scores"].values())))
    loaded = SentimentClassifier.load(tmp_path)
    assert loaded.metadata["heldout"]["heldout_review_accuracy"] == metrics["heldout_review_accuracy"]
