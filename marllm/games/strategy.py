"""A model's strategy in a config's game, measured exactly: what ``marllm eval --exploitability``, the ``best_response``
seat and the training metric ``<learner>/game/exploitability`` run (:mod:`marllm.games.exploitability`).

A model's policy is tabulated with the config's prompts (``game.templates``), parser and illegal-answer policy. A
player or learner with ``move_probabilities(prompts, legal_moves)`` under an action mode with exact move
probabilities (:attr:`~marllm.algorithms.action_modes.ActionMode.exact_policy`: ``score``, ``constrained``) is
tabulated exactly; otherwise the model answers the mode's ``exploitability_samples`` times per information
state with the config's generation settings (the ``generate`` mode) and its answers' frequencies are tabulated. A
learner is sampled in eval mode (no dropout) from the global torch generator, so a run that measures draws other
samples afterwards than one that does not (each is still reproducible from its seed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from marllm.algorithms.action_registry import action_mode
from marllm.algorithms.actions import Collector
from marllm.games.average_policy import AveragePolicy
from marllm.games.exploitability import ExactGame, ExactProbabilities, PolicySource, SampledFrequencies, answers_of
from marllm.games.model_player import ModelPlayer
from marllm.games.settings import GameConfig


def exact_game(game: GameConfig) -> ExactGame:
    """The :class:`ExactGame` of a config's game (its prompts); ``ValueError`` if it is not a small OpenSpiel game."""
    if game.info.openspiel is None:
        raise ValueError(
            f"exact evaluation needs an OpenSpiel game (openspiel:<game string>, e.g. openspiel:kuhn_poker) whose "
            f"information states can be enumerated; {game.name} is a PettingZoo game"
        )
    return ExactGame(game.info.openspiel, templates=game.templates)


def game_policy_source(game: GameConfig, player: Any, batch_size: int = 256) -> PolicySource:
    """The policy source of ``player``: exact (without gradients) where ``game.actions`` is ``score`` or
    ``constrained`` and the player has ``move_probabilities``, else the frequencies of its answers
    (:class:`~marllm.games.exploitability.SampledFrequencies`) with the config's parser, illegal-answer policy and
    ``exploitability_samples``."""
    probabilities = getattr(player, "move_probabilities", None)
    if game.actions.facts.exact_policy is not None and callable(probabilities):
        return ExactProbabilities(torch.no_grad()(probabilities))
    samples = game.actions.exploitability_samples
    return SampledFrequencies(answers_of(player), game.parser, samples, game.illegal, batch_size)


class LearnerAnswers(ModelPlayer):
    """A learner's model answering with ``generation``'s settings, in eval mode, its adapter active: through the
    learner's own collector where it has one of ``actions`` with those settings (its autocast included, as in
    training), else through a collector of its own on the learner's model."""

    def __init__(
        self, name: str, learner: Any, generation: Any, actions: str = "generate", normalization: str | None = None
    ):
        own = getattr(learner, "collector", None)
        same_mode = isinstance(own, Collector) and own.actions == action_mode(actions).actions
        fits = same_mode and own.generation == generation
        collector = own if fits else None
        super().__init__(name, learner.model, learner.tokenizer, generation, actions, normalization, collector)
        self.learner = learner

    def answer(self, observation: Mapping[str, Sequence[Any]]) -> tuple[str, ...]:
        self.learner.activate()
        training = self.model.training
        self.model.eval()
        try:
            return super().answer(observation)
        finally:
            self.model.train(training)


def learner_player(game: GameConfig, generation: Any, name: str, learner: Any) -> Any:
    """What tabulates a learner: itself where its ``move_probabilities`` are exact (``score``, ``constrained``), else
    :class:`LearnerAnswers` (sampled with ``generation``)."""
    if game.actions.facts.exact_policy is not None and callable(getattr(learner, "move_probabilities", None)):
        return learner
    return LearnerAnswers(name, learner, generation, game.actions.mode, game.actions.normalization)


def learner_policy(game: GameConfig, generation: Any, name: str, learner: Any) -> Callable[[], Any]:
    """A zero-argument callable giving the learner's current ``TabularPolicy`` (what a ``best_response`` seat reads)."""
    exact = exact_game(game)
    player = learner_player(game, generation, name, learner)
    return lambda: exact.tabulate(game_policy_source(game, player))


class ExploitabilityMetrics:
    """An iteration's metrics hook that adds, every ``game.exploitability.every`` iterations (counting from
    1, read from the metrics' ``iteration``), ``<learner>/game/nash_conv``, ``<learner>/game/exploitability`` (NaN
    where the game is not two-player zero-sum) and, for a sampled policy,
    ``<learner>/game/exploitability_illegal_rate``; and the same of the average of the policies measured so far
    (:class:`~marllm.games.average_policy.AveragePolicy`: what self-play converges to where its last iterate cycles;
    weighted by ``game.exploitability.average``),
    ``<learner>/game/nash_conv_average`` and ``<learner>/game/exploitability_average``. The averages are saved and
    restored with the run's checkpoints."""

    def __init__(self, game: GameConfig, generation: Any, learners: Mapping[str, Any], inner: Callable[..., dict]):
        if game.exploitability is None:
            raise ValueError("ExploitabilityMetrics measures what game.exploitability asks; it is null")
        self.every, self.inner, self.game = game.exploitability.every, inner, game
        self.exact = exact_game(game)
        self.players = {name: learner_player(game, generation, name, learners[name]) for name in game.learner_ids}
        self.averages = {name: AveragePolicy(self.exact.tree, game.exploitability.average) for name in self.players}

    def __call__(self, metrics: dict[str, Any], final_infos: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        merged = self.inner(metrics, final_infos)
        iteration = metrics.get("iteration")
        if iteration is None or (int(iteration) + 1) % self.every:
            return merged
        for name, player in self.players.items():
            source = game_policy_source(self.game, player)
            policy = self.exact.tabulate(source)
            report = self.exact.measure(policy, source)
            self.averages[name].add(policy)
            average = self.exact.measure(self.averages[name].policy())
            for suffix, measured in (("", report), ("_average", average)):
                merged[f"{name}/game/nash_conv{suffix}"] = measured.nash_conv
                exploit = measured.exploitability
                merged[f"{name}/game/exploitability{suffix}"] = math.nan if exploit is None else exploit
            if report.illegal_rate is not None:
                merged[f"{name}/game/exploitability_illegal_rate"] = report.illegal_rate
        return merged

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Each learner's average policy (its running sums), as a checkpoint saves them."""
        tensors, meta = {}, {}
        for name, average in self.averages.items():
            sums, meta[name] = average.state_dict()
            tensors.update({f"{name}/{key}": value for key, value in sums.items()})
        return tensors, meta

    def load_state_dict(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` gave; ``ValueError`` if it holds other learners' averages."""
        if sorted(meta) != sorted(self.averages):
            raise ValueError(
                f"the saved average policies are of learners {sorted(meta)}, this run's {sorted(self.averages)}"
            )
        for name, average in self.averages.items():
            prefix = f"{name}/"
            average.load_state_dict(
                {key.removeprefix(prefix): value for key, value in tensors.items() if key.startswith(prefix)},
                meta[name],
            )
