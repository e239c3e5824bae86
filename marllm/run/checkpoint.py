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
How the directories are written, replaced, pruned and verified is :mod:`marllm.run.checkpoint_store`'s job; the helpers
those methods use (:func:`~marllm.models.state_dicts.check_tensors`, ...) are in :mod:`marllm.models.state_dicts`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import re
import shutil
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors import SafetensorError

from marllm.models.state_dicts import read_tensors, write_tensors
from marllm.run.checkpoint_store import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_FILE,
    TEMPORARY_PREFIX,
    candidates,
    check_files,
    clean_stale,
    prune,
    read_json,
    read_manifest,
)
from marllm.utils.errors import CheckpointError
from marllm.utils.files import describe_file, fsync_directory, replace_directory, write_json

if TYPE_CHECKING:
    from pettingzoo import AECEnv

    from marllm.algorithms.learner import Learner

__all__ = [
    "CHECKPOINTS_DIR",
    "ENV_FILE",
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "RNG_FILE",
    "STATE_FILE",
    "CheckpointError",
    "CheckpointInfo",
    "checkpoints",
    "latest_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
]

CHECKPOINTS_DIR = "training_state"
"""The directory under the run directory that holds the checkpoints."""

STATE_FILE = "state.json"
ENV_FILE = "env.safetensors"
RNG_FILE = "rng.safetensors"


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
    parts: Sequence[Any] = (),
) -> Path:
    """Write the training state after ``iteration`` completed iterations; return the checkpoint's directory.

    Call it between iterations (no learner may hold a rollout it has not trained on). The ``keep`` newest complete
    checkpoints are kept, older ones are removed once the new one is in place, and so are checkpoints of later
    iterations: they belong to a continuation this run abandoned by going on from an earlier one.

    Args:
        run_dir: the run directory; checkpoints go to ``run_dir / CHECKPOINTS_DIR``.
        iteration: completed iterations (names the directory ``iteration-%06d``).
        learners: the learners by id; their ``state_dict()`` is taken one at a time, in this order, as each is written.
        env: the wrapped env; every object on its ``.env`` chain that has ``state_dict`` is saved.
        keep: how many complete checkpoints to keep, >= 1.
        extra: JSON-able data of the caller's (e.g. the config), returned as :attr:`CheckpointInfo.extra`; JSON
            turns tuples into lists.
        parts: other objects of the run (its hooks); those whose class has ``state_dict``/``load_state_dict`` (a
            metrics hook's running sums) are saved with the env chain's parts, after them.

    Raises:
        ValueError / TypeError: bad arguments, or ``extra`` is not JSON-able; nothing is written.
        RuntimeError: a learner holds a rollout not yet trained on.
        CheckpointError: a file cannot be written (a full disk: the message gives the free space and about how much
            a checkpoint takes); what this save wrote is removed, the checkpoints before it stay.
    """
    _check_save_arguments(iteration, learners, keep, extra)
    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    clean_stale(root)
    final = root / f"iteration-{iteration:06d}"
    temporary = root / f"{TEMPORARY_PREFIX}{final.name}-{os.getpid()}"
    try:
        temporary.mkdir()
        _write_contents(temporary, iteration, learners, _stateful_parts(env, parts), extra or {})
        fsync_directory(temporary)
        replace_directory(temporary, final)
    except BaseException as error:
        shutil.rmtree(temporary, ignore_errors=True)
        if isinstance(error, OSError | SafetensorError):  # a full disk, say: one line, not a traceback
            raise _write_error(final, error) from error
        raise
    prune(root, iteration, keep)
    return final


def checkpoints(run_dir: Path, verify_hashes: bool = False) -> Iterator[CheckpointInfo | CheckpointError]:
    """Every checkpoint of ``run_dir``, newest first: its :class:`CheckpointInfo` when it is complete, else the
    :class:`CheckpointError` that says what is wrong with it. Each is read as it is reached, so that a caller that
    stops at the first complete one reads no older one.

    Reads only manifests and file sizes; with ``verify_hashes`` also every file's sha256, as :func:`load_checkpoint`
    does (a changed byte is then damage as a cut-short file is). Temporary directories of unfinished saves are left
    out.
    """
    for _, path in candidates(Path(run_dir) / CHECKPOINTS_DIR):
        try:
            manifest = read_manifest(path)
            check_files(path, manifest, verify_hashes=False)
            if verify_hashes:  # only once the sizes match: a file cut short is named without hashing the others
                check_files(path, manifest, verify_hashes=True)
        except CheckpointError as error:
            yield error
            continue
        yield CheckpointInfo(path, manifest["iteration"], manifest["extra"])


