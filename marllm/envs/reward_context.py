"""Role-aware task rewards: what a reward of :class:`~marllm.envs.SequentialTextEnv` may see besides the responses.

A task reward is given to the env in one of three forms:

- ``reward(samples, responses) -> one float per sample``: every role's responses are scored by the same rule, from
  the dataset rows and the responses alone (CORY's sentiment, the math tasks' exact match);
- ``reward(samples, responses, context) -> one float per sample``: a reward with a parameter named ``context`` is
  also given a :class:`RewardContext`, which says whose responses these are (the role, the turn, the speaking
  order) and holds the whole dialogue, so that roles may want opposite things (a buyer a low price, a seller a
  high one);
- a mapping ``role -> reward`` (each of either form above) that names every role: each role is scored by its own.

The form is read off the signature (:func:`wants_context`) when the env is built, and :func:`check_reward` refuses
a callable that fits neither, naming its signature. Rewards are scored once the episode is over, so the context's
``dialogue`` holds every turn of the episode, the ones after the scored turn included; ``earlier`` holds what the
scored turn's prompt could see.

An agent deployed alone (the end-of-run samples of a training run, pass@k) answers the first role's prompt with no
partner: its answers are scored with a one-turn context (:func:`alone_context`: ``turns`` is the first role alone),
so a role-aware reward should not count on the other roles having spoken.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from marllm.envs.turns import turn_names

__all__ = [
    "ContextRewardFn",
    "alone_context",
    "RewardContext",
    "check_reward",
    "reward_name",
    "rewards_by_role",
    "score",
    "wants_context",
]

CONTEXT = "context"
"""The parameter name by which a reward asks for a :class:`RewardContext`."""


@dataclass(frozen=True)
class RewardContext:
    """Who answered, and the dialogue the answers belong to, for a role-aware reward.

    Attributes:
        role: the role whose responses are scored.
        turn: the index of the scored turn in ``turns`` (from 0).
        turns: the speaking order of the episode (a role appears once per turn it speaks).
        samples: the batch's dataset rows, one per dialogue (the same rows as the reward's ``samples``).
        dialogue: the responses of every turn of the episode, in speaking order: ``dialogue[k][i]`` is what
            ``turns[k]`` answered in dialogue ``i``. Rewards are scored when the episode is over, so the turns after
            ``turn`` are here too.
    """

    role: str
    turn: int
    turns: tuple[str, ...]
    samples: tuple[Mapping[str, Any], ...]
    dialogue: tuple[tuple[str, ...], ...]

    @property
    def turn_names(self) -> list[str]:
        """``<role>_<k>`` for each turn: the role's k-th turn, counting from 1."""
        return turn_names(self.turns)

    @property
    def turn_name(self) -> str:
        """The scored turn's name, ``<role>_<k>``."""
        return self.turn_names[self.turn]

    @property
    def responses(self) -> tuple[str, ...]:
        """The scored responses (the reward's ``responses``)."""
        return self.dialogue[self.turn]

    @property
    def is_last_turn(self) -> bool:
        """Whether the scored turn is the last of the episode."""
        return self.turn == len(self.turns) - 1

    @property
    def earlier(self) -> list[dict[str, str]]:
        """Per dialogue, what the scored turn's prompt template could use: each role that spoke before it (its
        latest response) and each earlier turn by name."""
        fields: list[dict[str, str]] = [{} for _ in self.samples]
        for role, name, texts in zip(self.turns[: self.turn], self.turn_names, self.dialogue, strict=False):
            for i, text in enumerate(texts):
                fields[i][role] = fields[i][name] = text
        return fields

    def responses_of(self, role: str) -> list[tuple[str, ...]]:
        """The responses of each turn ``role`` spoke in the episode, in order."""
        if role not in self.turns:
            raise KeyError(
            f"role {role!r} does not speak in this episode; its turns are {list(self.turns)} (an agent deployed "
            "alone is scored with its own turn only)"
        )
        return [texts for speaker, texts in zip(self.turns, self.dialogue, strict=False) if speaker == role]

    def last(self, role: str) -> tuple[str, ...]:
        """``role``'s last responses of the episode, one per dialogue."""
        return self.responses_of(role)[-1]


