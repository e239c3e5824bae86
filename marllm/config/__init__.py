"""The training configuration: typed sections read from YAML, with dotted overrides and up-front checks.

:class:`TrainConfig` (in :mod:`marllm.config.train_config`) is a whole run's config; this module builds one from
plain data or a YAML file, and says which keys a resumed run may change.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from marllm.config import layouts
from marllm.config.custom_tasks import task_class
from marllm.config.game import GAME_REPETITION_PENALTY
from marllm.config.ignored import check_read_settings
from marllm.config.loading import ConfigError, apply_overrides, build, read_yaml  # noqa: F401 - ConfigError re-exported
from marllm.config.paths import absolute_config_paths
from marllm.config.train_config import TrainConfig, per_learner  # noqa: F401 - per_learner re-exported


def config_from_dict(data: dict[str, Any], recorded: bool = False) -> TrainConfig:
    """Build and check a :class:`TrainConfig` from plain data; errors name the offending key. A game's generation
    defaults differ from a text task's in one setting: :data:`~marllm.config.game.GAME_REPETITION_PENALTY`. A config
    a run ``recorded`` (what it trained with) is not refused for settings it would not read
    (:func:`~marllm.config.ignored.check_read_settings`): runs recorded before that check resume and evaluate."""
    data = dict(data)
    generation = data.get("generation")
    if data.get("game") is not None and (generation is None or isinstance(generation, Mapping)):
        data["generation"] = {"repetition_penalty": GAME_REPETITION_PENALTY, **(generation or {})}
    task = data.get("task", {})
    if isinstance(task, dict):
        kind = task.get("name", "sentiment")
        data["task"] = build(task_class(kind), {**task, "name": kind}, "task")
    config = build(TrainConfig, data)
    if recorded:
        return config
    try:
        check_read_settings(config)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return config


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read a YAML config and apply ``section.key=value`` overrides; its paths are made absolute, relative to the
    config file's folder (an override's, to the working directory): see :mod:`marllm.config.paths`.

    A run directory's own ``config.yaml`` in an earlier layout of marllm's is read in today's, with a warning naming
    each moved key (:mod:`marllm.config.layouts`); any other config in one is refused with every move at once.
    """
    data = read_yaml(path)
    moved = layouts.moves(data)
    if moved and not layouts.is_run_record(path):
        raise ConfigError(
            f"{path} is written in an earlier layout of marllm's config: {'; '.join(moved)}. `marllm upgrade {path}` "
            "writes it in today's layout"
        )
    if moved:
        warnings.warn(f"{path} was written in an earlier layout, read in today's: {'; '.join(moved)}", stacklevel=2)
        data = layouts.todays_layout(data)
    data = apply_overrides(data, overrides)
    recorded = layouts.is_run_record(path)
    return config_from_dict(absolute_config_paths(data, Path(path).resolve().parent, overrides), recorded=recorded)


# What a resumed run may change: where it is written, what it logs and evaluates, whether remote code may load,
# how a non-finite update is handled, and how long it trains (``iterations``, down to the checkpoint's iteration at
# least). Everything else changes what is trained and must match the checkpoint.
RESUMABLE_KEYS = (
    "iterations",
    "run_dir",
    "logging.*",
    "model.trust_remote_code",
    "model.fsdp",  # a checkpoint holds whole tensors, whether the run that wrote it was sharded or not
    "model.fsdp_gather_for_generation",  # where the weights are while generating, not what is computed
    "ppo.guards.on_nonfinite",
    "ppo.guards.max_consecutive_skips",
)


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as ``{"section.key": value}`` (lists and other values are leaves)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


def resume_differences(saved: Mapping[str, Any], config: TrainConfig) -> list[str]:
    """The dotted keys whose values differ between ``saved`` (a checkpointed run's ``config.to_dict()``) and
    ``config``, leaving out :data:`RESUMABLE_KEYS`; each as ``"key: saved -> now"``.

    ``saved`` is first read back with this version's defaults, so that a key added since it was written compares as
    its default, and a game or ppo key that has moved into a section since compares at its new place.
    """
    saved = layouts.todays_layout(saved)
    # not readable by this version (a key since removed, a device this machine lacks): compare what it holds
    with contextlib.suppress(ValueError):
        saved = config_from_dict(dict(saved), recorded=True).to_dict()
    now_sections = config.to_dict()
    before, now = flatten(saved), flatten(now_sections)
    missing = object()
    changed = []
    for key in sorted(before.keys() | now.keys()):
        if _resumable(key):
            continue
        old, new = before.get(key, missing), now.get(key, missing)
        if old != new:
            show = [("(absent)" if value is missing else repr(value)) for value in (old, new)]
            changed.append(f"{key}: {show[0]} -> {show[1]}{layouts.default_change_note(key, old, new, now_sections)}")
    return changed


def _resumable(key: str) -> bool:
    return any(key == allowed or (allowed.endswith("*") and key.startswith(allowed[:-1])) for allowed in RESUMABLE_KEYS)
