"""A config's game, as training and evaluation both play it: the batched env and the fixed players
(:mod:`~marllm.games.parts`), who sits in which seat (:mod:`~marllm.games.seats`), a model playing as
``game.actions.mode`` says (:mod:`~marllm.games.model_player`), the exact tabulation of its strategy and its
exploitability (:mod:`~marllm.games.strategy`, :mod:`~marllm.games.exploitability`) and the average policy
(:mod:`~marllm.games.average_policy`).

The game env itself is :mod:`marllm.envs.games` (the library); this layer binds it to a config's ``game`` section.
"""