class ContextRewardFn(Protocol):
    """A role-aware task reward: one float per sample, given the dataset rows, the responses and their context."""

    def __call__(
        self, samples: list[dict[str, Any]], responses: list[str], context: RewardContext
    ) -> Sequence[float]: ...


def reward_name(reward: Any) -> str:
    """How messages name a reward: its ``__name__``, else its type's."""
    return getattr(reward, "__name__", type(reward).__name__)


def _signature(reward: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(reward)
    except (TypeError, ValueError):  # a builtin without a signature: taken as (samples, responses)
        return None


def wants_context(reward: Callable[..., Any]) -> bool:
    """Whether ``reward`` takes a parameter named ``context`` (and so is called with a :class:`RewardContext`)."""
    signature = _signature(reward)
    if signature is None:
        return False
    parameter = signature.parameters.get(CONTEXT)
    return parameter is not None and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)


def check_reward(reward: Any, where: str = "reward_fn") -> None:
    """Raise ``TypeError`` (naming ``where`` and the signature) unless ``reward`` can be called as
    ``reward(samples, responses)`` or, with a ``context`` parameter, ``reward(samples, responses, context=…)``."""
    if not callable(reward) or isinstance(reward, type):
        raise TypeError(
            f"{where} must be callable (samples, responses) -> floats, or (samples, responses, context) -> floats, "
            f"got {reward!r}"
        )
    signature = _signature(reward)
    if signature is None:
        return
    try:
        if wants_context(reward):
            signature.bind(None, None, context=None)
        else:
            signature.bind(None, None)
    except TypeError:
        raise TypeError(
            f"{where}: {reward_name(reward)}{signature} cannot be called as (samples, responses) nor as (samples, "
            "responses, context); a reward takes the batch's dataset rows and one response per row (and, to see "
            "the role and the dialogue, a parameter named context)"
        ) from None


def rewards_by_role(reward: Any, roles: Sequence[str], where: str = "reward_fn") -> dict[str, Any]:
    """Each role's reward: ``reward`` itself for every role, or its entry for the role when it is a mapping (which
    must name every role and nothing else). Every reward is checked by :func:`check_reward`."""
    if isinstance(reward, Mapping):
        unknown = sorted(set(reward) - set(roles), key=str)
        missing = [role for role in roles if role not in reward]
        if unknown or missing:
            raise ValueError(
                f"{where} maps roles to rewards, and must name each of the roles {list(roles)} once: "
                + "; ".join(
                    part
                    for part in (
                        f"{unknown} are not roles" if unknown else "",
                        f"no reward for {missing}" if missing else "",
                    )
                    if part
                )
            )
        for role in roles:
            check_reward(reward[role], f"{where}[{role!r}]")
        return {role: reward[role] for role in roles}
    check_reward(reward, where)
    return dict.fromkeys(roles, reward)


def score(
    reward: Any, samples: list[dict[str, Any]], responses: list[str], context: RewardContext | None = None
) -> Any:
    """``reward``'s values for ``responses``: called with ``context`` if it asks for one, else as
    ``reward(samples, responses)``. A mapping of rewards is indexed by ``context.role``.

    ``context`` None stands for a single response per sample with no dialogue around it (an agent deployed alone
    in the first role): a role-aware reward needs a real one.
    """
    if isinstance(reward, Mapping):
        if context is None:
            raise ValueError("a mapping role -> reward needs the context naming the role")
        reward = reward[context.role]
    if not wants_context(reward):
        return reward(samples, responses)
    if context is None:
        raise ValueError(f"reward {reward_name(reward)} takes a context, and none was given")
    return reward(samples, responses, context=context)


def alone_context(role: str, samples: Sequence[Mapping[str, Any]], responses: Sequence[str]) -> RewardContext:
    """The context of ``responses`` given by ``role`` speaking alone (a one-turn dialogue), e.g. an agent deployed
    alone in the first role."""
    return RewardContext(role, 0, (role,), tuple(samples), (tuple(responses),))
