"""The sizes a memory plan (:mod:`marllm.run.plan`) is made for, read from a config and its model's shape: the
rollout's batch, the longest prompt and response, the rows an update reads, the models beside the learners (a game's
snapshots, a task's reward model), and how the run computes its logits.

A text env's prompts are sized from its templates (:func:`prompt_tokens`); a game's are measured (:func:`game_lengths`:
a batch of games played with random legal moves, every prompt rendered and tokenized), as no template bounds them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from marllm.algorithms.ppo_sections import ComputeConfig
from marllm.config import TrainConfig
from marllm.config.loading import ConfigError
from marllm.models.memory import ModelShape, bytes_per_element
from marllm.models.policy import context_length
from marllm.parallel.placement import Placement, Sharded

__all__ = [
    "GameLengths",
    "Workload",
    "game_lengths",
    "keeps_generate_logits",
    "logit_bytes",
    "multiplies_in_float32",
    "plan_workload",
    "processes_logits",
    "prompt_tokens",
    "reward_model_parameters",
]

_EMPTY_PROMPT_FIELD = 64  # tokens assumed for a template field the plan cannot size (a task's own column)
_GAME_STEPS = 100_000  # a bound on the moves of the measured batch of games, far above any game's


def prompt_tokens(config: TrainConfig, characters_per_token: float = 3.0) -> int:
    """The longest prompt the config's text env renders, in tokens: each template's own text (at
    ``characters_per_token``), ``query_max_tokens`` for each ``{query}`` (64 if the task does not bound it) and
    ``generation.max_new_tokens`` for each earlier response it quotes."""
    if config.game is not None:
        raise ValueError("a game renders its own prompts, which no template bounds: measure them with game_lengths")
    query = getattr(config.task, "query_max_tokens", None) or _EMPTY_PROMPT_FIELD
    speakers = set(config.speaking_order) | set(config.env.roles)
    longest = 0
    for template in config.role_templates().values():
        tokens, literal = 0, template
        for name in re.findall(r"{(\w+)[^}]*}", template):
            tokens += config.generation.max_new_tokens if _is_response(name, speakers) else query
        literal = re.sub(r"{[^}]*}", "", literal)
        longest = max(longest, tokens + math.ceil(len(literal) / characters_per_token))
    return longest


def _is_response(field_name: str, speakers: set[str]) -> bool:
    return field_name in speakers or re.sub(r"_\d+$", "", field_name) in speakers


@dataclass(frozen=True)
class GameLengths:
    """What one batch of a config's games measures, played to its end with random legal moves (:func:`game_lengths`).

    Attributes:
        prompt: the longest prompt, in tokens, as the learners tokenize it (``generation.chat_template`` applied).
        move: the longest legal move's name, in tokens.
        learner_rows: the most answers one learner gives in the batch (over every seat it holds: self-play's two).
        widest_turn: the most rows of one turn (one batched generation): at most ``game.batch_size``.
        sequence: with ``game.history: sequence``, a seat's game as one token sequence: (its first prompt's tokens,
            the most tokens of the later observations of one seat in one game, the most answers of one seat in one
            game, the most sequences one learner holds); None otherwise.
    """

    prompt: int
    move: int
    learner_rows: int
    widest_turn: int
    sequence: tuple[int, int, int, int] | None = None


def game_lengths(config: TrainConfig, tokenizer: Any) -> GameLengths:
    """The lengths of ``config``'s game (its ``game`` section) that a run's memory depends on, measured: a batch of
    ``game.batch_size`` games (seeded by ``config.seed``) is played to its end with a random legal move for every
    seat, every prompt rendered as the learners read it and tokenized by ``tokenizer`` (the model's).

    Raises:
        ValueError: the config has no game section.
    """
    game = config.game
    if game is None:
        raise ValueError("game_lengths needs a config with a game section")
    import numpy as np

    from marllm.games.build import game_env
    from marllm.games.env.keys import DELTA, GAMES, LEGAL_MOVES, PROMPT
    from marllm.models.generation import encode_prompts
    from marllm.models.token_prompts import observation_ids

    env = game_env(game, game.batch_size, config.seed)
    env.reset(seed=config.seed)
    generator = np.random.default_rng(config.seed)
    prompts: set[str] = set()
    moves: set[str] = set()
    answers = dict.fromkeys(env.possible_agents, 0)
    widest = 0
    later: dict[tuple[str, int], list[int]] = {}  # per seat and game: its later observations' tokens, its answers
    firsts: set[str] = set()  # the first prompt of each seat's sequence of a game
    chat = config.generation.chat_template
    for _ in range(_GAME_STEPS):
        if not env.agents:
            break
        seat = env.agent_selection
        if env.terminations[seat] or env.truncations[seat]:
            env.step(None)
            continue
        observation = env.observe(seat)
        rows, legal = observation[PROMPT], observation[LEGAL_MOVES]
        prompts.update(rows)
        moves.update(name for names in legal for name in names)
        answers[seat] += len(rows)
        widest = max(widest, len(rows))
        for game_index, delta in zip(observation[GAMES], observation.get(DELTA, ()), strict=False):
            counts = later.setdefault((seat, int(game_index)), [0, 0])
            if counts[1]:
                counts[0] += len(observation_ids(tokenizer, delta, False, chat, True))
            else:
                firsts.add(delta)
            counts[1] += 1
        env.step(tuple(str(names[generator.integers(len(names))]) if names else "" for names in legal))
    encoded = encode_prompts(tokenizer, sorted(prompts), config.generation.chat_template, "marllm plan")
    move = max((len(tokenizer(name, add_special_tokens=False)["input_ids"]) for name in moves), default=1)
    held = {learner: 0 for learner in game.learner_ids}
    for seat in game.seats:
        if seat.is_learner:
            held[seat.learner] += 1
    # Seats rotate between slots (agents.role_period): a learner of k seats may answer in the k busiest.
    busiest = sorted(answers.values(), reverse=True)
    rows_of_learner = max((sum(busiest[:k]) for k in held.values()), default=0)
    longest = int(encoded["attention_mask"].sum(1).max())
    sequence = None
    if later:  # one token sequence per seat: its first prompt, then only its later observations and its answers
        first = int(encode_prompts(tokenizer, sorted(firsts), chat, "marllm plan")["attention_mask"].sum(1).max())
        sequences_of_learner = max(held.values(), default=1) * game.batch_size
        sequence = (first, max(c[0] for c in later.values()), max(c[1] for c in later.values()), sequences_of_learner)
    return GameLengths(longest, max(move, 1), max(rows_of_learner, 1), widest, sequence)


@dataclass(frozen=True)
class Workload:
    """The sizes a plan is made for (:func:`plan_memory` finds them).

    Attributes:
        batch: the rows of one rollout: ``env.batch_size``, or a game's widest turn (at most ``game.batch_size``).
        prompt: the longest prompt, in tokens.
        new_tokens: the longest response, in tokens.
        learner_rows: the rows one learner's update reads in an iteration, that its mini-batches are cut from.
        prompt_source: how ``prompt`` was found, as the plan prints it.
        generates: whether the rollout generates responses (not under ``game.actions: score``).
        snapshots: the copies of a learner's model that the ``snapshot_pool`` seats of a game keep.
    """

    batch: int
    prompt: int
    new_tokens: int
    learner_rows: int
    prompt_source: str
    generates: bool = True
    snapshots: int = 0


def plan_workload(config: TrainConfig, shape: ModelShape, path: str, prompt_length: int | None) -> Workload:
    """The batch, lengths and rows ``config`` trains on (see :class:`Workload`)."""
    new_tokens = config.generation.max_new_tokens
    game = config.game
    if game is None:
        batch = config.env.batch_size
        context = context_length(shape)
        if prompt_length is not None:
            prompt, source = prompt_length, "--prompt-tokens"
        else:
            prompt, source = prompt_tokens(config), "from the templates"
            if context is not None and context > new_tokens and prompt + new_tokens > context:
                # An estimate (characters per token, the longest query): a run's prompts must fit the context.
                prompt, source = context - new_tokens, "from the templates, capped at the model's context"
        workload = Workload(batch, prompt, new_tokens, batch, source)
    else:
        from marllm.models.policy import load_tokenizer
        from marllm.models.thought_moves import THOUGHT_END

        tokenizer = load_tokenizer(path, config.model.trust_remote_code)
        lengths = game_lengths(config, tokenizer)
        answer = game.actions.facts.answer
        if answer == "move":  # the longest legal move, then EOS
            new_tokens = lengths.move + 1
        elif answer == "thought, move":  # a thought, the marker, a move and EOS
            marker = len(tokenizer(THOUGHT_END, add_special_tokens=False)["input_ids"])
            new_tokens = config.generation.max_new_tokens + marker + lengths.move + 1
        elif answer == "nothing":  # each legal move scored after the prompt: nothing generated
            new_tokens = lengths.move
        if prompt_length is not None:
            prompt, source = prompt_length, "--prompt-tokens"
        else:
            prompt, source = lengths.prompt, f"measured on a batch of {game.batch_size} {game.name} games"
        # one pool per player, whatever the seats it plays: its size, the copies of the model it keeps
        pooled = [seat for seat in game.seats if seat.opponent is not None and seat.opponent.snapshots]
        snapshots = sum({seat.player_id: getattr(seat.settings, "size", 1) for seat in pooled}.values())
        rows = lengths.learner_rows
        if lengths.sequence is not None and prompt_length is None:
            # A row per seat's game: its first prompt, then its later observations and every answer as one response.
            first, observed, answers, rows = lengths.sequence
            prompt, new_tokens = first, observed + answers * new_tokens
            source = f"measured as one token sequence per seat on a batch of {game.batch_size} {game.name} games"
        workload = Workload(
            lengths.widest_turn, prompt, new_tokens, rows, source, generates=answer != "nothing", snapshots=snapshots,
        )  # fmt: skip
    _check_context(workload, context_length(shape), prompt_length is not None, game is not None)
    return workload


def _check_context(workload: Workload, context: int | None, given: bool, game: bool) -> None:
    """Refuse a prompt and response that do not fit in the model's ``context`` (a run would refuse them too)."""
    if context is None or workload.prompt + workload.new_tokens <= context:
        return
    prompt, new = workload.prompt, workload.new_tokens
    room = f"give --prompt-tokens {context - new} or less" if context > new else "lower generation.max_new_tokens"
    if given:
        raise ConfigError(
            f"--prompt-tokens {prompt}: with {new} new tokens (generation.max_new_tokens) a sequence of {prompt + new}"
            f" tokens exceeds the model context of {context} tokens; {room}"
        )
    if game:
        raise ConfigError(
            f"the game's prompts measure up to {prompt} tokens: with {new} new tokens a sequence of {prompt + new} "
            f"tokens exceeds the model context of {context} tokens, and a run would refuse it; shorten game.templates "
            "or lower generation.max_new_tokens"
        )
    raise ConfigError(
        f"generation.max_new_tokens {new} leaves no room for a prompt in the model context of {context} tokens; "
        f"lower it below {context}"
    )


def reward_model_parameters(config: TrainConfig, resolve: Callable[[str], str]) -> tuple[int, str]:
    """The parameters of the task's reward model, if it is a transformers classifier, and how they were counted."""
    if config.game is not None:
        return 0, "a game: its payoffs are the rewards"
    reward_model = getattr(config.task, "reward_model", None)
    if not reward_model:
        return 0, "the task has none"
    if reward_model.startswith("marllm:"):
        return 0, f"{reward_model}: an n-gram classifier, a few MiB, not counted"
    from pathlib import Path

    from marllm.assets.offline.sentiment_classifier import VOCABULARY_FILE
    from marllm.assets.references import check_model_reference

    check_model_reference(reward_model, "task.reward_model")
    directory = resolve(reward_model)
    if (Path(directory) / VOCABULARY_FILE).is_file():
        return 0, f"{reward_model}: an n-gram classifier, a few MiB, not counted"
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    with torch.device("meta"):
        classifier = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(directory))
    return sum(p.numel() for p in classifier.parameters()), f"{reward_model}, float32"


