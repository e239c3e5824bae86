"""The training configuration: typed sections read from YAML, with dotted overrides and up-front checks.

:class:`TrainConfig` (in :mod:`marllm.config.train_config`) is a whole run's config; this module builds one from
plain data or a YAML file, and says which keys a resumed run may change.

Earlier layouts (before 1.0): marllm reads one config layout, :data:`CONFIG_LAYOUT`. A run directory records the
layout it was written in (``run.json``); a run of another layout is refused in one line when it is read or resumed,
and a key that has moved is answered with its place today (the loader looks every unknown key up in the tree). Until
1.0 the layout may change between releases and nothing converts old files: a run is finished with the version
that started it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from marllm.config.loading import ConfigError, apply_overrides, build, read_yaml  # noqa: F401 - ConfigError re-exported
from marllm.config.paths import absolute_config_paths
from marllm.config.train_config import TrainConfig, per_learner  # noqa: F401 - per_learner re-exported
from marllm.games.settings import GAME_REPETITION_PENALTY
from marllm.tasks.custom import task_class
from marllm.utils.files import read_json_object

CONFIG_LAYOUT = 3
"""The config layout this marllm reads (3: a game's seats and action mode written with their own settings; 2:
``ppo`` and ``game`` in sections); a run directory records its own."""
RUN_RECORD = "run.json"
"""The file beside a run directory's ``config.yaml`` that says marllm wrote both, and in which layout."""


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """Build and check a :class:`TrainConfig` from plain data; errors name the offending key. A game's generation
    defaults differ from a text task's in one setting: :data:`~marllm.games.settings.GAME_REPETITION_PENALTY`."""
    data = dict(data)
    generation = data.get("generation")
    if data.get("game") is not None and (generation is None or isinstance(generation, Mapping)):
        data["generation"] = {"repetition_penalty": GAME_REPETITION_PENALTY, **(generation or {})}
    task = data.get("task", {})
    if isinstance(task, dict):
        kind = task.get("name", "sentiment")
        data["task"] = build(task_class(kind), {**task, "name": kind}, "task")
    return build(TrainConfig, data)


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read a YAML config and apply ``section.key=value`` overrides; its paths are made absolute, relative to the
    config file's folder (an override's, to the working directory): see :mod:`marllm.config.paths`.

    A run directory's own ``config.yaml`` written in another layout than :data:`CONFIG_LAYOUT` is refused in one
    line that says so.
    """
    data = read_yaml(path)
    recorded = _recorded_layout(Path(path))
    if recorded is not None and recorded != CONFIG_LAYOUT:
        raise ConfigError(other_layout(Path(path).parent, recorded))
    data = apply_overrides(data, overrides)
    folder = Path(path).resolve().parent
    return config_from_dict(absolute_config_paths(data, folder, overrides))


def run_layout(run_dir: Path) -> int | None:
    """The config layout a run directory's ``run.json`` records; None where it records none (runs from before
    layouts were recorded, which are read as today's where their config builds)."""
    layout = read_json_object(run_dir / RUN_RECORD).get("config_layout")
    return layout if isinstance(layout, int) and not isinstance(layout, bool) else None


def other_layout(run_dir: Path, layout: int) -> str:
    """The one-line refusal of a run written in config layout ``layout``."""
    return (
        f"{run_dir} was written in config layout {layout} and this marllm reads layout {CONFIG_LAYOUT}; before 1.0 "
        "marllm converts no earlier layout: finish the run with the marllm version that started it, or start it "
        "again with --overwrite"
    )


def _recorded_layout(path: Path) -> int | None:
    """The layout of a run directory's own ``config.yaml`` (None for any other config file)."""
    if path.name != "config.yaml" or not (path.parent / RUN_RECORD).is_file():
        return None
    layout = run_layout(path.parent)
    return CONFIG_LAYOUT if layout is None else layout


# What a resumed run may change: where it is written, what it logs and evaluates, whether remote code may load,
# how a non-finite update is handled, and how long it trains (``iterations``, down to the checkpoint's iteration at
# least). Everything else changes what is trained and must match the checkpoint.
RESUMABLE_KEYS = (
    "iterations",
    "run_dir",
    "logging.*",
    "model.trust_remote_code",
    "model.fsdp",  # a checkpoint holds whole tensors, whether the run that wrote it used FSDP or not
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
    its default.
    """
    # not readable by this version (a key since removed, a device this machine lacks): compare what it holds
    with contextlib.suppress(ValueError):
        saved = config_from_dict(dict(saved)).to_dict()
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
            changed.append(f"{key}: {show[0]} -> {show[1]}")
    return changed


def _resumable(key: str) -> bool:
    return any(key == allowed or (allowed.endswith("*") and key.startswith(allowed[:-1])) for allowed in RESUMABLE_KEYS)
