"""LoRA learners on one shared base: N adapters, and the base with adapters disabled as the reference."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel

from marllm.models.lora_settings import LoraSettings

if TYPE_CHECKING:  # peft is imported where adapters are made: a run without LoRA never loads it
    from peft import PeftModel


def adaptable_module_names(model: torch.nn.Module) -> list[str]:
    """Leaf names of the linear-like modules LoRA can adapt (what ``target_modules`` may name)."""
    names = set()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear | torch.nn.Embedding) or type(module).__name__ == "Conv1D":
            names.add(name.rsplit(".", 1)[-1])
    return sorted(names)


def attach_adapters(base: PreTrainedModel, adapter_names: list[str], settings: LoraSettings) -> PeftModel:
    """One LoRA adapter per name on ``base``; the base weights are frozen and shared."""
    from peft import LoraConfig, get_peft_model  # where adapters are made (see TYPE_CHECKING above)

    if settings.target_modules is not None:
        available = adaptable_module_names(base)
        missing = [m for m in settings.target_modules if m not in available]
        if missing:
            raise ValueError(
                f"model.lora.target_modules {missing} are not modules of {type(base).__name__}; adaptable modules: "
                f"{available}"
            )
    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=settings.target_modules,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, config, adapter_name=adapter_names[0])
    for name in adapter_names[1:]:
        model.add_adapter(name, config)
    return model


def adapter_parameters(model: PeftModel, adapter: str) -> list[torch.nn.Parameter]:
    """The parameters that belong to one adapter.

    Matched on the dotted parts of the name: peft names linear adapters ``….lora_A.<adapter>.weight`` but embedding
    adapters ``….lora_embedding_A.<adapter>``, with no trailing part.
    """
    params = [p for name, p in model.named_parameters() if adapter in name.split(".")]
    if not params:
        raise ValueError(f"the model has no adapter {adapter!r}; adapters: {sorted(model.peft_config)}")
    return params


def check_4bit_available() -> None:
    """4-bit loading needs CUDA and bitsandbytes."""
    missing = []
    if not torch.cuda.is_available():
        missing.append("a CUDA GPU")
    if importlib.util.find_spec("bitsandbytes") is None:
        missing.append("the bitsandbytes package (pip install bitsandbytes)")
    if missing:
        raise RuntimeError(f"model.load_in_4bit needs {' and '.join(missing)}; set model.load_in_4bit=false")


def load_adapter_checkpoint(base: PreTrainedModel, directory: str | Path) -> PeftModel:
    """A saved learner adapter (``checkpoints/<learner>/policy``) on its base, for deployment or evaluation."""
    directory = Path(directory)
    candidates = [directory] + [d for d in directory.iterdir() if d.is_dir()] if directory.is_dir() else []
    for candidate in candidates:
        if (candidate / "adapter_config.json").is_file():
            from peft import PeftModel  # where adapters are loaded (see TYPE_CHECKING above)

            return PeftModel.from_pretrained(base, candidate)
    raise FileNotFoundError(f"no adapter_config.json in {str(directory)!r} or its sub-directories")
