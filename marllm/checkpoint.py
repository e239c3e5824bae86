"""Durable training state: one checkpoint holds everything a run needs to go on exactly where it stopped.

A checkpoint is a directory ``RUN_DIR/training_state/iteration-000050/`` (the number counts completed iterations)::

    learner-llm1.safetensors  policy weights (the adapter's only for a LoRA learner), value head, Adam state
    learner-llm2.safetensors
    env.safetensors           the env chain's tensors (the text env's data order)
    rng.safetensors           torch's generator states (CPU, and every CUDA device where CUDA is present)
    state.json                the small state: each learner's and env part's JSON state, numpy's and Python's
                              global generator states
    manifest.json             written last: format version, iteration, the caller's ``extra``, and every other
                              file with its size and sha256

Tensors go to safetensors and everything else to JSON, so a checkpoint holds data and never code: nothing is
unpickled to read one. A save writes into a temporary sibling directory, syncs it to disk and renames it into
place, so a kill at any moment leaves the previous checkpoint or the new one complete, never a torn one.

Each stateful object (:class:`~marllm.algorithms.ppo.PPOLearner`, :class:`~marllm.envs.text_env.SequentialTextEnv`,
:class:`~marllm.wrappers.role_permutation.RolePermutation`) has ``state_dict() -> (tensors, meta)`` and
``load_state_dict(tensors, meta)``; this module only lays those out on disk and walks the env's wrapper chain.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import re
import shutil
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

if TYPE_CHECKING:
    from pettingzoo import AECEnv

    from marllm.algorithms.learner import Learner

CHECKPOINTS_DIR = "training_state"
"""The directory under the run directory that holds the checkpoints."""

FORMAT = "marllm-training-state"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
STATE_FILE = "state.json"
ENV_FILE = "env.safetensors"
RNG_FILE = "rng.safetensors"

_FINAL = re.compile(r"iteration-(\d+)")
_TEMPORARY_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
# A checkpoint moved aside while a new one of the same iteration takes its name; complete, so still a candidate.
_REPLACED = re.compile(r"\.replaced-(iteration-(\d+))-\d+")
_HASH_CHUNK = 1 << 22


class CheckpointError(ValueError):
    """A checkpoint is missing, damaged, or does not fit the objects it is loaded into; the message says which."""


@dataclass
class CheckpointInfo:
    """A complete checkpoint: where it is, how many iterations it had completed, and the caller's ``extra``."""

    path: Path
    iteration: int
    extra: dict[str, Any]


