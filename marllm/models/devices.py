"""Device and dtype names: checked without torch (the config checks them), resolved to torch objects on use."""

from __future__ import annotations

import contextlib
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch  # on use only: the config checks device names without torch

DEVICE_TYPES = ("cpu", "cuda", "mps")
DTYPE_NAMES = ("bfloat16", "float16", "float32")
_DEVICE_NAME = re.compile(r"(cpu|cuda|mps)(:\d+)?")


def check_device_name(device: str) -> None:
    """``device`` must be ``auto`` or name a device type marllm runs on (``cpu``, ``cuda``, ``cuda:N``, ``mps``);
    whether this machine has it is :func:`resolve_device`'s question, so that a GPU config loads anywhere.

    Raises:
        ValueError: ``device`` is not such a name.
    """
    if device == "auto":
        return
    if not isinstance(device, str) or not _DEVICE_NAME.fullmatch(device):
        raise ValueError(f"{device!r} is not a device name; give auto, cpu, cuda, cuda:N or mps")


def resolve_device(device: str) -> torch.device:
    """``"auto"`` is CUDA when available, else CPU; ``cpu``, ``cuda``, ``cuda:N`` or ``mps`` must exist here.

    Raises:
        ValueError: ``device`` is not a device name, or names one this machine lacks; the message lists the
            devices it has.
    """
    import torch  # here: the config checks names with this module and must not load torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"{device!r} is not a device name; available here: {_available_devices()}") from error
    if resolved.type == "cpu":
        return resolved
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(
                f"{device!r} needs a CUDA GPU, but torch {torch.__version__} finds none on this machine; "
                f"available here: {_available_devices()}"
            )
        if resolved.index is not None and resolved.index >= count:
            raise ValueError(f"{device!r}: this machine has {count} CUDA device(s); available: {_available_devices()}")
        return resolved
    if resolved.type == "mps" and torch.backends.mps.is_available():
        return resolved
    raise ValueError(f"device {device!r} is not available on this machine; available here: {_available_devices()}")


def _available_devices() -> list[str]:
    """The device names :func:`resolve_device` accepts on this machine."""
    import torch  # on use only: the config checks device names without torch

    names = ["auto", "cpu"]
    if torch.cuda.is_available():
        names += ["cuda", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]
    if torch.backends.mps.is_available():
        names.append("mps")
    return names


def check_dtype_name(dtype: str) -> None:
    """``dtype`` must be one of :data:`DTYPE_NAMES`."""
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"model dtype must be one of {sorted(DTYPE_NAMES)}, got {dtype!r}")


def resolve_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a :data:`DTYPE_NAMES` name."""
    check_dtype_name(dtype)
    import torch  # on use only: the config checks device names without torch

    return getattr(torch, dtype)


def autocast_for(model: torch.nn.Module, dtype: str | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` on ``model``'s device in ``dtype`` (a :data:`DTYPE_NAMES` name), or a context that changes
    nothing for None: matrix products in ``dtype``, the weights (and so gradients and optimiser state) as they are."""
    if dtype is None:
        return contextlib.nullcontext()
    import torch  # on use only: the config checks device names without torch

    device_type = next(model.parameters()).device.type
    return torch.autocast(device_type=device_type, dtype=resolve_dtype(dtype))
