"""Where and how a run's models are loaded: :class:`ModelPlacement`, which loads each learner's policy, the frozen
references and LoRA bases on their devices, and shards them over data-parallel ranks where asked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from marllm.models.lora import LoraSettings, attach_adapters
from marllm.models.policy import ReferencePool, load_causal_lm, resolve_dtype
from marllm.parallel.distributed import DataParallel
from marllm.parallel.sharding import is_sharded, shard_module


@dataclass(frozen=True)
class ModelPlacement:
    """Where and how the learners' models are loaded; checked when made.

    Attributes:
        dtype: the dtype the models are loaded in (``float32``, ``bfloat16`` or ``float16``).
        reference_dtype: the dtype the frozen references are loaded in (None: ``dtype``); with ``lora`` (whose
            reference is the base) None or ``dtype`` only.
        device: where models go (``auto``: CUDA if available) unless ``devices`` or ``reference_device`` say otherwise.
        devices: learner id -> device, for the learners placed elsewhere than ``device`` (the learners of one LoRA
            base go on the first one's device).
        reference_device: where the shared frozen references go (None: ``device``).
        lora: make the learners of each base LoRA adapters on that one base (the reference is the base with adapters
            disabled); None gives each learner a full copy of its base and the learners of one base one shared
            reference.
        load_in_4bit: load a LoRA base in 4 bits (needs CUDA and bitsandbytes).
        trust_remote_code: let transformers run the Python code a hub model ships with (only for code you trust).
        fsdp: shard each policy and reference over the ranks of ``data_parallel`` (:mod:`marllm.parallel.sharding`):
            each is loaded on the CPU and its shards go to the rank's device. Full models only.
        fsdp_compute_dtype: the dtype the sharded models compute in (e.g. ``bfloat16``; None: ``dtype``).
        fsdp_gather_for_generation: whether sharded models are gathered whole for each ``generate`` call (else layer
            by layer at every token).
        data_parallel: this process's rank of a data-parallel run, handed to every learner (and what ``fsdp``
            shards over).
    """

    dtype: str = "float32"
    reference_dtype: str | None = None
    device: str = "auto"
    devices: Mapping[str, str] = field(default_factory=dict)
    reference_device: str | None = None
    lora: LoraSettings | None = None
    load_in_4bit: bool = False
    trust_remote_code: bool = False
    fsdp: bool = False
    fsdp_compute_dtype: str | None = None
    fsdp_gather_for_generation: bool = True
    data_parallel: DataParallel | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", dict(self.devices or {}))
        if self.reference_dtype is not None:
            resolve_dtype(self.reference_dtype)  # a known dtype name
            if self.lora is not None and self.reference_dtype != self.dtype:
                raise ValueError(
                    f"ModelPlacement: with lora the reference is the base ({self.dtype}) with adapters disabled; "
                    f"reference_dtype {self.reference_dtype} must be None or {self.dtype}"
                )
        if self.fsdp_compute_dtype is not None:
            resolve_dtype(self.fsdp_compute_dtype)  # a known dtype name
            if not self.fsdp:
                raise ValueError("ModelPlacement: fsdp_compute_dtype is the compute dtype of sharded models: fsdp=True")
        spread = any(device != self.device for device in self.devices.values())
        if self.fsdp and (self.data_parallel is None or self.lora is not None or spread):
            raise ValueError(
                "ModelPlacement: fsdp shards full models (no lora) over the ranks of data_parallel, each on its rank's "
                "device (no devices per learner)"
            )

    def device_of(self, learner_id: str) -> str:
        """The device of ``learner_id``'s model: its own in ``devices``, else ``device``."""
        return self.devices.get(learner_id, self.device)

    def load_policy(self, path: str, learner_id: str) -> Any:
        """A full trainable copy of the base at ``path`` for ``learner_id``, on its device (sharded with ``fsdp``)."""
        on = "cpu" if self.fsdp else self.device_of(learner_id)
        policy = load_causal_lm(path, self.dtype, on, trust_remote_code=self.trust_remote_code)
        if self.fsdp:
            self._shard(policy)
        return policy

    def load_reference(self, path: str, references: ReferencePool) -> Any:
        """The frozen reference of the base at ``path``, from ``references`` (sharded with ``fsdp``)."""
        on = "cpu" if self.fsdp else self.reference_device or self.device
        dtype = self.reference_dtype or self.dtype
        reference = references.get(path, dtype, on, trust_remote_code=self.trust_remote_code)
        if self.fsdp and not is_sharded(reference):  # a pool's reference may be sharded already
            self._shard(reference)
        return reference

    def load_lora_base(self, path: str, learner_ids: list[str]) -> Any:
        """The base at ``path`` with one LoRA adapter per learner id, on the first learner's device."""
        on = self.device_of(learner_ids[0])
        shared = load_causal_lm(
            path, self.dtype, on, load_in_4bit=self.load_in_4bit, trust_remote_code=self.trust_remote_code
        )
        return attach_adapters(shared, learner_ids, self.lora)

    def _shard(self, module: torch.nn.Module) -> None:
        compute = resolve_dtype(self.fsdp_compute_dtype) if self.fsdp_compute_dtype is not None else None
        shard_module(module, self.data_parallel, compute, self.fsdp_gather_for_generation)