# ----------------------------------------------------------------------------------------------- public API
def save_checkpoint(
    run_dir: Path,
    iteration: int,
    learners: Mapping[str, Learner],
    env: AECEnv,
    keep: int = 2,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write the training state after ``iteration`` completed iterations; return the checkpoint's directory.

    Call it between iterations (no learner may hold a rollout it has not trained on). The ``keep`` newest complete
    checkpoints are kept, older ones are removed once the new one is in place, and so are checkpoints of later
    iterations: they belong to a continuation this run abandoned by going on from an earlier one.

    Args:
        run_dir: the run directory; checkpoints go to ``run_dir / CHECKPOINTS_DIR``.
        iteration: completed iterations (names the directory ``iteration-%06d``).
        learners: the learners by id.
        env: the wrapped env; every object on its ``.env`` chain that has ``state_dict`` is saved.
        keep: how many complete checkpoints to keep, >= 1.
        extra: JSON-able data of the caller's (e.g. the config), returned as :attr:`CheckpointInfo.extra`; JSON
            turns tuples into lists.

    Raises:
        ValueError / TypeError: bad arguments, or ``extra`` is not JSON-able; nothing is written.
        RuntimeError: a learner holds a rollout not yet trained on.
    """
    _check_save_arguments(iteration, learners, keep, extra)
    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    _clean_stale(root)
    final = root / f"iteration-{iteration:06d}"
    temporary = root / f"{_TEMPORARY_PREFIX}{final.name}-{os.getpid()}"
    try:
        temporary.mkdir()
        _write_contents(temporary, iteration, learners, env, extra or {})
        _fsync_directory(temporary)
        _move_into_place(temporary, final)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    _prune(root, iteration, keep)
    return final


def latest_checkpoint(run_dir: Path) -> CheckpointInfo | None:
    """The newest complete checkpoint of ``run_dir`` (None if it has none).

    Reads only manifests and file sizes (the contents are verified by :func:`load_checkpoint`). Temporary
    directories of unfinished saves are ignored; a damaged checkpoint is skipped with a warning that says why.
    """
    root = Path(run_dir) / CHECKPOINTS_DIR
    for _, path in _candidates(root):
        try:
            manifest = _read_manifest(path)
            _check_files(path, manifest, verify_hashes=False)
        except CheckpointError as error:
            warnings.warn(f"skipping a damaged checkpoint: {error}", RuntimeWarning, stacklevel=2)
            continue
        return CheckpointInfo(path, manifest["iteration"], manifest["extra"])
    return None


def load_checkpoint(path: Path, learners: Mapping[str, Learner], env: AECEnv) -> CheckpointInfo:
    """Restore the learners, the env chain and the global random generators from the checkpoint at ``path``.

    ``learners`` and ``env`` must be built as for the run that saved it (same learner ids, model shapes, dataset,
    wrappers). Every file is checked against the manifest's sizes and sha256 before anything is restored.

    Raises:
        CheckpointError: the checkpoint is missing, incomplete or damaged (the message names the files), or a
            state does not fit (a learner id missing, a parameter shape or the dataset size differs, ...). If it
            is raised while restoring, the objects may be partly restored: build fresh ones.
    """
    path = Path(path)
    manifest = _read_manifest(path)
    _check_files(path, manifest, verify_hashes=True)
    state = _read_json(path / STATE_FILE, path)
    files = manifest["files"]
    _check_learner_ids(path, state["learners"], learners)
    parts = _stateful_parts(env)
    _check_env_parts(path, [entry["part"] for entry in state["env"]], [key for key, _ in parts])
    for learner_id, learner in learners.items():
        entry = state["learners"][learner_id]
        if entry["file"] not in files:
            raise CheckpointError(
                f"checkpoint {path}: {entry['file']} of learner {learner_id!r} is not in its manifest"
            )
        with _context(f"checkpoint {path}, learner {learner_id!r}"):
            learner.load_state_dict(_read_tensors(path / entry["file"]), entry["state"])
    env_tensors = _read_tensors(path / ENV_FILE)
    for (key, part), entry in zip(parts, state["env"], strict=True):
        prefix = f"{key}/"
        tensors = {name.removeprefix(prefix): t for name, t in env_tensors.items() if name.startswith(prefix)}
        with _context(f"checkpoint {path}, env part {key}"):
            part.load_state_dict(tensors, entry["state"])
    with _context(f"checkpoint {path}, random generators"):
        _restore_global_rngs(_read_tensors(path / RNG_FILE), state["rng"])
    return CheckpointInfo(path, manifest["iteration"], manifest["extra"])


# ----------------------------------------------------------------------------------------------- helpers for state_dict
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


def restore_generator(generator: np.random.Generator, state: dict[str, Any], what: str) -> None:
    """Set a numpy Generator to a saved ``bit_generator.state``."""
    try:
        generator.bit_generator.state = state
    except (TypeError, ValueError, KeyError) as error:
        raise CheckpointError(f"the {what}'s random generator state does not fit: {error}") from error


def optimizer_state(
    optimizer: torch.optim.Optimizer, names: list[list[str]]
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``optimizer.state_dict()`` with its parameters named rather than numbered.

    ``names`` gives one name per parameter of each of ``optimizer.param_groups``. Returns the per-parameter state
    tensors as ``optimizer/<name>/<key>`` (Adam: ``exp_avg``, ``exp_avg_sq``, ``step``) and, as JSON-able meta, the
    parameter groups (hyperparameters, and the names in place of the numbers) and any non-tensor state.
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
    return tensors, {"param_groups": groups, "scalars": scalars}


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
    return {"state": state, "param_groups": groups}


# ----------------------------------------------------------------------------------------------- writing
def _check_save_arguments(iteration: int, learners: Mapping[str, Any], keep: int, extra: Any) -> None:
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
        raise ValueError(f"iteration must be an int >= 0 (completed iterations), got {iteration!r}")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an int >= 1 (checkpoints to keep), got {keep!r}")
    if not learners:
        raise ValueError("save_checkpoint needs at least one learner")
    if extra is not None:
        if not isinstance(extra, dict):
            raise TypeError(f"extra must be a dict, got {type(extra).__name__}")
        try:
            json.dumps(extra)
        except (TypeError, ValueError) as error:
            raise TypeError(f"extra must be JSON-able (str keys, numbers, strings, lists, dicts): {error}") from error


def _write_contents(
    directory: Path, iteration: int, learners: Mapping[str, Learner], env: AECEnv, extra: dict[str, Any]
) -> None:
    rng_tensors, rng_meta = _global_rng_state()
    state: dict[str, Any] = {"learners": {}, "env": [], "rng": rng_meta}
    written = []
    for index, (learner_id, learner) in enumerate(learners.items()):
        tensors, meta = learner.state_dict()
        name = _learner_file(learner_id, index)
        write_tensors(directory / name, tensors)
        written.append(name)
        state["learners"][learner_id] = {"file": name, "state": meta}
    env_tensors = {}
    for key, part in _stateful_parts(env):
        tensors, meta = part.state_dict()
        env_tensors.update({f"{key}/{name}": tensor for name, tensor in tensors.items()})
        state["env"].append({"part": key, "state": meta})
    for name, tensors in ((ENV_FILE, env_tensors), (RNG_FILE, rng_tensors)):
        write_tensors(directory / name, tensors)
        written.append(name)
    write_json(directory / STATE_FILE, state)
    written.append(STATE_FILE)
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "iteration": iteration,
        "extra": extra,
        "files": {name: _describe_file(directory / name) for name in sorted(written)},
    }
    write_json(directory / MANIFEST_FILE, manifest, indent=2)


def _learner_file(learner_id: str, index: int) -> str:
    # An id that is not a plain file name is numbered instead ("learner." cannot clash with "learner-").
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,100}", learner_id):
        return f"learner-{learner_id}.safetensors"
    return f"learner.{index}.safetensors"


def write_tensors(path: Path, tensors: Mapping[str, torch.Tensor]) -> None:
    """Write ``tensors`` to a safetensors file and sync it to disk."""
    save_file({name: t.detach().cpu().contiguous() for name, t in tensors.items()}, str(path))
    with path.open("rb") as handle:
        os.fsync(handle.fileno())


def write_json(path: Path, data: Any, indent: int | None = None) -> None:
    """Write ``data`` as JSON (floats in full precision) and sync it to disk."""
    with path.open("w") as handle:
        json.dump(data, handle, indent=indent)
        handle.flush()
        os.fsync(handle.fileno())


def _describe_file(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": _sha256(path)}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_directory(path: Path) -> None:
    if os.name != "posix":  # a directory cannot be opened for fsync elsewhere
        return
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    except OSError as error:
        # Some file systems (several FUSE and network ones) cannot sync a directory; their renames are what they are.
        if error.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(descriptor)


def _move_into_place(temporary: Path, final: Path) -> None:
    """Rename the finished checkpoint to its final name, replacing one of the same iteration if there is one."""
    root = final.parent
    aside = root / f".replaced-{final.name}-{os.getpid()}" if final.exists() else None
    if aside is not None:
        # rename() cannot replace a non-empty directory: move the old one aside (it stays a candidate for
        # latest_checkpoint until the new one has its name), then delete it.
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
    os.replace(temporary, final)
    _fsync_directory(root)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _prune(root: Path, iteration: int, keep: int) -> None:
    """Keep the new checkpoint and the ``keep - 1`` newest complete ones before it; remove the rest."""
    kept = 1
    for number, path in _candidates(root):
        if number == iteration and path.name == f"iteration-{iteration:06d}":
            continue
        if number < iteration and kept < keep and _is_complete(path):
            kept += 1
            continue
        _remove(path)


def _clean_stale(root: Path) -> None:
    """Remove what interrupted saves and removals left; put back a checkpoint moved aside and never replaced."""
    for entry in root.iterdir():
        if entry.name.startswith((_TEMPORARY_PREFIX, _TRASH_PREFIX)):
            shutil.rmtree(entry, ignore_errors=True)
            continue
        replaced = _REPLACED.fullmatch(entry.name)
        if replaced is None:
            continue
        final = root / replaced.group(1)
        if final.exists() and _is_complete(final):
            shutil.rmtree(entry, ignore_errors=True)
        else:
            if final.exists():
                _remove(final)
            os.replace(entry, final)
            _fsync_directory(root)


def _remove(path: Path) -> None:
    # Renamed first: a kill in the middle of rmtree must not leave a half-deleted directory under a checkpoint name.
    trash = path.parent / f"{_TRASH_PREFIX}{path.name}-{os.getpid()}"
    shutil.rmtree(trash, ignore_errors=True)
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


# ----------------------------------------------------------------------------------------------- reading
def _candidates(root: Path) -> list[tuple[int, Path]]:
    """Checkpoint directories (final ones, and complete ones moved aside), newest first; finals first on a tie."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        final, replaced = _FINAL.fullmatch(entry.name), _REPLACED.fullmatch(entry.name)
        if final is not None and entry.is_dir():
            found.append((int(final.group(1)), 1, entry))
        elif replaced is not None and entry.is_dir():
            found.append((int(replaced.group(2)), 0, entry))
    return [(number, path) for number, _, path in sorted(found, key=lambda item: item[:2], reverse=True)]


def _is_complete(path: Path) -> bool:
    try:
        _check_files(path, _read_manifest(path), verify_hashes=False)
    except CheckpointError:
        return False
    return True


def _read_manifest(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise CheckpointError(f"there is no checkpoint directory {path}")
    if not (path / MANIFEST_FILE).is_file():
        raise CheckpointError(
            f"checkpoint {path} has no {MANIFEST_FILE}: it is incomplete (the manifest is written last)"
        )
    manifest = _read_json(path / MANIFEST_FILE, path)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path / MANIFEST_FILE} is not a marllm training-state manifest")
    version = manifest.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {version!r}; this marllm reads version {FORMAT_VERSION} "
            "(a newer marllm wrote it)"
        )
    missing = [key for key in ("iteration", "extra", "files") if key not in manifest]
    if missing:
        raise CheckpointError(f"{path / MANIFEST_FILE} lacks {missing}")
    return manifest


