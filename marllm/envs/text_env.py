"""Sequential text environment: N roles answer a batch of queries in turn (PettingZoo AEC).

Agents
    One agent per role (``["pioneer", "observer"]`` for CORY). By default each role speaks once, in the order given;
    a turn order (``turns=["proposer", "critic", "proposer"]``) lets a role speak several times. The episode ends
    after the last turn.
Episode
    ``reset`` draws a batch of ``batch_size`` samples from the dataset (shuffled, without replacement within a pass
    over the data). One episode is ``batch_size`` parallel dialogues, so one turn is one batched generation.
Observation
    ``{"prompt": (p_1, ..., p_B)}``: the prompts of the role's current turn, rendered by its template from the sample
    and the earlier turns' responses. Text is the only channel between agents, so agents need not share a
    tokenizer. Before a role's first turn its prompts are not known yet and are observed as empty strings.
Action
    ``(a_1, ..., a_B)``: one response string per dialogue.
Info
    ``infos[role]`` holds the role's name under ``role`` and the batch's queries under ``queries`` (one per dialogue)
    from ``reset`` on, and the role's rewards once the episode ends (see Reward).
Reward
    After the last turn every role gets its task reward: ``r(sample, response)`` of the reward function on its last
    response. The reward function is the same for every role, ``reward_fn(samples, responses)``, unless it asks to
    know whose responses it scores: a reward with a parameter named ``context``, ``reward_fn(samples, responses,
    context)``, is also given a :class:`~marllm.envs.reward_context.RewardContext` (the role, the turn, the speaking
    order and every turn's responses), and ``reward_fn`` may map each role to a reward of its own (see
    :mod:`marllm.envs.reward_context`). Either way a role is scored on its own responses, so that roles may want
    opposite things (a buyer a low price, a seller a high one). PettingZoo rewards are scalars, so
    ``rewards[role]`` is the batch mean; the per-dialogue vectors are in ``infos[role]`` under the keys of
    :mod:`marllm.envs.info_keys`: ``task_rewards`` (the role's own reward, its last response's, never changed by
    wrappers), ``batch_rewards`` (the reward it is trained on; reward wrappers rewrite it), and one row per turn of
    the role in ``turn_task_rewards`` / ``turn_batch_rewards``. With ``turn_rewards="each"`` each turn is credited
    with the reward of its own response; with ``"last"`` every turn of a role is credited with the reward of the
    role's last response (the outcome of its turns, undiscounted).
Termination
    All roles terminate together after the last turn; nothing truncates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Dict as DictSpace
from pettingzoo import AECEnv
from pettingzoo.utils import wrappers

from marllm.envs.info_keys import BATCH_REWARDS, QUERIES, TASK_REWARDS, TURN_BATCH_REWARDS, TURN_TASK_REWARDS
from marllm.envs.reward_context import RewardContext, reward_name, rewards_by_role, score
from marllm.envs.spaces import TextBatch
from marllm.envs.templates import PromptFn, check_templates
from marllm.envs.text_inputs import check_batch_sizes, check_dataset, describe_action, warn_if_queries_repeat
from marllm.envs.turns import check_roles, check_shard, check_turn_rewards, check_turns, describe_turn, turn_names
from marllm.utils.errors import CheckpointError
from marllm.utils.generators import restore_generator

RewardFn = Callable[[list[dict[str, Any]], list[str]], Sequence[float]]
"""A task reward: ``reward_fn(samples, responses) -> one float per sample`` (or, with a parameter named ``context``,
``reward_fn(samples, responses, context)``: see :mod:`marllm.envs.reward_context`)."""

MAX_TEXT_LENGTH = 1_000_000


class RewardFunctionError(RuntimeError):
    """The task reward function raised or returned something that is not one finite float per sample."""


class SequentialTextEnv(AECEnv):
    """N roles answer a batch of queries in turn; each role is rewarded for its own response.

    Args:
        dataset: a ``datasets.Dataset`` or a list of dicts; each row must have ``query_column``.
        roles: the agent names, in speaking order when ``turns`` is None.
        templates: one prompt template per role: a ``str.format`` string or a callable ``(sample, responses) -> str``,
            as a mapping role -> template or a list in role order. A mapping may also key a single turn by its name
            ``<role>_<k>`` (the role's k-th turn, from 1), which then overrides the role's template for that turn.
            Fields (and the keys of ``responses``) are the sample's columns, each role that spoke earlier (its
            latest response) and each earlier turn's name (that turn's response, e.g. ``{proposer_1}``).
        reward_fn: ``reward_fn(samples, responses) -> one float per sample``, applied to every role's responses; a
            function with a parameter named ``context`` is called ``reward_fn(samples, responses, context=...)``
            with a :class:`~marllm.envs.reward_context.RewardContext` (the scored role and turn, the speaking order,
            every turn's responses); a mapping role -> reward function scores each role by its own (it must name
            every role).
        batch_size: dialogues per episode.
        query_column: the column holding the query.
        render_mode: ``None`` or ``"ansi"`` (``render()`` returns the first dialogue as text).
        seed: seeds the order in which batches are drawn, as a first ``reset(seed=seed)`` would, so that a loop whose
            resets carry no seed is reproducible; None (Gymnasium's convention) draws the order from OS entropy
            until a reset passes a seed.
        group_size: each drawn query is asked this many times, in consecutive dialogues, so that a batch holds
            ``batch_size / group_size`` queries in groups of ``group_size`` (what GRPO-style learners compare; every
            role's responses come in the same groups). Must divide ``batch_size``.
        turns: the speaking order as a list of roles in which a role may appear several times (a debate:
            ``[a, b, a, b]``); every role must speak at least once. None: each role once, in ``roles`` order.
        turn_rewards: ``"each"``: each turn is credited with the task reward of its own response; ``"last"``: every
            turn of a role with the task reward of the role's last response. Only matters for roles with several
            turns.
        shard: ``(index, count)``: play the ``index``-th of ``count`` slices (whole groups) of every batch of
            ``batch_size`` (a data-parallel rank). Every shard draws the same batches and keeps its slice: together
            they play the batch one env would. Spaces, prompts and rewards then hold ``batch_size / count``.
    """

    metadata = {"name": "sequential_text_v0", "render_modes": ["ansi"], "is_parallelizable": False}

    def __init__(
        self,
        dataset: Any,
        roles: Sequence[str],
        templates: Mapping[str, str | PromptFn] | Sequence[str | PromptFn],
        reward_fn: RewardFn | Mapping[str, RewardFn],
        batch_size: int,
        query_column: str = "query",
        render_mode: str | None = None,
        seed: int | None = None,
        group_size: int = 1,
        turns: Sequence[str] | None = None,
        turn_rewards: str = "each",
        shard: tuple[int, int] = (0, 1),
    ):
        super().__init__()
        self.roles = check_roles(roles)
        self.turns = check_turns(turns, self.roles)
        self.turn_names = turn_names(self.turns)
        self.turn_rewards = check_turn_rewards(turn_rewards)
        self.dataset = dataset
        self.query_column = query_column
        self._num_rows, columns = check_dataset(dataset, query_column)
        check_batch_sizes(batch_size, group_size)
        self.group_size = group_size
        self.shard_index, self.shard_count = check_shard(shard, batch_size, group_size)
        self.global_batch_size = batch_size
        batch_size = self.batch_size = batch_size // self.shard_count
        warn_if_queries_repeat(self._num_rows, self.global_batch_size, group_size)
        self.templates = check_templates(templates, self.roles, columns, self.turns, dataset)
        self.reward_fn = reward_fn
        self.role_rewards = rewards_by_role(reward_fn, self.roles)
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.render_mode = render_mode

        self.possible_agents = list(self.roles)
        self.agents: list[str] = []
        self.observation_spaces = {
            role: DictSpace({"prompt": TextBatch(batch_size, MAX_TEXT_LENGTH)}) for role in self.roles
        }
        self.action_spaces = {role: TextBatch(batch_size, MAX_TEXT_LENGTH) for role in self.roles}
        self._seed(seed)
        self.samples: list[dict[str, Any]] = []
        self.queries: tuple[Any, ...] = ()
        self.prompts: dict[str, tuple[str, ...]] = {}
        self.responses: dict[str, tuple[str, ...]] = {}
        self.turn_prompts: list[tuple[str, ...]] = []
        self.turn_responses: list[tuple[str, ...]] = []

    def observation_space(self, agent: str) -> DictSpace:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> TextBatch:
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        if seed is not None:
            self._seed(seed)
        self.samples = [dict(self.dataset[int(i)]) for i in self._draw_indices()]
        self.agents = list(self.possible_agents)
        self.rewards = {role: 0.0 for role in self.agents}
        self._cumulative_rewards = {role: 0.0 for role in self.agents}
        self.terminations = {role: False for role in self.agents}
        self.truncations = {role: False for role in self.agents}
        self.queries = tuple(sample[self.query_column] for sample in self.samples)
        self.infos = {role: {"role": role, QUERIES: self.queries} for role in self.agents}
        self.responses = {}
        self.turn_responses = []
        self._turn = 0
        self.turn_prompts = [self._render(0)]
        self.prompts = {self.turns[0]: self.turn_prompts[0]}
        self.agent_selection = self.turns[0]

    def _seed(self, seed: int | None) -> None:
        """Restart the data order from a generator seeded with ``seed`` (None: from OS entropy)."""
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be a non-negative int or None, got {seed!r}")
        self._rng = np.random.default_rng(seed)
        self._order = np.empty(0, dtype=np.int64)
        self._cursor = 0

    def _draw_indices(self) -> np.ndarray:
        """The next ``batch_size / group_size`` rows of a shuffled pass over the data (a new pass is shuffled when one
        ends), each repeated ``group_size`` times in a row; this shard's slice of them."""
        picked = []
        needed = self.global_batch_size // self.group_size
        while needed:
            if self._cursor >= len(self._order):
                self._order = self._rng.permutation(self._num_rows)
                self._cursor = 0
            take = self._order[self._cursor : self._cursor + needed]
            self._cursor += len(take)
            needed -= len(take)
            picked.append(take)
        drawn = np.repeat(np.concatenate(picked), self.group_size)
        return drawn[self.shard_index * self.batch_size : (self.shard_index + 1) * self.batch_size]

    def _render(self, turn: int) -> tuple[str, ...]:
        template = self.templates[self.turn_names[turn]]
        prompts = []
        for i, sample in enumerate(self.samples):
            earlier = {}
            spoken = zip(self.turns, self.turn_names, self.turn_responses, strict=False)  # the turns so far
            for earlier_role, earlier_name, texts in spoken:
                earlier[earlier_role] = earlier[earlier_name] = texts[i]
            try:
                prompt = template(sample, earlier)
            except Exception as error:
                raise ValueError(f"rendering the prompt of {self._who(turn)} for sample {i} failed: {error}") from error
            if not isinstance(prompt, str):
                raise TypeError(f"the template of {self._who(turn)} returned {type(prompt).__name__}, not str")
            prompts.append(prompt)
        return tuple(prompts)

    def observe(self, agent: str) -> dict[str, tuple[str, ...]]:
        return {"prompt": self.prompts.get(agent, ("",) * self.batch_size)}

    def step(self, action: Sequence[str] | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        if not self.action_spaces[agent].contains(action):
            raise ValueError(
                f"action of role {agent!r} must be a sequence of {self.batch_size} strings (one response per "
                f"dialogue), got {describe_action(action)}"
            )
        self._cumulative_rewards[agent] = 0.0
        self.responses[agent] = tuple(action)
        self.turn_responses.append(tuple(action))
        self._turn += 1
        if self._turn < len(self.turns):
            next_role = self.turns[self._turn]
            self.turn_prompts.append(self._render(self._turn))
            self.prompts[next_role] = self.turn_prompts[-1]
            self.agent_selection = next_role
            self._clear_rewards()
        else:
            for role in self.roles:
                self._finish_role(role)
            self.agent_selection = self.turns[0]
        self._accumulate_rewards()

    def _finish_role(self, role: str) -> None:
        """Score the role's turns and terminate it."""
        own_turns = [t for t, r in enumerate(self.turns) if r == role]
        if self.turn_rewards == "each":
            turn_rewards = np.stack([self._task_rewards(role, t) for t in own_turns])
        else:
            turn_rewards = np.tile(self._task_rewards(role, own_turns[-1]), (len(own_turns), 1))
        task_rewards = turn_rewards[-1].copy()
        self.rewards[role] = float(task_rewards.mean())
        self.infos[role] = {
            "role": role,
            QUERIES: self.queries,
            TASK_REWARDS: task_rewards,
            BATCH_REWARDS: task_rewards.copy(),
            TURN_TASK_REWARDS: turn_rewards,
            TURN_BATCH_REWARDS: turn_rewards.copy(),
        }
        self.terminations[role] = True

    def _who(self, turn: int) -> str:
        """The role of a turn, for messages, with the turn's name where some role speaks more than once."""
        return describe_turn(self.turns, self.roles, turn)

    def reward_context(self, turn: int) -> RewardContext:
        """The :class:`~marllm.envs.reward_context.RewardContext` of turn ``turn`` of the current episode."""
        return RewardContext(
            role=self.turns[turn],
            turn=turn,
            turns=tuple(self.turns),
            samples=tuple(self.samples),
            dialogue=tuple(self.turn_responses),
        )

    def _task_rewards(self, role: str, turn: int) -> np.ndarray:
        reward_fn = self.role_rewards[role]
        name = reward_name(reward_fn)
        who = self._who(turn)
        try:
            values = score(reward_fn, self.samples, list(self.turn_responses[turn]), self.reward_context(turn))
        except Exception as error:
            raise RewardFunctionError(f"reward function {name} raised on the responses of {who}: {error!r}") from error
        try:
            raw = np.asarray(values)
            if raw.dtype.kind not in "biuf":
                raise TypeError(f"dtype {raw.dtype}")
            rewards = raw.astype(np.float64)
        except (TypeError, ValueError, RuntimeError) as error:  # RuntimeError: e.g. a tensor that requires grad
            raise RewardFunctionError(
                f"reward function {name} returned {type(values).__name__} ({error}) for {who}, not one "
                f"number per sample (return plain floats, a numpy array, or a tensor detached from any graph)"
            ) from error
        if rewards.ndim != 1:
            raise RewardFunctionError(
                f"reward function {name} returned an array of shape {rewards.shape} for {who}; expected a "
                f"1-D sequence of {self.batch_size} numbers, one per sample"
            )
        if rewards.shape != (self.batch_size,):
            raise RewardFunctionError(
                f"reward function {name} returned {rewards.size} values for {who}; expected "
                f"{self.batch_size} (one per sample)"
            )
        bad = np.flatnonzero(~np.isfinite(rewards))
        if bad.size:
            raise RewardFunctionError(
                f"reward function {name} returned non-finite values for {who} at sample(s) "
                f"{bad.tolist()[:10]}: {rewards[bad][:10].tolist()} (queries: "
                f"{[self.samples[i][self.query_column] for i in bad[:3]]})"
            )
        return rewards

    def render(self) -> str | None:
        if self.render_mode is None or not self.samples:
            return None
        lines = [f"query: {self.samples[0][self.query_column]!r}"]
        for turn, texts in enumerate(self.turn_responses):
            role, name = self.turns[turn], self.turn_names[turn]
            label = role if len(self.turns) == len(self.roles) else f"{role} ({name})"
            lines.append(f"{label}: {self.turn_prompts[turn][0]!r} -> {texts[0]!r}")
        return "\n".join(lines)

    def close(self) -> None:
        pass

    def state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """What a resumed run needs to draw the same batches: (tensors, JSON-able meta), for a checkpoint.

        The tensor ``order`` is the current pass's shuffled row order; the meta holds the position in it, the state
        of the generator that shuffles the next pass, and the dataset size and roles it was taken with. The current
        episode is not part of it: save between episodes (the next ``reset`` starts a new one).
        """
        import torch  # here, so that importing the env does not load torch

        meta = {
            "num_rows": self._num_rows,
            "roles": list(self.roles),
            "turns": list(self.turns),
            "cursor": self._cursor,
            "rng": self._rng.bit_generator.state,
        }
        return {"order": torch.from_numpy(self._order.astype(np.int64))}, meta

    def load_state_dict(self, tensors: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; the dataset must have as many rows as when it was saved.

        Raises:
            CheckpointError: the state does not fit this env (dataset size, roles, or a malformed order).
        """

        if meta["num_rows"] != self._num_rows:
            raise CheckpointError(
                f"the checkpoint's env drew from a dataset of {meta['num_rows']} rows, this env's has "
                f"{self._num_rows}: it is a different dataset (or split, or query filter)"
            )
        if list(meta["roles"]) != self.roles:
            raise CheckpointError(f"the checkpoint's env has roles {meta['roles']}, this env {self.roles}")
        if list(meta.get("turns", meta["roles"])) != self.turns:
            raise CheckpointError(f"the checkpoint's env has turns {meta.get('turns')}, this env {self.turns}")
        if "order" not in tensors:
            raise CheckpointError("the env state has no data order ('order')")
        order = tensors["order"].numpy().astype(np.int64)
        cursor = meta["cursor"]
        if order.ndim != 1 or (order.size and not 0 <= order.min() <= order.max() < self._num_rows):
            raise CheckpointError(f"the env's data order is not a sequence of row indices below {self._num_rows}")
        if not isinstance(cursor, int) or not 0 <= cursor <= order.size:
            raise CheckpointError(f"the env's position {cursor!r} is outside its data order of {order.size} rows")
        rng = np.random.Generator(type(self._rng.bit_generator)())
        restore_generator(rng, meta["rng"], "env")
        self._order, self._cursor, self._rng = order, cursor, rng


raw_env = SequentialTextEnv
"""PettingZoo's name for the unwrapped env class."""


def env(**kwargs: Any) -> AECEnv:
    """``SequentialTextEnv(**kwargs)`` behind PettingZoo's order-enforcing wrapper."""
    return wrappers.OrderEnforcingWrapper(SequentialTextEnv(**kwargs))
