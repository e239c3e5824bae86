"""The keys under which :class:`~marllm.games.env.BatchedGameEnv` reports per-game values.

Observation keys hold one entry per game in which the seat moves now (the rows of the move), in row order; the
per-dialogue reward keys of :mod:`marllm.envs.info_keys` (``task_rewards``, ``batch_rewards``, ``turn_*``) are filled
at the end of the episode as the text env fills them, with one difference: a seat's turn covers only the games in
which it moved, so each row of ``turn_task_rewards`` / ``turn_batch_rewards`` is as long as that turn's observation.
"""

from marllm.envs import info_keys

PROMPT = "prompt"
"""Observation: (rows,) the prompt of each game in which the seat moves now."""

LEGAL_MOVES = "legal_moves"
"""Observation: (rows,) per game, the names of the legal moves (a tuple of str), in the order the prompt lists them."""

LEGAL_ACTIONS = "legal_actions"
"""Observation: (rows,) per game, the underlying game's action ids of those moves (a tuple of int)."""

HISTORY = "history"
"""Observation: (rows,) per game, the game's history as its view reports it (a tuple of int): for OpenSpiel games
``state.history()`` (chance outcomes included: the full state, for scripted bots), otherwise the action ids played."""

DELTA = "delta"
"""Observation, with ``history="sequence"``: (rows,) per game, what the seat reads now as the next part of its one
token sequence of that game: its whole prompt at its first answer, then only what is new since its last answer
(:meth:`~marllm.games.env.GameView.delta`)."""

GAMES = "games"
"""Observation: (rows,) the index of each game in the batch."""

ACTION_MASK = "action_mask"
"""Info: (B,) int8, 1 for the games in which the seat moves now; ``action_space(seat).sample(mask)`` samples one
answer per marked game (what PettingZoo's API test does with a mask)."""

TURN_GAMES = info_keys.TURN_GAMES
"""Info at the end: per turn of the seat, the indices of the games it moved in (the rows of that turn's rewards)."""

PAYOFFS = "payoffs"
"""Info at the end: (B,) the seat's payoff in each game (also under ``task_rewards``)."""

OUTCOMES = "outcomes"
"""Info at the end: (B,) int8, +1 win, 0 draw, -1 loss for the seat in each game."""

METRICS = "metrics"
"""Info at the end: the seat's episode metrics (payoff, win_rate, draw_rate, loss_rate, illegal_move_rate,
moves_per_game, game_length, forfeit_rate, capped_rate (games ended as draws at the move cap); and in a game whose
view names a cooperative move, cooperation_rate over the seat's own legal answers (not the moves played for its illegal
ones; absent in a batch where it gave none) and legal_answers, their count per batch), floats."""
