"""Who speaks when: the roles of a sequential env and its turn order, the names of turns, and which slice of each
batch a data-parallel env plays."""

from __future__ import annotations

from collections.abc import Sequence

TURN_REWARDS = ("each", "last")
"""How a role that speaks several times is credited: each turn by its own response, or every turn by its last."""


def check_turn_rewards(turn_rewards: str) -> str:
    """``turn_rewards``, unless it is not one of :data:`TURN_REWARDS`."""
    if turn_rewards not in TURN_REWARDS:
        raise ValueError(f"turn_rewards must be one of {list(TURN_REWARDS)}, got {turn_rewards!r}")
    return turn_rewards


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


def describe_turn(turns: Sequence[str], roles: Sequence[str], index: int) -> str:
    """How messages name turn ``index``: ``role 'r'``, with the turn's name where some role speaks more than once."""
    role = turns[index]
    return f"role {role!r}" + (f" (turn {turn_names(turns)[index]})" if len(turns) > len(roles) else "")


def check_shard(shard: tuple[int, int], batch_size: int, group_size: int) -> tuple[int, int]:
    """``(index, count)`` of a data-parallel env's slice of each batch: ``0 <= index < count``, and ``count`` slices
    of whole groups must make up ``batch_size``."""
    try:
        index, count = (int(part) if not isinstance(part, bool) and int(part) == part else None for part in shard)
    except (TypeError, ValueError):
        index = count = None
    if index is None or count is None or count < 1 or not 0 <= index < count:
        raise ValueError(f"shard must be (index, count) with 0 <= index < count, got {shard!r}")
    if batch_size % (count * group_size):
        raise ValueError(
            f"batch_size {batch_size} does not split into {count} slices of whole groups of {group_size} (one per "
            f"data-parallel process): give a batch size that is a multiple of {count} × {group_size} = "
            f"{count * group_size}"
        )
    return index, count