def latest_checkpoint(run_dir: Path) -> CheckpointInfo | None:
    """The newest complete checkpoint of ``run_dir`` (None if it has none; see :func:`checkpoints`); a damaged
    checkpoint is skipped with a warning that says why."""
    for entry in checkpoints(run_dir):
        if isinstance(entry, CheckpointInfo):
            return entry
        warnings.warn(f"skipping a damaged checkpoint: {entry}", RuntimeWarning, stacklevel=2)
    return None


def load_checkpoint(
    path: Path, learners: Mapping[str, Learner], env: AECEnv, parts: Sequence[Any] = ()
) -> CheckpointInfo:
    """Restore the learners, the env chain, the other ``parts`` (as :func:`save_checkpoint` takes them) and the
    global random generators from the checkpoint at ``path``.

    ``learners``, ``env`` and ``parts`` must be built as for the run that saved it (same learner ids, model shapes,
    dataset, wrappers). Every file is checked against the manifest's sizes and sha256 before anything is restored.

    Raises:
        CheckpointError: the checkpoint is missing, incomplete or damaged (the message names the files), or a
            state does not fit (a learner id missing, a parameter shape or the dataset size differs, ...). If it
            is raised while restoring, the objects may be partly restored: build fresh ones.
    """
    path = Path(path)
    manifest = read_manifest(path)
    check_files(path, manifest, verify_hashes=True)
    state = read_json(path / STATE_FILE, path)
    files = manifest["files"]
    _check_learner_ids(path, state["learners"], learners)
    stateful = _stateful_parts(env, parts)
    _check_env_parts(path, [entry["part"] for entry in state["env"]], [key for key, _ in stateful])
    for learner_id, learner in learners.items():
        entry = state["learners"][learner_id]
        if entry["file"] not in files:
            raise CheckpointError(
                f"checkpoint {path}: {entry['file']} of learner {learner_id!r} is not in its manifest"
            )
        with _context(f"checkpoint {path}, learner {learner_id!r}"):
            learner.load_state_dict(read_tensors(path / entry["file"]), entry["state"])
    env_tensors = read_tensors(path / ENV_FILE)
    for (key, part), entry in zip(stateful, state["env"], strict=True):
        prefix = f"{key}/"
        tensors = {name.removeprefix(prefix): t for name, t in env_tensors.items() if name.startswith(prefix)}
        with _context(f"checkpoint {path}, env part {key}"):
            part.load_state_dict(tensors, entry["state"])
    with _context(f"checkpoint {path}, random generators"):
        _restore_global_rngs(read_tensors(path / RNG_FILE), state["rng"])
    return CheckpointInfo(path, manifest["iteration"], manifest["extra"])


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
    directory: Path,
    iteration: int,
    learners: Mapping[str, Learner],
    parts: list[tuple[str, Any]],
    extra: dict[str, Any],
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
    for key, part in parts:
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
        "files": {name: describe_file(directory / name) for name in sorted(written)},
    }
    write_json(directory / MANIFEST_FILE, manifest, indent=2)


def _write_error(final: Path, error: BaseException) -> CheckpointError:
    """One line for a save that could not write its files; for a full disk, with the space free now and about what a
    checkpoint takes (the newest complete one's size)."""
    cause = f"{type(error).__name__}: {error}"
    full = (isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)) or any(
        os.strerror(number) in str(error) for number in (errno.ENOSPC, errno.EDQUOT)
    )
    if not full:
        return CheckpointError(f"cannot write checkpoint {final}: {cause}")
    try:
        space = f"{_size(shutil.disk_usage(final.parent).free)} free on its file system"
    except OSError:
        space = "its free space unknown"
    previous = next((entry for entry in checkpoints(final.parents[1]) if isinstance(entry, CheckpointInfo)), None)
    if previous is not None:
        needed = sum(file.stat().st_size for file in previous.path.iterdir() if file.is_file())
        space += f", a checkpoint takes about {_size(needed)} ({previous.path.name} does)"
    return CheckpointError(f"cannot write checkpoint {final}: the disk is full ({space}); free some space ({cause})")


def _size(count: int) -> str:
    """A byte count for people: ``"512 B"``, ``"3.4 MB"``."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def _learner_file(learner_id: str, index: int) -> str:
    # An id that is not a plain file name is numbered instead ("learner." cannot clash with "learner-").
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,100}", learner_id):
        return f"learner-{learner_id}.safetensors"
    return f"learner.{index}.safetensors"


# ----------------------------------------------------------------------------------------------- reading
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
def _stateful_parts(env: AECEnv, others: Sequence[Any] = ()) -> list[tuple[str, Any]]:
    """``(key, object)`` for every object on the ``.env`` chain whose class has state_dict/load_state_dict, then for
    each of ``others``.

    The key is ``"<position among them>.<class name>"``. Classes are asked, not instances: PettingZoo wrappers
    forward unknown attributes to the env they wrap, so every wrapper would seem to have its inner env's methods.
    """
    parts = []
    for part in [*_chain(env), *others]:
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
