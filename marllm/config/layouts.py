"""marllm's own earlier config layouts, read in today's: the ``game`` and ``ppo`` keys that have since moved into
sections (``game.pool_size`` -> ``game.opponents.pool_size``, ``ppo.mini_batch_size`` ->
``ppo.batching.mini_batch_size``), and the defaults that have changed since a run was recorded.

A config a user writes in an earlier layout is refused with every move at once (``marllm upgrade`` rewrites it); a
run directory's own ``config.yaml``, which marllm wrote, is read in today's layout with a warning naming each move,
as is the config a checkpoint records when a run resumes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from marllm.algorithms.ppo_config import MOVED_PPO_KEYS, sectioned_ppo
from marllm.config.game import GAME_REPETITION_PENALTY, ActionsConfig, GameConfig, sectioned

RUN_RECORD = "run.json"
"""The file beside a run directory's ``config.yaml`` that says marllm wrote both."""

DEFAULT_CHANGES = {
    "generation.repetition_penalty": (1.1, GAME_REPETITION_PENALTY, "game"),
}
"""Dotted key -> (its default when earlier runs were recorded, today's, the section of the configs whose default it
is): a resumed run of such a config whose recorded value is the old default and whose config now has the new one is
told that setting the old value keeps its behaviour."""


def moves(data: Mapping[str, Any]) -> list[str]:
    """The keys of ``data`` (a config mapping) written in an earlier layout, each as ``"old -> new"``."""
    found = []
    game = data.get("game")
    if isinstance(game, Mapping):
        if isinstance(game.get("actions"), str):
            found.append(f"game.actions: {game['actions']} -> game.actions.{ActionsConfig.SCALAR_FIELD}")
        found += [f"game.{old} -> game.{new}" for old, new in GameConfig.MOVED_KEYS.items() if old in game]
    ppo = data.get("ppo")
    if isinstance(ppo, Mapping):
        found += [f"ppo.{old} -> ppo.{new}" for old, new in MOVED_PPO_KEYS.items() if old in ppo]
    return found


def todays_layout(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with every key of an earlier layout at its place today (a mapping in today's layout as it is)."""
    upgraded = dict(data)
    if isinstance(upgraded.get("game"), Mapping):
        upgraded["game"] = sectioned(upgraded["game"])
    if isinstance(upgraded.get("ppo"), Mapping):
        upgraded["ppo"] = sectioned_ppo(upgraded["ppo"])
    return upgraded


def is_run_record(path: str | Path) -> bool:
    """Whether ``path`` is a run directory's own ``config.yaml`` (marllm wrote it, beside its run record)."""
    path = Path(path)
    return path.name == "config.yaml" and (path.parent / RUN_RECORD).is_file()


def default_change_note(key: str, saved: Any, now: Any, sections: Mapping[str, Any]) -> str:
    """Why ``key`` differs between a recorded run (``saved``) and its config now (whose sections are ``sections``),
    where its default has changed: ``""`` otherwise."""
    change = DEFAULT_CHANGES.get(key)
    if change is None or (saved, now) != change[:2] or sections.get(change[2]) is None:
        return ""
    return (
        f" (the default of a config with a {change[2]} section changed from {saved} to {now}: set {key}={saved} to "
        "keep the run's behaviour)"
    )
