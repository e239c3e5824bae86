"""A custom 3-agent text task on marllm's public API: a drafter, a reviewer and an editor write in turn.

Each agent is rewarded for upbeat words in its own text; SharedReward makes the game cooperative and RolePermutation
rotates the three learners through the three roles every 2 iterations.
    python examples/custom_env.py [MODEL] [ITERATIONS]      (MODEL defaults to the offline base model)
"""

import sys

from marllm import GenerationConfig, PPOConfig, RolePermutation, SharedReward, make_learners, run_iteration
from marllm.algorithms import BatchingConfig, KLConfig, OptimiserConfig
from marllm.envs import env as text_env

UPBEAT = {"good", "great", "fun", "best", "love", "wonderful", "beautiful", "enjoy"}
TEMPLATES = {
    "drafter": "{query}",
    "reviewer": "A draft: {query}{drafter}\nA kinder version: {query}",
    "editor": "Draft: {query}{drafter}\nReview: {query}{reviewer}\nFinal: {query}",
}


def upbeat_reward(samples: list[dict], responses: list[str]) -> list[float]:
    return [sum(word.strip(".,!").lower() in UPBEAT for word in text.split()) for text in responses]


def main(model: str = "marllm:offline-base", iterations: int = 4) -> list[dict]:
    queries = [{"query": q} for q in ["The film", "This movie is", "I watched it and", "The actors were"]]
    env = text_env(
        dataset=queries, roles=list(TEMPLATES), templates=TEMPLATES, reward_fn=upbeat_reward, batch_size=4, seed=0
    )
    env = RolePermutation(SharedReward(env), period=2, learners=["ann", "bob", "cid"])
    ppo = PPOConfig(
        optimiser=OptimiserConfig(learning_rate=1e-4),
        batching=BatchingConfig(mini_batch_size=4),
        kl=KLConfig(init_kl_coef=0.1),
    )
    learners, _ = make_learners(model, env.possible_agents, ppo, GenerationConfig(4, 8), seed=0)
    return [run_iteration(env, learners)[0] for _ in range(iterations)]


if __name__ == "__main__":
    for metrics in main(*sys.argv[1:2], *map(int, sys.argv[2:3])):
        print({k: v for k, v in metrics.items() if k.endswith(("/role", "/task_reward", "/kl"))})
