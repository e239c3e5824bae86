"""The recipe of the offline assets: every parameter that changes them, hashed into their directory name."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

from marllm.assets.offline.base_model import BaseModelRecipe
from marllm.assets.offline.corpus import CorpusRecipe
from marllm.assets.offline.sentiment_classifier import ClassifierRecipe

__all__ = ["PUBLISHED_SHA256", "RECIPES", "RECIPE_ENV", "RECIPE_VERSION", "OfflineRecipe", "default_recipe"]

#: bumped whenever the code that builds an asset changes what it builds for the same parameters
#: v2: numbers tokenised digit by digit, smaller numbers in the arithmetic problems
#: v3: built on a fixed number of intra-op threads, so the bytes no longer depend on the machine's cores or load;
#:     a 512-token context (blocks of 512, 4 a step: the same tokens per step), which every game's default prompt fits
RECIPE_VERSION = "offline-v3"


@dataclass(frozen=True)
class OfflineRecipe:
    """Corpus split, base-model and reward-model parameters; tests pass a tiny one.

    ``key`` hashes :data:`RECIPE_VERSION` and all parameters, so a changed recipe prepares into a new
    directory instead of reusing assets built differently.
    """

    corpus: CorpusRecipe = field(default_factory=CorpusRecipe)
    base_model: BaseModelRecipe = field(default_factory=BaseModelRecipe)
    classifier: ClassifierRecipe = field(default_factory=ClassifierRecipe)

    def to_dict(self) -> dict[str, Any]:
        """The recipe as nested plain dicts (JSON-safe)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> OfflineRecipe:
        """Build a recipe from (partial) nested dicts, e.g. ``{"base_model": {"max_steps": 10}}``.

        Raises:
            ValueError: an unknown section or parameter (the message lists the valid ones).
        """
        types = {"corpus": CorpusRecipe, "base_model": BaseModelRecipe, "classifier": ClassifierRecipe}
        unknown = set(values) - set(types)
        if unknown:
            raise ValueError(f"unknown offline recipe section(s) {sorted(unknown)}; valid: {sorted(types)}")
        parts = {}
        for name, section in values.items():
            kind = types[name]
            valid = {f.name for f in dataclasses.fields(kind)}
            bad = set(section) - valid
            if bad:
                raise ValueError(f"unknown {name} recipe parameter(s) {sorted(bad)}; valid: {sorted(valid)}")
            parts[name] = kind(**section)
        return cls(**parts)

    @property
    def key(self) -> str:
        """12 hex digits of sha256 over the version and every parameter."""
        payload = json.dumps({"version": RECIPE_VERSION, "recipe": self.to_dict()}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]

    @property
    def directory_name(self) -> str:
        """Name of the asset directory under the marllm home: ``<version>-<key>``."""
        return f"{RECIPE_VERSION}-{self.key}"


RECIPE_ENV = "MARLLM_OFFLINE_RECIPE"
"""The environment variable that names the recipe ``marllm:offline-*`` and ``marllm prepare`` use (:data:`RECIPES`)."""

RECIPES: dict[str, OfflineRecipe] = {
    # The main job's: a 4-layer GPT-2 pretrained for 2,000 steps (about 15 minutes on a 2-core CPU).
    "full": OfflineRecipe(),
    # Seconds to prepare, for test suites and smoke runs: the same corpus, tokenizer and reward model, a 2-layer
    # GPT-2 pretrained for 60 steps (it strings review words together; it does not write reviews).
    "small": OfflineRecipe(
        base_model=BaseModelRecipe(
            n_layer=2, n_embd=64, n_head=2, max_steps=60, warmup_steps=6, eval_max_tokens=4096, sample_new_tokens=8
        )
    ),
}
"""The named recipes: ``full`` (the default) and ``small``. Each prepares into its own directory (its key)."""


PUBLISHED_SHA256: dict[str, dict[str, str]] = {
    # recipe key -> the sha256 of its trained files as prepared on the project's machines (x86-64, 2 cores), with
    # which every figure on the embedded base was measured. Another CPU instruction set may round otherwise.
    "1671de9a7d6f": {  # full
        "base_model/model.safetensors": "9fcda8bac103770813c50882ca3694783e8323516ae8cbf345b51095e0940cf6",
        "reward_model/weights.safetensors": "8144e33cd83054565d0126d921114ebc867f474318508e1dbc93e86b62eed176",
    },
    "060605bd48d1": {  # small
        "base_model/model.safetensors": "800b0434d8c10ce6693b7bfca37a3e67f3fee7dec04730eca899142c316a1a3b",
        "reward_model/weights.safetensors": "8144e33cd83054565d0126d921114ebc867f474318508e1dbc93e86b62eed176",
    },
}
"""The published bytes of the named recipes' trained files: a preparation compares its own with them
(``reproduces_published`` in the manifest) and says so where they differ."""


def default_recipe() -> OfflineRecipe:
    """The recipe :data:`RECIPE_ENV` names (``full`` when it is unset or empty).

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    return RECIPES[default_recipe_name()]


def default_recipe_name() -> str:
    """The name of the recipe :data:`RECIPE_ENV` names (``full`` when it is unset or empty).

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    name = os.environ.get(RECIPE_ENV, "").strip() or "full"
    if name not in RECIPES:
        raise ValueError(f"${RECIPE_ENV}={name!r} names no offline recipe; known: {sorted(RECIPES)}")
    return name
