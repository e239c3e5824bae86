"""Which view shows a game: :func:`view_for`, over the views registered in :mod:`marllm.games.env.views` by the
built-in view modules (imported here, so that they have registered before any lookup) and by users."""

from __future__ import annotations

from pettingzoo import AECEnv

from marllm.games.env import board_views, dice_views, matrix_views, openspiel, poker_views
from marllm.games.env.views import FALLBACKS, MATCHERS, VIEWS, GameView, game_name

BUILTIN_VIEW_MODULES = (board_views, dice_views, matrix_views, poker_views, openspiel)
"""The modules whose import registers marllm's own views (named games, the matrix family, OpenSpiel's fallback)."""


def view_for(game: AECEnv) -> GameView:
    """The registered view of the game, else its kind's generic view (OpenSpiel's), else the PettingZoo one."""
    name = game_name(game)
    if name in VIEWS:
        return VIEWS[name]
    for matches, view in MATCHERS:
        if matches(name):
            return view
    for matches_game, view in FALLBACKS:
        if matches_game(game):
            return view
    return GameView()
