"""Who speaks when: the roles of a sequential env and its turn order, and the names of turns."""

from __future__ import annotations

from collections.abc import Sequence

TURN_REWARDS = ("each", "last")
"""How a role that speaks several times is credited: each turn by its own response, or every turn by its last."""


def check_roles(roles: Sequence[str]) -> list[str]:
    """The roles as a list; raises unless they are distinct non-empty strings."""
    roles = list(roles)
    if not roles:
        raise ValueError("roles must name at least one role")
    if not all(isinstance(r, str) and r for r in roles):
        raise ValueError(f"roles must be non-empty strings, got {roles!r}")
    if len(set(roles)) != len(roles):
        raise ValueError(f"roles must be unique, got {roles!r}")
    return roles


def check_turns(turns: Sequence[str] | None, roles: list[str]) -> list[str]:
    """The speaking order: ``turns`` checked against ``roles`` (each a role, every role at least once), or ``roles``."""
    if turns is None:
        return list(roles)
    if isinstance(turns, str) or not isinstance(turns, Sequence):
        raise TypeError(f"turns must be a list of role names, got {turns!r}")
    turns = list(turns)
    unknown = sorted({t for t in turns if t not in roles}, key=str)
    if unknown:
        raise ValueError(f"turns name(s) {unknown} that are not roles; roles are {roles}")
    silent = [r for r in roles if r not in turns]
    if silent:
        raise ValueError(f"turns {turns} never let role(s) {silent} speak; every role needs at least one turn")
    return turns


def turn_names(turns: Sequence[str]) -> list[str]:
    """``<role>_<k>`` for each turn: the role's k-th turn, counting from 1 (``[a, b, a]`` -> ``[a_1, b_1, a_2]``)."""
    count: dict[str, int] = {}
    names = []
    for role in turns:
        count[role] = count.get(role, 0) + 1
        names.append(f"{role}_{count[role]}")
    return names
