"""Checks of the models and datasets named by path or hub id, so that a bad reference fails before anything loads.

A reference is one of (``marllm:`` names are resolved to paths by :mod:`marllm.assets.references` first):

* a local path: absolute, starting with ``~``, ``./`` or ``../``, a name with a data-file suffix (``.jsonl`` …),
  or any name that exists on disk;
* otherwise a Hugging Face hub id, ``name`` or ``org/name``. While the hub is offline (``HF_HUB_OFFLINE=1``) a hub
  id must already be in the local cache; online, it is left to the hub to answer.
"""

from __future__ import annotations

import os
from pathlib import Path

from huggingface_hub import constants, snapshot_download, try_to_load_from_cache
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from marllm.utils.data_formats import DATA_SUFFIXES
from marllm.utils.errors import ConfigError

__all__ = [
    "DATA_SUFFIXES",
    "MissingReferenceError",
    "check_dataset_reference",
    "check_model_reference",
    "hub_offline",
    "looks_like_path",
    "model_load_error",
]

MODEL_FILE = "config.json"


class MissingReferenceError(ConfigError):
    """A model or dataset the config names is not on disk (or not the file or directory it must be), not a hub id,
    or (hub offline) not in the local cache."""


def looks_like_path(name: str) -> bool:
    """Whether ``name`` means a local path rather than a hub id (see the module docs)."""
    return (
        os.path.isabs(name)
        or name.startswith(("~", "./", "../", f".{os.sep}", f"..{os.sep}"))
        or name in (".", "..")
        or Path(name).exists()
    )


def hub_offline() -> bool:
    """Whether the Hugging Face hub is switched off (``HF_HUB_OFFLINE=1``)."""
    return bool(constants.HF_HUB_OFFLINE)


def check_model_reference(name: str, key: str, valid: str = "") -> None:
    """Check the model ``name`` given for config key ``key``; ``valid`` adds what else the key accepts.

    Raises:
        MissingReferenceError: a path that is missing, a file, or a directory without ``config.json``; a name that
            is neither a path nor a hub id; a hub id missing from the cache while the hub is offline.
    """
    valid = "a local model directory (holding config.json), a hub id such as 'gpt2' or 'org/name'" + valid
    if looks_like_path(name):
        _check_model_directory(name, key, valid)
    else:
        _check_hub_id(name, key, valid)
        if hub_offline() and not _model_in_cache(name):
            raise MissingReferenceError(_offline_message(name, key, valid, ""))


def check_dataset_reference(name: str, key: str, local: str, valid: str = "", directory: bool = False) -> None:
    """Check the dataset ``name`` given for config key ``key``; ``local`` says which local paths the task reads,
    ``valid`` adds what else the key accepts.

    A local path must be a file, or, where ``directory`` is true (the task reads a file inside), a directory; the
    task's loader checks a local file's contents.

    Raises:
        MissingReferenceError: as :func:`check_model_reference`, for a dataset; also a local path that is a
            directory (unless ``directory``) or not a regular file.
    """
    valid = f"{local}, a hub dataset id such as 'imdb' or 'org/name'" + valid
    path = Path(name).expanduser()
    if looks_like_path(name) or path.suffix in DATA_SUFFIXES:
        if not path.exists():
            raise MissingReferenceError(f"{key}: {name!r} does not exist ({path.resolve()}); give {valid}")
        if not (path.is_file() or (directory and path.is_dir())):
            what = "is a directory, not a data file" if path.is_dir() else "is not a regular file"
            raise MissingReferenceError(f"{key}: {name!r} {what}; give {valid}")
    else:
        _check_hub_id(name, key, valid)
        if _datasets_offline() and not _dataset_in_cache(name):
            raise MissingReferenceError(_offline_message(name, key, valid, " --repo-type dataset"))


def model_load_error(name: str, what: str, error: Exception, key: str = "model.name_or_path") -> Exception:
    """What to raise when transformers cannot load the ``what`` (weights, tokenizer) of ``name``.

    A wrong reference gives :class:`MissingReferenceError` naming the config key ``key`` (see
    :func:`check_model_reference`); anything else an ``OSError`` naming the model and the loader's first line.
    """
    try:
        check_model_reference(name, key)
    except MissingReferenceError as problem:
        return problem
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    return OSError(f"could not load the {what} of model {name!r}: {first}")


def _check_model_directory(name: str, key: str, valid: str) -> None:
    path = Path(name).expanduser()
    if not path.exists():
        raise MissingReferenceError(f"{key}: {name!r} does not exist ({path.resolve()}); give {valid}")
    if not path.is_dir():
        raise MissingReferenceError(f"{key}: {name!r} is a file, not a model directory; give {valid}")
    if not (path / MODEL_FILE).is_file():
        raise MissingReferenceError(f"{key}: directory {name!r} has no {MODEL_FILE}: not a saved model; give {valid}")


def _check_hub_id(name: str, key: str, valid: str) -> None:
    try:
        validate_repo_id(name)
    except HFValidationError as error:
        raise MissingReferenceError(
            f"{key}: {name!r} is neither an existing local path nor a hub id ('name' or 'org/name'); give {valid}"
        ) from error


def _offline_message(name: str, key: str, valid: str, download_option: str) -> str:
    return (
        f"{key}: {name!r} is not a local path, and the Hugging Face hub is offline (HF_HUB_OFFLINE=1) while "
        f"{name!r} is not in the local cache ({constants.HF_HUB_CACHE}); download it once online "
        f"(`hf download {name}{download_option}`) or give {valid}"
    )


def _datasets_offline() -> bool:
    """``HF_HUB_OFFLINE``, or the older ``HF_DATASETS_OFFLINE`` that ``datasets`` also honours."""
    from datasets import config  # 1.2 s to import; the config's reference checks come here

    return hub_offline() or bool(config.HF_HUB_OFFLINE)


def _model_in_cache(repo_id: str) -> bool:
    return isinstance(try_to_load_from_cache(repo_id, MODEL_FILE), str)


def _dataset_in_cache(repo_id: str) -> bool:
    """A snapshot in the hub cache, or a dataset ``datasets`` prepared before (what it falls back to offline)."""
    try:
        snapshot_download(repo_id, repo_type="dataset", local_files_only=True)
        return True
    except (OSError, ValueError):  # LocalEntryNotFoundError is an OSError
        pass
    from datasets import config  # 1.2 s to import; the config's reference checks come here
    from datasets.naming import camelcase_to_snakecase

    parts = repo_id.split("/")
    parts[-1] = camelcase_to_snakecase(parts[-1])
    prepared = Path(config.HF_DATASETS_CACHE) / "___".join(parts)
    return any(path.is_dir() for path in prepared.glob("*/*/*"))
