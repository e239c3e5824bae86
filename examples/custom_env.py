"""A custom 3-agent text task on marllm's public API: a drafter, a reviewer and an editor write in turn.

Each agent is rewarded for upbeat words in its own text; SharedReward makes the game cooperative and RolePermutation
rotates the three learners through the three roles every 2 iterations.
    python examples/custom_env.py [MODEL] [ITERATIONS]      (MODEL defaults to the offline base model)
"""

import sys

from marllm.algorithms import GenerationConfig, PPOConfig
from marllm.assets import resolve_model
from marllm.envs.text_env import env as text_env
from marllm.train import make_learners, run_iteration
from marllm.wrappers import RolePermutation, SharedReward

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
    env = text_env(dataset=queries, roles=list(TEMPLATES), templates=TEMPLATES, reward_fn=upbeat_reward, batch_size=4)
    env = RolePermutation(SharedReward(env), period=2, learners=["ann", "bob", "cid"])
    ppo = PPOConfig(mini_batch_size=4, learning_rate=1e-4, init_kl_coef=0.1)
    learners, _ = make_learners(resolve_model(model), env.possible_agents, ppo, GenerationConfig(4, 8))
    return [run_iteration(env, learners, seed=0 if i == 0 else None)[0] for i in range(iterations)]


if __name__ == "__main__":
    for metrics in main(*sys.argv[1:2], *map(int, sys.argv[2:3])):
        print({k: v for k, v in metrics.items() if k.endswith(("/role", "/task_reward", "/kl"))})
