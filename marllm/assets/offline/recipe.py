"""The recipe of the offline assets: every parameter that changes them, hashed into their directory name."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from marllm.assets.offline.base_model import BaseModelRecipe
from marllm.assets.offline.corpus import CorpusRecipe
from marllm.assets.offline.sentiment_classifier import ClassifierRecipe

__all__ = ["RECIPE_VERSION", "OfflineRecipe"]

#: bumped whenever the code that builds an asset changes what it builds for the same parameters
#: v2: numbers tokenised digit by digit, smaller numbers in the arithmetic problems
RECIPE_VERSION = "offline-v2"


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
