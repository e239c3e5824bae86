"""Helpers for the ``state_dict`` / ``load_state_dict`` of the objects a checkpoint holds.

A stateful object (a learner, an env part) builds its state with these and checks a saved one against itself:
tensors of the expected names, shapes and dtypes, an optimiser's state keyed by parameter name rather than number,
and a numpy generator set back to a saved state; safetensors files written synced and read back. A state that
does not fit raises :class:`CheckpointError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from marllm.utils.errors import CheckpointError


def write_tensors(path: Path, tensors: Mapping[str, torch.Tensor]) -> None:
    """Write ``tensors`` to a safetensors file and sync it to disk."""
    save_file({name: t.detach().cpu().contiguous() for name, t in tensors.items()}, str(path))
    with path.open("rb") as handle:
        os.fsync(handle.fileno())


def read_tensors(file: Path) -> dict[str, torch.Tensor]:
    """Read a safetensors file of a checkpoint onto the CPU; an unreadable file is a :class:`CheckpointError`."""
    try:
        return load_file(str(file), device="cpu")
    except (OSError, SafetensorError) as error:
        raise CheckpointError(f"checkpoint {file.parent}: {file.name} cannot be read: {error}") from error


def check_tensors(expected: Mapping[str, torch.Tensor], found: Mapping[str, torch.Tensor], what: str) -> None:
    """Raise CheckpointError unless ``found`` has exactly ``expected``'s names, shapes and dtypes."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    problems = []
    if missing:
        problems.append(f"missing {_few(missing)}")
    if unexpected:
        problems.append(f"unexpected {_few(unexpected)}")
    for name in sorted(set(expected) & set(found)):
        want, got = expected[name], found[name]
        if want.shape != got.shape:
            problems.append(f"{name} has shape {tuple(got.shape)} in the checkpoint, {tuple(want.shape)} here")
        elif want.dtype != got.dtype:
            problems.append(f"{name} is {got.dtype} in the checkpoint, {want.dtype} here")
    if problems:
        raise CheckpointError(f"the {what} does not fit: " + "; ".join(problems[:5]))


def optimizer_state(
    optimizer: torch.optim.Optimizer, names: list[list[str]]
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``optimizer.state_dict()`` with its parameters named rather than numbered.

    ``names`` gives one name per parameter of each of ``optimizer.param_groups``. Returns the per-parameter state
    tensors as ``optimizer/<name>/<key>`` (Adam: ``exp_avg``, ``exp_avg_sq``, ``step``) and, as JSON-able meta, the
    parameter groups (hyperparameters, and the names in place of the numbers), any non-tensor state and, under
    ``"extra"``, the state dict's own keys besides ``state`` and ``param_groups`` (JSON-able: a stochastically
    rounding optimiser's generator, :mod:`marllm.algorithms.stochastic_rounding`), where it has any.
    """
    state = optimizer.state_dict()
    flat = [name for group in names for name in group]
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, values in state["state"].items():
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer/{flat[index]}/{key}"] = value
            else:
                scalars.setdefault(flat[index], {})[key] = value
    groups = [
        {**{key: value for key, value in group.items() if key != "params"}, "params": group_names}
        for group, group_names in zip(state["param_groups"], names, strict=True)
    ]
    extra = {key: value for key, value in state.items() if key not in ("state", "param_groups")}
    return tensors, {"param_groups": groups, "scalars": scalars} | ({"extra": extra} if extra else {})


def optimizer_state_dict(
    optimizer: torch.optim.Optimizer,
    names: list[list[str]],
    tensors: Mapping[str, torch.Tensor],
    meta: Mapping[str, Any],
) -> dict[str, Any]:
    """The ``optimizer.load_state_dict`` argument for what :func:`optimizer_state` returned, checked to fit."""
    saved = [group["params"] for group in meta["param_groups"]]
    if saved != names:
        flat_saved = [name for group in saved for name in group]
        flat_here = [name for group in names for name in group]
        missing = [name for name in flat_here if name not in flat_saved]
        unexpected = [name for name in flat_saved if name not in flat_here]
        detail = f"missing {_few(missing)}; unexpected {_few(unexpected)}" if missing or unexpected else "regrouped"
        raise CheckpointError(f"the optimiser's parameters do not fit: {detail}")
    flat = [name for group in names for name in group]
    index = {name: i for i, name in enumerate(flat)}
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    state: dict[int, dict[str, Any]] = {}
    for key, tensor in tensors.items():
        name, _, field = key.removeprefix("optimizer/").rpartition("/")
        if name not in index:
            raise CheckpointError(f"the optimiser state has an entry {key} for no parameter of this learner")
        shape = tuple(parameters[index[name]].shape)
        if tensor.dim() > 0 and tuple(tensor.shape) != shape:
            raise CheckpointError(f"optimiser state {key} has shape {tuple(tensor.shape)}, its parameter {shape}")
        state.setdefault(index[name], {})[field] = tensor
    for name, values in meta["scalars"].items():
        state.setdefault(index[name], {}).update(values)
    groups = []
    for saved_group, group in zip(meta["param_groups"], optimizer.param_groups, strict=True):
        # JSON made the tuples (Adam's betas) lists; give them back the type the optimiser uses.
        restored = {
            key: tuple(value) if isinstance(group.get(key), tuple) else value
            for key, value in saved_group.items()
            if key != "params"
        }
        groups.append({**restored, "params": [index[name] for name in saved_group["params"]]})
    return {"state": state, "param_groups": groups, **meta.get("extra", {})}


def _few(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return f"{shown} (and {len(names) - limit} more)" if len(names) > limit else shown