def processes_logits(config: TrainConfig) -> bool:
    """Whether the log-probs process the logits (:func:`~marllm.models.logits_processing.logprob_logits`): divide them
    by ``generation.temperature`` or apply every sampling processor, into float32 copies of half-precision logits."""
    if config.game is not None and "temperature" in config.game.actions.facts.ignores_sampling:  # scored moves
        return False
    generation = config.generation
    return generation.logprobs_from == "sampling" or generation.temperature != 1.0


def keeps_generate_logits(config: TrainConfig) -> bool:
    """Whether the rollout keeps generate's own logits (``ppo.compute.rollout_from_generate``, where the mode takes
    it)."""
    if config.game is not None and config.game.actions.facts.rollout_from_generate is not None:
        return False
    return bool(settled_compute(config).rollout_from_generate)


def settled_compute(config: TrainConfig) -> ComputeConfig:
    """``ppo.compute`` as a learner of the run will settle it: ``"auto"`` resolved by the placement ``model.fsdp``
    chooses (:meth:`~marllm.algorithms.ppo_sections.ComputeConfig.settled`)."""
    return config.ppo.compute.settled(Sharded if config.model.fsdp else Placement)


def multiplies_in_float32(dtype: str, device: str) -> bool:
    """Whether a model in ``dtype`` multiplies in float32 on ``device`` (:mod:`marllm.models.float32_products`: a
    bfloat16 model on a CPU without bfloat16 matrix instructions, as this one is or not): each product, the LM head's
    logits among them, is made in float32 before it is rounded to bfloat16."""
    import torch

    from marllm.models.devices import resolve_dtype
    from marllm.models.float32_products import needs_float32_products

    return device == "cpu" and needs_float32_products(resolve_dtype(dtype), torch.device("cpu"))


def logit_bytes(
    config: TrainConfig, device: str, dtype: str | None = None, processed: bool = True, inplace: bool = False
) -> tuple[int, int]:
    """Bytes per logit of a forward's logits in ``dtype`` (None: the policy's) while the log-softmax reads them (with
    what else is kept of them then), and at their peak: the LM head's float32 product of a bfloat16 model on a CPU
    without bfloat16 instructions; where the log-probs process them (``processed`` and ``generation.temperature`` not
    1 or ``generation.logprobs_from: sampling``), half-precision logits beside their float32 copy, and (not
    ``inplace``: with gradient) the processed result beside both
    (:func:`~marllm.models.logits_processing.logprob_logits`)."""
    dtype = dtype or config.model.dtype
    own = bytes_per_element(config.ppo.compute.autocast_dtype or dtype)
    peak = own + 4 if own < 4 and multiplies_in_float32(dtype, device) else own
    if not (processed and processes_logits(config)):
        return own, peak
    copies = 4 if inplace else 8
    # With gradient, the sampling processors keep their float32 input for the backward beside their output.
    steady = 8 if config.generation.logprobs_from == "sampling" and not inplace else 4
    return steady, max(peak, own + copies if own < 4 else copies)
