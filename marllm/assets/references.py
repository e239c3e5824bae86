"""Up-front checks of the models and datasets a config names, ``marllm:`` names included.

A reference is a ``marllm:`` name (:mod:`marllm.assets`) where the config key accepts one, or anything
:mod:`marllm.utils.references` checks: a local path or a Hugging Face hub id.
"""

from __future__ import annotations

from collections.abc import Sequence

from marllm.assets import PREFIX, check_asset_name
from marllm.utils.references import MissingReferenceError, model_load_error
from marllm.utils.references import check_dataset_reference as _check_dataset_path_or_hub_id
from marllm.utils.references import check_model_reference as _check_model_path_or_hub_id

__all__ = [
    "MissingReferenceError",
    "check_dataset_reference",
    "check_model_reference",
    "model_load_error",
]


def check_model_reference(name: str, key: str, asset: str | Sequence[str] | None = None) -> None:
    """Check the model ``name`` given for config key ``key``; ``asset`` is the ``marllm:`` name (or names) that may
    stand there. A ``marllm:`` name is only checked, not prepared: that happens on first use.

    Raises:
        MissingReferenceError: see :func:`marllm.utils.references.check_model_reference`; also a ``marllm:`` name
            that does not fit the key.
    """
    extra = f", or {_asset_names(asset)}" if asset else ""
    if name.startswith(PREFIX):
        valid = "a local model directory (holding config.json), a hub id such as 'gpt2' or 'org/name'" + extra
        _check_asset(name, key, asset, valid)
    else:
        _check_model_path_or_hub_id(name, key, extra)


def check_dataset_reference(name: str, key: str, local: str, asset: str | None = None, directory: bool = False) -> None:
    """Check the dataset ``name`` given for config key ``key``; ``local`` says which local paths the task reads and
    ``asset`` the ``marllm:`` name that may stand there (see :func:`marllm.utils.references.check_dataset_reference`).
    """
    extra = f", or {PREFIX}{asset}" if asset else ""
    if name.startswith(PREFIX):
        _check_asset(name, key, asset, f"{local}, a hub dataset id such as 'imdb' or 'org/name'" + extra)
    else:
        _check_dataset_path_or_hub_id(name, key, local, extra, directory)


def _asset_names(asset: str | Sequence[str]) -> str:
    """``marllm:a`` or ``marllm:a or marllm:b``."""
    return " or ".join(PREFIX + name for name in ((asset,) if isinstance(asset, str) else asset))


def _check_asset(name: str, key: str, asset: str | Sequence[str] | None, valid: str) -> None:
    if asset is None:
        raise MissingReferenceError(f"{key}: no marllm asset fits here, got {name!r}; give {valid}")
    try:
        check_asset_name(name, asset, key)
    except ValueError as error:
        raise MissingReferenceError(str(error)) from error
