"""The checks a learner's constructor makes on what it is given, before it builds anything."""

from __future__ import annotations

from typing import Any

import torch

from marllm.algorithms.kl_controller import KLController
from marllm.models.legal_moves import check_constrained


def check_learner_arguments(
    name: str,
    *,
    reference: Any,
    adapter: str | None,
    kl_controller: Any,
    sharded: bool,
    data_parallel: Any,
) -> None:
    """Refuse a learner without a reference (nor an adapter whose base serves as one), a KL controller without
    ``value`` and ``update``, and a sharded model outside a data-parallel run or with an adapter.

    Raises:
        ValueError / TypeError: naming the learner and what is wrong.
    """
    if reference is None and adapter is None:
        raise ValueError(f"learner {name!r} needs a reference model (or a LoRA adapter on a shared base)")
    if kl_controller is not None and not isinstance(kl_controller, KLController):
        raise TypeError(
            f"learner {name!r}: kl_controller must have a value and an update(kl, n_steps) method, got "
            f"{type(kl_controller).__name__}"
        )
    if sharded and (data_parallel is None or adapter is not None):
        raise ValueError(
            f"learner {name!r}: a sharded (FSDP) model trains data-parallel as a full model: give data_parallel, "
            "and no adapter"
        )


def check_actions(learner: Any, name: str, actions: str, tokenizer: Any, generation: Any) -> None:
    """Refuse ``actions`` that the learner's class does not play (its ``supported_actions``), and constrained
    answers without an EOS to end them."""
    supported = type(learner).supported_actions
    if actions not in supported:
        raise ValueError(f"learner {name!r}: {type(learner).__name__} plays actions {list(supported)}, not {actions!r}")
    if actions == "constrained":
        check_constrained(tokenizer, generation, f"learner {name!r}")


def check_full_precision(name: str, trainable: list[torch.nn.Parameter], adapter: str | None) -> None:
    """Refuse to train half-precision parameters directly.

    Adam on half-precision weights: at PPO's learning rates most updates are below half a unit in the last place of
    the weight and round away, silently. There are no float32 master weights here.

    Raises:
        ValueError: naming the dtype and the setting that caused it.
    """
    half = sorted({str(p.dtype).removeprefix("torch.") for p in trainable if p.dtype.itemsize < 4})
    if half:
        cause = (
            f"model.dtype {half[0]} with model.lora: null"
            if adapter is None
            else f"adapter {adapter!r} was made without peft's autocast_adapter_dtype"
        )
        raise ValueError(
            f"learner {name!r} would train {'/'.join(half)} parameters directly ({cause}), where most small "
            "optimiser updates round away; use model.dtype: float32, or model.lora, whose adapters peft keeps "
            "in float32 on a half-precision base"
        )
