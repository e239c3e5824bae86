"""The keys under which :class:`~marllm.envs.SequentialTextEnv` reports per-dialogue values in ``infos[role]``.

Reward wrappers rewrite the *batch* entries (what a role is trained on) and never the *task* entries (what its own
responses scored). The *turn* entries hold one row per turn of the role, in speaking order.
"""

QUERIES = "queries"
"""(B,) the query of each dialogue of the episode, as a tuple; in every role's info from ``reset`` on."""

TASK_REWARDS = "task_rewards"
"""(B,) the task reward of the role's last response in each dialogue."""

BATCH_REWARDS = "batch_rewards"
"""(B,) the reward the role is trained on, per dialogue (the task reward until a wrapper mixes it)."""

TURN_TASK_REWARDS = "turn_task_rewards"
"""(T, B) the role's own task reward credited to each of its T turns (see the env's ``turn_rewards``)."""

TURN_BATCH_REWARDS = "turn_batch_rewards"
"""(T, B) the reward each of the role's turns is trained on."""

TURN_GAMES = "turn_games"
"""Per turn of the role, the indices of the dialogues its rows of ``turn_*`` cover, where a turn covers only some of
the batch (a batched game: a seat moves only in the games where it is to move); absent: every turn covers all B."""

TURN_DISCOUNTS = "turn_discounts"
"""Per turn of the role, the discount γ^k its ``turn_batch_rewards`` row applied to each dialogue's return (k: the
role's later turns in that dialogue); absent: no discount (1 everywhere)."""
