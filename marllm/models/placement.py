"""Where and how a run's models are loaded: :class:`ModelPlacement`, which loads each learner's policy, the frozen
references and LoRA bases on their devices, each prepared by the run's placement across processes
(:mod:`marllm.parallel.placement`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from marllm.models.lora import LoraSettings, attach_adapters
from marllm.models.policy import ReferencePool, load_causal_lm, resolve_dtype
from marllm.parallel.placement import Placement


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
        processes: where the models live across processes (:mod:`marllm.parallel.placement`), handed to every
            learner: each policy and reference is loaded where it says and prepared by it (split over the ranks by
            :class:`~marllm.parallel.placement.Sharded`, full models only, on each rank's device).
    """

    dtype: str = "float32"
    reference_dtype: str | None = None
    device: str = "auto"
    devices: Mapping[str, str] = field(default_factory=dict)
    reference_device: str | None = None
    lora: LoraSettings | None = None
    load_in_4bit: bool = False
    trust_remote_code: bool = False
    processes: Placement = field(default_factory=Placement)

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", dict(self.devices or {}))
        if self.reference_dtype is not None:
            resolve_dtype(self.reference_dtype)  # a known dtype name
            if self.lora is not None and self.reference_dtype != self.dtype:
                raise ValueError(
                    f"ModelPlacement: with lora the reference is the base ({self.dtype}) with adapters disabled; "
                    f"reference_dtype {self.reference_dtype} must be None or {self.dtype}"
                )
        spread = any(device != self.device for device in self.devices.values())
        if not self.processes.whole_models and (self.lora is not None or spread):
            raise ValueError(
                "ModelPlacement: fsdp shards full models (no lora) over the ranks, each on its rank's device (no "
                "devices per learner)"
            )

    def device_of(self, learner_id: str) -> str:
        """The device of ``learner_id``'s model: its own in ``devices``, else ``device``."""
        return self.devices.get(learner_id, self.device)

    def load_policy(self, path: str, learner_id: str) -> Any:
        """A full trainable copy of the base at ``path`` for ``learner_id``, on its device, prepared by
        ``processes``."""
        on = self.processes.load_device(self.device_of(learner_id))
        policy = load_causal_lm(path, self.dtype, on, trust_remote_code=self.trust_remote_code)
        return self.processes.prepare(policy)

    def load_reference(self, path: str, references: ReferencePool) -> Any:
        """The frozen reference of the base at ``path``, from ``references``, prepared by ``processes`` (a pool's
        reference may be prepared already)."""
        on = self.processes.load_device(self.reference_device or self.device)
        dtype = self.reference_dtype or self.dtype
        reference = references.get(path, dtype, on, trust_remote_code=self.trust_remote_code)
        return self.processes.prepare(reference)

    def load_lora_base(self, path: str, learner_ids: list[str]) -> Any:
        """The base at ``path`` with one LoRA adapter per learner id, on the first learner's device."""
        on = self.device_of(learner_ids[0])
        shared = load_causal_lm(
            path, self.dtype, on, load_in_4bit=self.load_in_4bit, trust_remote_code=self.trust_remote_code
        )
        return attach_adapters(shared, learner_ids, self.lora)