def _check_files(path: Path, manifest: dict[str, Any], verify_hashes: bool) -> None:
    problems = []
    for name, expected in manifest["files"].items():
        file = path / name
        if not file.is_file():
            problems.append(f"{name} is missing")
            continue
        size = file.stat().st_size
        if size != expected["bytes"]:
            problems.append(f"{name} has {size} bytes, the manifest says {expected['bytes']}")
        elif verify_hashes and _sha256(file) != expected["sha256"]:
            problems.append(f"{name} does not match its sha256 in the manifest (its content changed)")
    if problems:
        raise CheckpointError(f"checkpoint {path} is damaged: " + "; ".join(problems))


def _read_json(file: Path, checkpoint: Path) -> Any:
    try:
        return json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"checkpoint {checkpoint}: {file.name} cannot be read: {error}") from error


def _read_tensors(file: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(file), device="cpu")
    except (OSError, SafetensorError) as error:
        raise CheckpointError(f"checkpoint {file.parent}: {file.name} cannot be read: {error}") from error


def _check_learner_ids(path: Path, saved: Mapping[str, Any], learners: Mapping[str, Any]) -> None:
    missing = [learner_id for learner_id in learners if learner_id not in saved]
    unexpected = [learner_id for learner_id in saved if learner_id not in learners]
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {path} holds learners {list(saved)}, the run has {list(learners)}: "
            f"missing from the checkpoint {missing}, not in the run {unexpected}"
        )


