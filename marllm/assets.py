"""``marllm:`` names: the embedded offline assets, prepared on first use.

``marllm:offline-base`` (the small pretrained GPT-2), ``marllm:offline-sentiment`` (the sentiment classifier) and
``marllm:offline-reviews`` (the review corpus, splits ``train`` and ``heldout``) can stand wherever a hub id or path
is accepted in a config.
"""

from __future__ import annotations

from typing import Any

PREFIX = "marllm:"
NAMES = ("offline-base", "offline-sentiment", "offline-reviews")


KINDS = {"offline-base": "a causal LM", "offline-sentiment": "a sentiment classifier", "offline-reviews": "a dataset"}


def check_asset_name(name: str, expected: str, key: str) -> None:
    """Raise unless ``name`` is ``marllm:<expected>``, the asset config key ``key`` needs; prepares nothing."""
    asset = name[len(PREFIX) :]
    if asset not in NAMES:
        raise ValueError(f"{key}: unknown marllm asset {name!r}; known: {[PREFIX + n for n in NAMES]}")
    if asset != expected:
        raise ValueError(f"{key}: {name!r} is {KINDS[asset]}, not {KINDS[expected]}; use {PREFIX}{expected}")


def offline_assets(name: str) -> Any | None:
    """The prepared offline assets if ``name`` is a ``marllm:`` name, else None."""
    if not name.startswith(PREFIX):
        return None
    if name[len(PREFIX) :] not in NAMES:
        raise ValueError(f"unknown marllm asset {name!r}; known: {[PREFIX + n for n in NAMES]}")
    from marllm.offline import ensure_assets

    return ensure_assets()


def resolve_model(name: str) -> str:
    """A hub id or path for ``from_pretrained``."""
    assets = offline_assets(name)
    if assets is None:
        return name
    if name != PREFIX + "offline-base":
        raise ValueError(f"{name!r} is not a causal LM; use {PREFIX}offline-base")
    return str(assets.base_model_dir)


def resolve_dataset(name: str, split: str) -> str:
    """A hub id or local file for the dataset ``name`` and ``split``."""
    assets = offline_assets(name)
    if assets is None:
        return name
    if name != PREFIX + "offline-reviews":
        raise ValueError(f"{name!r} is not a dataset; use {PREFIX}offline-reviews")
    files = {"train": assets.train_file, "heldout": assets.heldout_file}
    if split not in files:
        raise ValueError(f"{name} has splits {sorted(files)}, not {split!r}")
    return str(files[split])
