"""LLM agents in games: any AEC game, played B copies at a time as one text env, and the players that sit at it.

``BatchedGameEnv`` (also ``raw_env``; ``env(**kwargs)`` adds the order-enforcing wrapper) plays a PettingZoo classic
game, an OpenSpiel game (``openspiel_factory("kuhn_poker")``, through shimmy) or a user's own AEC env. Views render
each game for a seat; parsers read an answer's move. The players that sit at it (learners, and opponents that do not
learn) are in :mod:`marllm.games.players`. OpenSpiel and shimmy are optional: ``pip install 'marllm[games]'``.
"""

from marllm.games.env.batched_env import BatchedGameEnv, env, raw_env
from marllm.games.env.openspiel import OpenSpielView, openspiel_env, openspiel_factory, require_openspiel
from marllm.games.env.parsers import PARSERS, Parser, exact_move, first_legal_move, get_parser, register_parser
from marllm.games.env.view_lookup import view_for
from marllm.games.env.views import GameView, Move, game_name, register_view

__all__ = [
    "PARSERS",
    "BatchedGameEnv",
    "GameView",
    "Move",
    "OpenSpielView",
    "Parser",
    "env",
    "exact_move",
    "first_legal_move",
    "game_name",
    "get_parser",
    "openspiel_env",
    "openspiel_factory",
    "raw_env",
    "register_parser",
    "register_view",
    "require_openspiel",
    "view_for",
]
