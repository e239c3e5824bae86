"""Concurrent updates (``agents.devices``, learners on distinct devices) with real learners: two tiny GPT-2
learners on the CPU, updated at once, one thread each, end with the parameters and metrics of sequential updates."""

from __future__ import annotations

import threading

import numpy as np
import torch

from marllm.algorithms import CriticFreeLearner, GenerationConfig, PPOConfig, PPOLearner
from marllm.envs.text_env import env as text_env
from marllm.loop import run_iteration
from tests.conftest import make_tiny_gpt2

ITERATIONS = 2  # the second update starts from the first's parameters and Adam state


def learners(tokenizer) -> dict[str, PPOLearner]:
    """A PPO pioneer and a GRPO observer (groups of 2), of different seeds, each with its own policy and reference."""
    found = {}
    for seed, name in enumerate(("pioneer", "observer")):
        reference = make_tiny_gpt2(tokenizer, seed=seed).requires_grad_(False).eval()
        config = PPOConfig.from_flat(
            mini_batch_size=2, ppo_epochs=2, learning_rate=3e-3, kl_control="fixed", init_kl_coef=0.05
        )
        kwargs = {"algorithm": "grpo", "group_size": 2} if name == "observer" else {}
        learner_class = CriticFreeLearner if kwargs else PPOLearner
        found[name] = learner_class(
            name,
            model=make_tiny_gpt2(tokenizer, seed=seed),
            tokenizer=tokenizer,
            reference=reference,
            config=config,
            generation=GenerationConfig(3, 6),
            seed=seed,
            **kwargs,
        )
    return found


def trained(tokenizer, concurrent: bool) -> tuple[list[dict], dict[str, list[torch.Tensor]], dict[str, list[str]]]:
    """``ITERATIONS`` iterations of CORY-like turns; the metrics (without timings), each learner's trained
    parameters (policy and value head), and the threads each learner's updates ran in."""
    env = text_env(
        dataset=[{"query": q} for q in ("this movie was", "the story is", "i hated the", "what a")],
        roles=["pioneer", "observer"],
        templates={"pioneer": "{query}", "observer": "{query} {pioneer}"},
        reward_fn=lambda samples, responses: [r.count("e") / (1.0 + len(r)) + 0.1 * i for i, r in enumerate(responses)],
        batch_size=4,
        seed=0,
        group_size=2,
    )
    agents = learners(tokenizer)
    threads: dict[str, list[str]] = {name: [] for name in agents}
    for name, learner in agents.items():
        learner.update = recording_thread(learner.update, threads[name])
    torch.manual_seed(0)
    history = []
    for iteration in range(ITERATIONS):
        metrics, _ = run_iteration(env, agents, seed=iteration, concurrent_updates=concurrent)
        history.append({key: value for key, value in metrics.items() if not key.startswith("time/")})
    parameters = {
        name: [p.detach().clone() for group in learner.optimizer.param_groups for p in group["params"]]
        for name, learner in agents.items()
    }
    return history, parameters, threads


def recording_thread(update, names: list[str]):
    def update_and_record():
        names.append(threading.current_thread().name)
        return update()

    return update_and_record


def test_concurrent_updates_of_real_learners_end_where_sequential_updates_do(tokenizer):
    start = {
        name: [p.detach().clone() for p in learner.model.parameters()] for name, learner in learners(tokenizer).items()
    }
    sequential, after_sequential, sequential_threads = trained(tokenizer, concurrent=False)
    concurrent, after_concurrent, concurrent_threads = trained(tokenizer, concurrent=True)

    assert sequential_threads == {name: ["MainThread"] * ITERATIONS for name in ("pioneer", "observer")}
    for pioneer, observer in zip(concurrent_threads["pioneer"], concurrent_threads["observer"], strict=True):
        # at each iteration, the two updates in two threads of the loop's update pool
        assert pioneer.startswith("marllm-update") and observer.startswith("marllm-update") and pioneer != observer

    for name in ("pioneer", "observer"):
        policy = after_sequential[name][: len(start[name])]
        moved = max((a - b).abs().max().item() for a, b in zip(policy, start[name], strict=True))
        assert moved > 1e-3, name  # trained, far beyond the tolerance below
        # Both runs are in this process on this CPU: only the threads' summation order can differ, far below these.
        for a, b in zip(after_concurrent[name], after_sequential[name], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert [set(m) for m in concurrent] == [set(m) for m in sequential]
    for seq, con in zip(sequential, concurrent, strict=True):
        for key, value in seq.items():
            if isinstance(value, str):
                assert con[key] == value, key
            else:
                np.testing.assert_allclose(con[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
