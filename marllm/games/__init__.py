"""Games: the whole game feature in one package, in the layers of the rest of marllm (imports go down them).

- :mod:`marllm.games.env`: B copies of any AEC game as one batched text env (views, parsers, prompts, credit, the
  per-seat results that leave through the AEC ``infos``), OpenSpiel's games through shimmy (the library layer).
- :mod:`marllm.games.players`: the opponents that do not learn (random, minimax, MCTS, CFR, a best response, snapshot
  pools); :mod:`marllm.games.check`: ``check_game_env``, the public check of a game of one's own.
- :mod:`marllm.games.settings` and :mod:`marllm.games.opponents`: the ``game`` section of a config, its seats and the
  opponents a seat names.
- :mod:`marllm.games.build`, :mod:`marllm.games.seats`, :mod:`marllm.games.model_player`,
  :mod:`marllm.games.strategy`, :mod:`marllm.games.exploitability`, :mod:`marllm.games.average_policy`: a config's
  game built, its seats filled, a model playing as ``game.actions`` says, its strategy tabulated exactly and
  its exploitability.
- :mod:`marllm.games.training`, :mod:`marllm.games.evaluation`, :mod:`marllm.games.report`,
  :mod:`marllm.games.study`: a game run's env chain and metrics, ``marllm eval`` of a game, and its rows in run and
  study reports.

This module imports nothing, so that each layer's part loads without the ones above it.
"""
