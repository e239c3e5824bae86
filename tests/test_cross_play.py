"""Cross-play: every model in every role beside every partner, played through the sequential text env."""

import pytest
import torch

from marllm.envs.text_env import SequentialTextEnv
from marllm.evaluation.cross_play import ALONE, checkpoint_label, cross_play, expand_checkpoints

QUERIES = [{"query": "a good day"}, {"query": "a day"}]


def count_good(samples, responses):
    return [response.split().count("good") for response in responses]


def scripted_models():
    """echo says "good" when its prompt holds "good"; optimist always "good good"; pessimist always "bad"."""
    return {
        "echo": lambda prompts: ["good" if "good" in p else "bad" for p in prompts],
        "optimist": lambda prompts: ["good good"] * len(prompts),
        "pessimist": lambda prompts: ["bad"] * len(prompts),
    }


def make_env(roles, templates):
    return SequentialTextEnv(QUERIES, roles, templates, count_good, batch_size=len(QUERIES))


def counting_loader(models):
    loads = {name: 0 for name in models}

    def load(name):
        loads[name] += 1
        return models[name]

    return load, loads


def test_two_roles_give_the_alone_row_and_one_row_per_partner():
    models = scripted_models()
    load, loads = counting_loader(models)
    env = make_env(["pioneer", "observer"], {"pioneer": "{query}", "observer": "{query} after {pioneer}"})
    result = cross_play(env, list(models), load, progress=False)

    assert result.rows() == [ALONE, "observer after echo", "observer after optimist", "observer after pessimist"]
    expected = {
        # alone: echo sees "good" in the first query only
        ALONE: {"echo": 0.5, "optimist": 2.0, "pessimist": 0.0},
        # after echo: the first prompt holds the query's "good" and echo's "good"; the second neither
        "observer after echo": {"echo": 0.5, "optimist": 2.0, "pessimist": 0.0},
        # after optimist: every prompt holds "good good", so echo says "good" both times
        "observer after optimist": {"echo": 1.0, "optimist": 2.0, "pessimist": 0.0},
        "observer after pessimist": {"echo": 0.5, "optimist": 2.0, "pessimist": 0.0},
    }
    for row, by_model in expected.items():
        for model, value in by_model.items():
            assert result.cell(row, model).task_reward == pytest.approx(value), (row, model)
    # each model is loaded once to play every role itself and once to answer after the others
    assert loads == {"echo": 2, "optimist": 2, "pessimist": 2}
    assert len(result.cells) == 12 and result.num_queries == 2
    assert result.cell(ALONE, "echo").standard_error == pytest.approx(0.5)  # std [1, 0] = 0.707, / sqrt(2)
    table = result.to_markdown().splitlines()
    assert table[0] == "| | echo | optimist | pessimist |" and table[2].startswith("| alone | 0.500 (0.500) |")
    cells = result.to_dict()["cells"]
    assert cells[0] == {
        "row": ALONE,
        "role": "pioneer",
        "partner": None,
        "model": "echo",
        "task_reward": 0.5,
        "standard_error": pytest.approx(0.5),
        "rewards": [1.0, 0.0],
    }
    # echo after optimist: [1, 1] against [1, 0] alone, a gain of 0.5 with differences [0, 1]
    gain = result.gain("observer after optimist", "echo")
    assert gain.mean == pytest.approx(0.5) and gain.n == 2 and gain.low < 0.5 < gain.high
    assert result.gain("observer after echo", "optimist").mean == 0.0
    assert "| observer after optimist | +0.500 [" in result.to_markdown()


def test_a_later_role_reads_the_partner_in_every_earlier_role():
    models = scripted_models()
    load, _ = counting_loader(models)
    # the critic reads only the drafter: echo as critic says "good" only when the drafter did
    env = make_env(
        ["drafter", "editor", "critic"], {"drafter": "{query}", "editor": "{query} {drafter}", "critic": "{drafter}"}
    )
    result = cross_play(env, list(models), load, progress=False)
    assert len(result.rows()) == 1 + 2 * 3 and len(result.cells) == 3 * 7
    assert result.cell("critic after optimist", "echo").task_reward == pytest.approx(1.0)
    assert result.cell("critic after pessimist", "echo").task_reward == pytest.approx(0.0)
    assert result.cell("critic after echo", "echo").task_reward == pytest.approx(0.5)
    assert result.cell("editor after pessimist", "echo").task_reward == pytest.approx(0.5)


def test_every_generation_starts_from_the_same_seed():
    """Two identical random models give identical cells: a row differs only by the model."""

    def coin(prompts):
        return ["good" if torch.rand(()).item() < 0.5 else "bad" for _ in prompts]

    env = make_env(["pioneer", "observer"], ["{query}", "{pioneer}"])
    result = cross_play(env, ["coin_a", "coin_b"], lambda name: coin, seed=3, progress=False)
    for row in result.rows()[:1] + ["observer after coin_a"]:
        assert result.cell(row, "coin_a").task_reward == result.cell(row, "coin_b").task_reward


def test_model_names_are_checked():
    env = make_env(["pioneer"], ["{query}"])
    with pytest.raises(ValueError, match="at least one model"):
        cross_play(env, [], lambda name: None, progress=False)
    with pytest.raises(ValueError, match=r"distinct names; \['a'\] appear twice"):
        cross_play(env, ["a", "b", "a"], lambda name: None, progress=False)
    single = cross_play(env, ["optimist"], lambda name: scripted_models()[name], progress=False)
    assert single.rows() == [ALONE] and single.cell(ALONE, "optimist").task_reward == 2.0


def test_checkpoints_expand_runs_into_their_learners(tmp_path):
    run = tmp_path / "cory"
    for learner in ("llm2", "llm1"):
        (run / "checkpoints" / learner / "policy").mkdir(parents=True)
    lone = tmp_path / "elsewhere" / "learner"
    lone.mkdir(parents=True)
    expanded = expand_checkpoints(["base", str(run), str(lone)])
    assert expanded == ["base", str(run / "checkpoints" / "llm1"), str(run / "checkpoints" / "llm2"), str(lone)]
    assert [checkpoint_label(p) for p in expanded] == ["base", "cory/llm1", "cory/llm2", str(lone)]
    with pytest.raises(FileNotFoundError, match="neither 'base', a run directory"):
        expand_checkpoints([str(tmp_path / "missing")])
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no saved learner"):
        expand_checkpoints([str(empty)])
