"""A learner's checkpoints: its training state as tensors and JSON-able meta, and its export to a directory."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from marllm.models.state_dicts import (
    check_tensors,
    optimizer_state,
    optimizer_state_dict,
    write_tensors,
)
from marllm.parallel.placement import Placement
from marllm.parallel.sharding import load_full_state_, local_part
from marllm.utils.errors import CheckpointError
from marllm.utils.files import write_directory_manifest, write_json
from marllm.utils.generators import restore_generator

if TYPE_CHECKING:
    from tianshou.utils.statistics import RunningMeanStd
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from marllm.algorithms.kl_controller import KLController
    from marllm.models.policy import ValueHead

LEARNER_STATE_TENSORS = "learner_state.safetensors"
EXPORT_FORMAT = "marllm-learner-export"
LEARNER_STATE_META = "learner_state.json"


@dataclass(frozen=True, eq=False, kw_only=True)
class LearnerCheckpoint:
    """Saving and restoring one learner's training state, from explicit inputs: :meth:`state_dict`,
    :meth:`load_state_dict`, :meth:`save` and :meth:`load_state`.

    :class:`~marllm.algorithms.ppo.PPOLearner` builds one from its parts for each call (its own methods of these
    names are the public ones); the restoring methods change those parts in place and return the update count.

    Attributes:
        name: the learner's id, for messages.
        model: the trained model (or the peft model that carries ``adapter``).
        tokenizer: its tokenizer (exported with the policy).
        adapter: the LoRA adapter the learner trains; None: the whole model.
        value_head: the value head, or None (critic-free learners).
        optimizer: the optimiser of the policy's trained parameters and the value head.
        kl_controller: the KL coefficient controller (its ``value`` is saved and restored).
        score_statistics: the running score statistics.
        rng: the learner's generator (response lengths, mini-batch shuffles).
        num_updates: the updates the learner has made (saved; restored by the restoring methods' return value).
        pending: the rollouts the learner holds and has not trained on yet; saving refuses while there are any.
        placement: where the models live across processes: it gathers full tensors to save and says whether this
            rank writes.
    """

    name: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    adapter: str | None
    value_head: ValueHead | None
    optimizer: torch.optim.Optimizer
    kl_controller: KLController
    score_statistics: RunningMeanStd
    rng: np.random.Generator
    num_updates: int = 0
    pending: int = 0
    placement: Placement = field(default_factory=Placement)

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Everything that changes as this learner trains, as (tensors, JSON-able meta), for a checkpoint.

        Tensors: ``policy/*`` (every parameter of a full model; for a LoRA learner only its adapter's weights, named
        as peft's ``get_peft_model_state_dict`` names them), ``value_head/*`` and ``optimizer/<parameter>/<key>``
        (Adam's ``exp_avg``, ``exp_avg_sq`` and ``step``). Meta: the optimiser's parameter groups, the KL
        coefficient, the running score statistics, ``num_updates`` and the state of the learner's generator. The
        tensors share memory with the live ones: write them out before training on.

        Raises:
            RuntimeError: the learner holds a rollout it has not trained on yet (save between iterations).
        """
        tensors, meta = self._state_tensors()
        # Full tensors on the CPU where the placement shards them (FSDP): each other rank of its run must then call
        # this or share_state() at the same time, for the learners in the same order.
        return self.placement.full_state(tensors), {"adapter": self.adapter, **meta}

    def share_state(self) -> None:
        """On a rank that does not write, where the placement gathers states to save: take part in the gathers of
        the :meth:`state_dict` that rank 0 takes (for its checkpoint) at the same time, keeping nothing."""
        self.placement.full_state(self._state_tensors()[0], keep=False)

    def _state_tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors, meta = self._training_state()
        tensors.update({f"policy/{name}": tensor for name, tensor in self._policy_tensors().items()})
        return tensors, meta

    def load_state_dict(self, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> int:
        """Restore what :meth:`state_dict` returned into a learner built like the one that saved it; return the
        update count it was saved at.

        Raises:
            CheckpointError: the state does not fit (a full model against a LoRA adapter, parameter names, shapes or
                dtypes, the optimiser's parameters); it is checked before anything changes.
        """
        if meta.get("adapter") != self.adapter:
            raise CheckpointError(
                f"the checkpoint's learner trained {_trained_part(meta.get('adapter'))}, learner {self.name!r} "
                f"trains {_trained_part(self.adapter)}"
            )
        policy = {key.removeprefix("policy/"): t for key, t in tensors.items() if key.startswith("policy/")}
        check_tensors(self._policy_tensors(), policy, "policy")
        rest = {key: t for key, t in tensors.items() if not key.startswith("policy/")}
        optimizer = self._checked_training_state(rest, meta)
        self._set_policy(policy)
        return self._set_training_state(rest, meta, optimizer)

    def save(self, directory: str | Path) -> None:
        """Export the policy and the training state.

        ``policy/`` is in Hugging Face format (``from_pretrained``, ``marllm eval``; the adapter alone for a LoRA
        learner); ``learner_state.safetensors`` and ``learner_state.json`` hold the rest of :meth:`state_dict` (value
        head, optimiser, KL coefficient, score statistics, update count, generator), which :meth:`load_state` reads;
        ``manifest.json`` the sha256 of every file, which loading an export checks.
        """
        directory = Path(directory)
        tensors, meta = self._training_state()
        exported = self.placement.exported_state(self.model, tensors)  # a collective where the placement gathers
        if exported is None:  # a rank that writes nothing
            return
        weights, tensors = exported  # weights: None where the model saves its own
        directory.mkdir(parents=True, exist_ok=True)
        if self.adapter is not None:
            self.model.save_pretrained(directory / "policy", selected_adapters=[self.adapter])
        else:
            self.model.save_pretrained(directory / "policy", state_dict=weights)
        self.tokenizer.save_pretrained(directory / "policy")
        write_tensors(directory / LEARNER_STATE_TENSORS, tensors)
        write_json(directory / LEARNER_STATE_META, meta)
        write_directory_manifest(directory, EXPORT_FORMAT)

    def load_state(self, directory: str | Path) -> int:
        """Restore the training state written by :meth:`save` (the policy loads via ``from_pretrained``); return the
        update count it was saved at.

        Raises:
            CheckpointError: the state is missing, refused, or does not fit this learner.
        """
        directory = Path(directory)
        try:
            tensors = load_file(str(directory / LEARNER_STATE_TENSORS), device="cpu")
            meta = json.loads((directory / LEARNER_STATE_META).read_text())
        except (OSError, SafetensorError, json.JSONDecodeError) as error:
            message = f"learner {self.name!r}: no readable training state in {directory}: {error}"
            raise CheckpointError(message) from error
        optimizer = self._checked_training_state(tensors, meta)
        return self._set_training_state(tensors, meta, optimizer)

    def _training_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """:meth:`state_dict` without the policy weights."""
        if self.pending:
            raise RuntimeError(
                f"learner {self.name!r} holds {self.pending} rollout(s) not trained on yet; save its state "
                "between iterations (after update())"
            )
        head = self.value_head.state_dict() if self.value_head is not None else {}
        tensors = {f"value_head/{name}": tensor for name, tensor in head.items()}
        optimizer_tensors, optimizer_meta = optimizer_state(self.optimizer, self._optimizer_names())
        tensors.update(optimizer_tensors)
        optimizer_meta["tensors"] = sorted(optimizer_tensors)  # what loading checks is all there
        statistics = self.score_statistics
        meta = {
            "optimizer": optimizer_meta,
            "kl_coef": float(self.kl_controller.value),
            "score_statistics": {
                "mean": float(statistics.mean),
                "var": float(statistics.var),
                "count": int(statistics.count),
            },
            "num_updates": self.num_updates,
            "rng": self.rng.bit_generator.state,
        }
        return tensors, meta

    def _checked_training_state(self, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> dict[str, Any]:
        """Check the training state against this learner; return the optimiser's ``load_state_dict`` argument."""
        head = {key.removeprefix("value_head/"): t for key, t in tensors.items() if key.startswith("value_head/")}
        check_tensors(self.value_head.state_dict() if self.value_head is not None else {}, head, "value head")
        unknown = [key for key in tensors if not key.startswith(("value_head/", "optimizer/"))]
        if unknown:
            raise CheckpointError(f"the learner state has entries this learner does not know: {unknown[:5]}")
        optimizer = {key: t for key, t in tensors.items() if key.startswith("optimizer/")}
        self._check_optimizer_entries(optimizer, meta)
        restore_generator(np.random.Generator(type(self.rng.bit_generator)()), meta["rng"], "learner")
        return optimizer_state_dict(self.optimizer, self._optimizer_names(), optimizer, meta["optimizer"])

    def _check_optimizer_entries(self, optimizer: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> None:
        """Refuse a state whose optimiser entries are not all there: those its meta lists (``optimizer.tensors``),
        or, in a state saved before they were listed, any at all after an update."""
        listed = meta.get("optimizer", {}).get("tensors")
        missing = [key for key in listed if key not in optimizer] if listed is not None else []
        if missing:
            raise CheckpointError(
                f"learner {self.name!r}: the learner state lacks {len(missing)} of its {len(listed)} optimiser entries "
                f"({_few(missing)}): the optimiser's moments cannot be restored; load the whole state_dict"
            )
        updates = int(meta.get("num_updates", 0))
        if listed is None and updates and not optimizer:
            raise CheckpointError(
                f"learner {self.name!r}: the learner state has no optimiser state (optimizer/*) though saved after "
                f"{updates} update{'s' * (updates != 1)}: the optimiser's moments cannot be restored; load the whole "
                "state_dict"
            )

    def _set_training_state(
        self, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any], optimizer: dict[str, Any]
    ) -> int:
        """Restore a checked training state in place; return its update count."""
        if self.value_head is not None:
            head = {key.removeprefix("value_head/"): t for key, t in tensors.items() if key.startswith("value_head/")}
            load_full_state_(self.value_head, head)
        self.optimizer.load_state_dict(_laid_out_like_parameters(optimizer, self.optimizer))
        self.kl_controller.value = float(meta["kl_coef"])
        statistics = meta["score_statistics"]
        # np.float64, as RunningMeanStd.update leaves them: the arithmetic that follows is the same either way.
        self.score_statistics.mean = np.float64(statistics["mean"])
        self.score_statistics.var = np.float64(statistics["var"])
        self.score_statistics.count = int(statistics["count"])
        restore_generator(self.rng, meta["rng"], "learner")
        return int(meta["num_updates"])

    def _policy_tensors(self) -> dict[str, torch.Tensor]:
        """The trained weights: the whole model's, or this learner's adapter's alone (under peft's names)."""
        if self.adapter is not None:
            from peft import get_peft_model_state_dict  # only a LoRA learner (which loaded peft) gets here

            return get_peft_model_state_dict(self.model, adapter_name=self.adapter, save_embedding_layers=False)
        return {name: parameter.detach() for name, parameter in self.model.named_parameters()}

    def _set_policy(self, tensors: Mapping[str, torch.Tensor]) -> None:
        if self.adapter is not None:
            from peft import set_peft_model_state_dict  # as get_peft_model_state_dict above

            result = set_peft_model_state_dict(self.model, dict(tensors), adapter_name=self.adapter)
            if result.unexpected_keys:
                raise CheckpointError(f"the adapter weights {result.unexpected_keys[:5]} are not in the model")
            return
        with torch.no_grad():
            for name, parameter in self.model.named_parameters():
                parameter.copy_(local_part(tensors[name], parameter))

    def _optimizer_names(self) -> list[list[str]]:
        """A name for every parameter the optimiser holds, group by group (``policy/…`` or ``value_head/…``)."""
        names = {id(p): f"policy/{name}" for name, p in self.model.named_parameters()}
        if self.value_head is not None:
            names.update({id(p): f"value_head/{name}" for name, p in self.value_head.named_parameters()})
        return [[names[id(p)] for p in group["params"]] for group in self.optimizer.param_groups]


def _laid_out_like_parameters(state: dict[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """An optimiser ``state`` of full tensors with each parameter-shaped one laid out as its parameter: split
    where the parameter is (FSDP), whole otherwise (then unchanged)."""
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    laid_out = {
        index: {
            key: local_part(value, parameters[index]) if isinstance(value, torch.Tensor) and value.dim() else value
            for key, value in values.items()
        }
        for index, values in state["state"].items()
    }
    return {**state, "state": laid_out}


def _few(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return f"{shown} and {len(names) - limit} more" if len(names) > limit else shown


def _trained_part(adapter: str | None) -> str:
    return "the full model" if adapter is None else f"LoRA adapter {adapter!r}"