def _check_env_parts(path: Path, saved: list[str], here: list[str]) -> None:
    if saved != here:
        raise CheckpointError(
            f"checkpoint {path} saved an env whose stateful parts are {saved}; this env's are {here} "
            "(build the env as the run that saved it did)"
        )


@contextlib.contextmanager
def _context(where: str) -> Iterator[None]:
    """Prefix a CheckpointError raised inside with where it happened."""
    try:
        yield
    except CheckpointError as error:
        raise CheckpointError(f"{where}: {error}") from error


# ----------------------------------------------------------------------------------------------- the env chain
def _stateful_parts(env: AECEnv) -> list[tuple[str, Any]]:
    """``(key, object)`` for every object on the ``.env`` chain whose class has state_dict/load_state_dict.

    The key is ``"<position among them>.<class name>"``. Classes are asked, not instances: PettingZoo wrappers
    forward unknown attributes to the env they wrap, so every wrapper would seem to have its inner env's methods.
    """
    parts = []
    for part in _chain(env):
        kind = type(part)
        if callable(getattr(kind, "state_dict", None)) and callable(getattr(kind, "load_state_dict", None)):
            parts.append((f"{len(parts)}.{kind.__name__}", part))
    return parts


def _chain(env: Any) -> Iterator[Any]:
    seen = set()
    while env is not None and id(env) not in seen:
        seen.add(id(env))
        yield env
        env = vars(env).get("env") if hasattr(env, "__dict__") else None


# ----------------------------------------------------------------------------------------------- global generators
def _global_rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"cuda.{i}": state for i, state in enumerate(torch.cuda.get_rng_state_all())})
    kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    meta = {
        "numpy": [kind, keys.tolist(), int(position), int(has_gauss), float(cached_gaussian)],
        "python": [version, list(internal), gauss_next],
    }
    return tensors, meta


def _restore_global_rngs(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> None:
    if "torch" not in tensors:
        raise CheckpointError(f"{RNG_FILE} has no torch generator state")
    torch.set_rng_state(tensors["torch"])
    cuda_keys = sorted((key for key in tensors if key.startswith("cuda.")), key=lambda key: int(key[5:]))
    cuda = [tensors[key] for key in cuda_keys]
    if cuda and torch.cuda.is_available():
        count = torch.cuda.device_count()
        if len(cuda) != count:
            warnings.warn(
                f"the checkpoint has CUDA generator states for {len(cuda)} device(s), this machine has {count}; "
                "restoring the first ones only (the run will not repeat bit for bit)",
                RuntimeWarning,
                stacklevel=3,
            )
        for device, state in enumerate(cuda[:count]):
            torch.cuda.set_rng_state(state, device)
    kind, keys, position, has_gauss, cached_gaussian = meta["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached_gaussian))
    version, internal, gauss_next = meta["python"]
    random.setstate((version, tuple(internal), gauss_next))


def _few(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return f"{shown} (and {len(names) - limit} more)" if len(names) > limit else shown
