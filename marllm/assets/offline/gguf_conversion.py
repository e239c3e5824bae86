"""Converting a GGUF file into an ordinary float32 HF model directory, checked against the GGUF's own logits.

transformers loads the GGUF (the ``gguf`` package reads and dequantises it to float32); its weights move into a plain
model of the same config (transformers refuses to save the GGUF-loaded one: it is flagged as quantized), which is
saved with the tokenizer, its chat template and the generation config, then reloaded and compared on a few tokens.
:mod:`marllm.assets.offline.gguf_model` runs it when it prepares a model.
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

__all__ = ["CONVERSION_VERSION", "LOGIT_TOLERANCE", "convert_gguf"]

#: bumped whenever the conversion changes what it writes for the same GGUF
CONVERSION_VERSION = "g1"
#: largest |logit| difference between the GGUF-loaded model and the saved directory that passes the check
LOGIT_TOLERANCE = 1e-4


def convert_gguf(gguf_file: Path, out: Path) -> dict[str, Any]:
    """Load the GGUF ``gguf_file`` with transformers and save it to ``out`` as an ordinary float32 HF model
    directory (weights, config, generation config, tokenizer with its chat template); return its metrics.

    The saved directory is loaded back and its logits compared with the GGUF-loaded model's on a few tokens.

    Raises:
        ValueError: the saved model does not reproduce the GGUF's logits within :data:`LOGIT_TOLERANCE`; also what
            transformers raises for an architecture or tokenizer it cannot read from a GGUF.
    """

    directory, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    model = _plain_model(loaded)
    # a GGUF tokenizer comes without a length limit; the model's context is the natural one
    tokenizer.model_max_length = model.config.max_position_embeddings
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    probe = torch.arange(min(16, model.config.vocab_size))[None]  # (1, T): any ids do for comparing two models
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        difference = (loaded(probe).logits - reloaded(probe).logits).abs().max().item()
    if not difference <= LOGIT_TOLERANCE:
        raise ValueError(
            f"the model saved from {gguf_file} gives logits up to {difference:.3g} away from the GGUF's "
            f"(tolerance {LOGIT_TOLERANCE}); the conversion is wrong"
        )
    return {"parameters": model.num_parameters(), "architecture": type(model).__name__,
            "vocab_size": model.config.vocab_size, "max_abs_logit_difference": difference,
            "chat_template": tokenizer.chat_template is not None}


def _plain_model(loaded: Any) -> Any:
    """A model of ``loaded``'s class and config, without the GGUF quantization flag, holding its weights."""

    config = copy.deepcopy(loaded.config)
    with contextlib.suppress(AttributeError):
        del config.quantization_config
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = copy.deepcopy(loaded.generation_config)
    return model.eval()
