"""SequentialTextEnv: the PettingZoo API over every option, episode semantics, and errors on bad input."""

from __future__ import annotations

import itertools
import math
import warnings

import datasets
import numpy as np
import pytest
from pettingzoo.test import api_test, seed_test
from pettingzoo.utils.wrappers import OrderEnforcingWrapper

from marllm.envs.text_env import RewardFunctionError, SequentialTextEnv, env

# api_test recommends Box/Discrete spaces and numpy observations; text agents have neither, by design.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:pettingzoo.test.api_test")

ROWS = [{"query": f"query {i}", "label": i % 2} for i in range(7)]
ROLES = ["pioneer", "observer", "critic"]
STRING_TEMPLATES = {
    "pioneer": "{query}",
    "observer": "Q: {query} A: {pioneer}",
    "critic": "{query} | {pioneer} | {observer} ({label})",
}


def callable_template(role: str):
    """A template function equivalent to ``STRING_TEMPLATES[role]``."""

    def render(sample, responses):
        fields = {**sample, **responses}
        return STRING_TEMPLATES[role].format(**fields)

    return render


def length_reward(samples, responses):
    return [len(r) for r in responses]


def make(roles=("pioneer", "observer"), rows=ROWS, batch_size=3, templates=None, reward_fn=length_reward, **kw):
    templates = {r: STRING_TEMPLATES[r] for r in roles} if templates is None else templates
    return SequentialTextEnv(
        dataset=rows, roles=list(roles), templates=templates, reward_fn=reward_fn, batch_size=batch_size, **kw
    )


def queries(environment) -> list[str]:
    return [s["query"] for s in environment.unwrapped.samples]


# --- the PettingZoo API over every combination of options ------------------------------------------------------

COMBINATIONS = list(
    itertools.product(
        [1, 2, 3],  # roles
        [1, 3],  # batch size
        ["list", "dataset"],  # data
        ["str", "callable"],  # templates
        ["factory", "raw"],  # env() with the order-enforcing wrapper, or the bare class
        [None, "ansi"],  # render_mode
    )
)


def build_combination(num_roles, batch_size, data, template_kind, wrapping, render_mode):
    roles = ROLES[:num_roles]
    rows = ROWS if data == "list" else datasets.Dataset.from_list(ROWS)
    if template_kind == "str":
        templates = {r: STRING_TEMPLATES[r] for r in roles}
    else:
        templates = [callable_template(r) for r in roles]
    kwargs = dict(
        dataset=rows,
        roles=roles,
        templates=templates,
        reward_fn=length_reward,
        batch_size=batch_size,
        render_mode=render_mode,
    )
    return (env if wrapping == "factory" else SequentialTextEnv)(**kwargs), kwargs


@pytest.mark.parametrize(
    "num_roles,batch_size,data,template_kind,wrapping,render_mode",
    COMBINATIONS,
    ids=["-".join(str(x) for x in combo) for combo in COMBINATIONS],
)
def test_api(num_roles, batch_size, data, template_kind, wrapping, render_mode):
    environment, kwargs = build_combination(num_roles, batch_size, data, template_kind, wrapping, render_mode)
    assert isinstance(environment, OrderEnforcingWrapper) == (wrapping == "factory")
    api_test(environment, num_cycles=5)
    # the same seed and the same (seeded) random actions replay the same episode
    seed_test(lambda: env(**kwargs), num_cycles=5)
    rendered = environment.render()
    if render_mode is None:
        assert rendered is None
    else:
        assert rendered.startswith(f"query: {environment.unwrapped.samples[0]['query']!r}")


# --- episode semantics -----------------------------------------------------------------------------------------


def scripted_response(role: str, prompt: str) -> str:
    """A response that depends on the role and the prompt, so that every string below is checkable."""
    return f"<{role[0]}:{len(prompt)}>"


def test_roles_act_in_order_once_and_prompts_are_rendered_from_sample_and_earlier_responses():
    calls = []

    def reward_fn(samples, responses):
        calls.append(([dict(s) for s in samples], list(responses)))
        return [len(r) + s["label"] for s, r in zip(samples, responses, strict=True)]

    environment = env(dataset=ROWS, roles=ROLES, templates=STRING_TEMPLATES, reward_fn=reward_fn, batch_size=3)
    environment.reset(seed=0)
    samples = [dict(s) for s in environment.unwrapped.samples]
    assert len(samples) == 3 and all(s in ROWS for s in samples)

    # before its turn, a role observes empty prompts
    assert environment.observe("observer") == {"prompt": ("", "", "")}
    # from reset on, every role's info names its role and the batch's queries
    assert environment.infos == {role: {"role": role, "queries": tuple(queries(environment))} for role in ROLES}

    acted, finished = [], {}
    for agent in environment.agent_iter():
        observation, reward, terminated, truncated, info = environment.last()
        if terminated or truncated:
            finished[agent] = (reward, info)
            environment.step(None)
            continue
        acted.append(agent)
        assert reward == 0.0 and not any(environment.terminations.values())
        prompts = observation["prompt"]
        environment.step(tuple(scripted_response(agent, p) for p in prompts))
    assert acted == ROLES
    assert list(finished) == ROLES  # dead steps come in role order too
    assert environment.agents == []

    env_state = environment.unwrapped
    for i, sample in enumerate(samples):
        q = sample["query"]
        pioneer = f"<p:{len(q)}>"
        observer_prompt = f"Q: {q} A: {pioneer}"
        observer = f"<o:{len(observer_prompt)}>"
        critic_prompt = f"{q} | {pioneer} | {observer} ({sample['label']})"
        assert env_state.prompts["pioneer"][i] == q
        assert env_state.prompts["observer"][i] == observer_prompt
        assert env_state.prompts["critic"][i] == critic_prompt
        assert env_state.responses["critic"][i] == f"<c:{len(critic_prompt)}>"
        # each role is rewarded for its own response: len(response) + label
        for role, response in (("pioneer", pioneer), ("observer", observer)):
            assert finished[role][1]["task_rewards"][i] == len(response) + sample["label"]
    for role in ROLES:
        reward, info = finished[role]
        assert reward == pytest.approx(info["task_rewards"].mean())

    # the reward function saw the batch's samples and each role's responses, once per role, in role order
    assert [c[0] for c in calls] == [samples] * 3
    assert [c[1] for c in calls] == [list(env_state.responses[r]) for r in ROLES]


def test_rewards_are_own_task_rewards_with_batch_mean_scalars_and_all_roles_terminate_together():
    rows = [{"query": "ab", "label": 0}, {"query": "cdef", "label": 1}]
    environment = make(roles=("pioneer", "observer"), rows=rows, batch_size=2)
    environment.reset(seed=1)
    order = queries(environment)
    assert sorted(order) == ["ab", "cdef"]
    pioneer_answers = {"ab": "x", "cdef": "xxxx"}
    observer_answers = {"ab": "yyyyyy", "cdef": ""}

    environment.step([pioneer_answers[q] for q in order])  # a list is accepted as well as a tuple
    assert environment.agent_selection == "observer"
    assert environment.terminations == {"pioneer": False, "observer": False}
    assert environment.rewards == {"pioneer": 0.0, "observer": 0.0}
    environment.step(tuple(observer_answers[q] for q in order))

    assert environment.terminations == {"pioneer": True, "observer": True}
    assert environment.truncations == {"pioneer": False, "observer": False}
    assert environment.agent_selection == "pioneer"
    expected = {
        "pioneer": np.array([len(pioneer_answers[q]) for q in order], dtype=float),
        "observer": np.array([len(observer_answers[q]) for q in order], dtype=float),
    }
    assert environment.rewards == {"pioneer": 2.5, "observer": 3.0}  # (1 + 4) / 2 and (6 + 0) / 2
    for role, values in expected.items():
        info = environment.infos[role]
        assert info["role"] == role and info["queries"] == tuple(queries(environment))
        np.testing.assert_array_equal(info["task_rewards"], values)
        np.testing.assert_array_equal(info["batch_rewards"], values)
        assert info["batch_rewards"] is not info["task_rewards"]  # a wrapper may rewrite one, never the other

    # last() returns the cumulative reward; dead steps remove roles in order, the others keep theirs
    _, reward, terminated, _, _ = environment.last()
    assert (reward, terminated) == (2.5, True)
    with pytest.raises(ValueError, match="dead"):
        environment.step(("a", "b"))
    environment.step(None)
    assert environment.agents == ["observer"] and environment.agent_selection == "observer"
    assert environment.last()[1] == 3.0
    environment.step(None)
    assert environment.agents == []


def test_ansi_render_shows_the_first_dialogue():
    environment = make(roles=("pioneer", "observer"), batch_size=3, render_mode="ansi")
    environment.reset(seed=0)
    q = environment.samples[0]["query"]
    assert environment.render() == f"query: {q!r}"
    environment.step(("p0", "p1", "p2"))
    assert environment.render() == f"query: {q!r}\npioneer: {q!r} -> 'p0'"
    environment.step(("o0", "o1", "o2"))
    assert environment.render() == f"query: {q!r}\npioneer: {q!r} -> 'p0'\nobserver: 'Q: {q} A: p0' -> 'o0'"


def test_a_new_episode_clears_rewards_and_responses():
    environment = make(roles=("pioneer",), batch_size=2)
    environment.reset(seed=0)
    environment.step(("aaa", "a"))
    assert environment.rewards == {"pioneer": 2.0}
    environment.reset()
    assert environment.rewards == {"pioneer": 0.0}
    assert environment._cumulative_rewards == {"pioneer": 0.0}
    assert environment.terminations == {"pioneer": False}
    assert environment.infos == {"pioneer": {"role": "pioneer", "queries": tuple(queries(environment))}}
    assert environment.responses == {}
    assert environment.render() is None  # render_mode None


def test_seed_reproduces_the_batch_sequence():
    def batches(environment, seed):
        environment.reset(seed=seed)
        run = [queries(environment)]
        for _ in range(4):
            environment.reset()
            run.append(queries(environment))
        return run

    environment = make(batch_size=3)
    first = batches(environment, 4)
    assert batches(environment, 4) == first  # re-seeding the same env restarts the sequence
    assert batches(make(batch_size=3), 4) == first  # a fresh env with the same seed draws the same batches
    assert batches(make(batch_size=3), 5) != first


def test_seed_at_construction_equals_a_first_seeded_reset():
    def unseeded_resets(environment, count=5):
        run = []
        for _ in range(count):
            environment.reset()
            run.append(queries(environment))
        return run

    seeded_at_construction = unseeded_resets(make(batch_size=3, seed=4))
    first_reset_seeded = make(batch_size=3)
    first_reset_seeded.reset(seed=4)
    assert seeded_at_construction == [queries(first_reset_seeded), *unseeded_resets(first_reset_seeded, 4)]
    assert unseeded_resets(make(batch_size=3, seed=4)) == seeded_at_construction
    for bad in (-1, 1.5, True, "0"):
        with pytest.raises(ValueError, match="seed must be a non-negative int or None"):
            make(seed=bad)
        with pytest.raises(ValueError, match="seed must be a non-negative int or None"):
            make().reset(seed=bad)


@pytest.mark.parametrize("num_rows,batch_size", [(7, 3), (7, 7), (2, 5), (6, 2)])
def test_batches_cover_the_dataset_without_replacement_within_a_pass(num_rows, batch_size):
    rows = [{"query": f"q{i}"} for i in range(num_rows)]
    environment = make(roles=("pioneer",), rows=rows, batch_size=batch_size)
    drawn = []
    environment.reset(seed=11)
    drawn += queries(environment)
    while len(drawn) < 3 * num_rows:
        environment.reset()
        assert len(queries(environment)) == batch_size
        drawn += queries(environment)
    # consecutive passes: rows 0..n-1 of the stream are one permutation, rows n..2n-1 the next, ...
    # (with 7 rows and batches of 3, the third batch takes the last row of pass 1 and two rows of pass 2)
    passes = [drawn[k * num_rows : (k + 1) * num_rows] for k in range(3)]
    for one_pass in passes:
        assert sorted(one_pass) == sorted(r["query"] for r in rows)
    if num_rows > 2:
        assert passes[0] != passes[1] or passes[1] != passes[2]  # each pass is shuffled anew


def test_datasets_dataset_input_gives_plain_dict_samples_and_a_custom_query_column():
    data = datasets.Dataset.from_dict({"text": ["one", "two", "three"], "n": [1, 2, 3]})
    environment = SequentialTextEnv(
        dataset=data,
        roles=["a"],
        templates=["{text}/{n}"],
        reward_fn=length_reward,
        batch_size=3,
        query_column="text",
        render_mode="ansi",
    )
    environment.reset(seed=0)
    assert sorted(environment.samples, key=lambda s: s["n"]) == [
        {"text": "one", "n": 1},
        {"text": "two", "n": 2},
        {"text": "three", "n": 3},
    ]
    assert environment.observe("a")["prompt"] == tuple(f"{s['text']}/{s['n']}" for s in environment.samples)
    assert environment.render() == f"query: {environment.samples[0]['text']!r}"


def test_literal_braces_and_format_specs_render():
    environment = make(roles=("pioneer",), rows=[{"query": "hi"}], batch_size=1, templates=["{{x}} {query!r:>6}"])
    environment.reset(seed=0)
    assert environment.observe("pioneer") == {"prompt": ("{x}   'hi'",)}


# --- bad input -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows", [[], datasets.Dataset.from_dict({"query": []})], ids=["list", "dataset"])
def test_empty_dataset(rows):
    with pytest.raises(ValueError, match="dataset is empty"):
        make(rows=rows)


def test_dataset_without_query_column():
    with pytest.raises(ValueError, match=r"no query column 'query'; its columns are \['text'\]"):
        make(rows=datasets.Dataset.from_dict({"text": ["a", "b"]}))
    with pytest.raises(ValueError, match=r"dataset rows \[1, 3\] have no 'query' field"):
        make(rows=[{"query": "a"}, {"text": "b"}, {"query": "c"}, {"text": "d"}])
    with pytest.raises(
        ValueError, match=r"rows \[0, 1, 2, 3, 4, 5, 6\] have no 'prompt' field \(row 0 has \['query', 'label'\]\)"
    ):
        make(rows=ROWS, query_column="prompt")


def test_dataset_of_the_wrong_kind():
    with pytest.raises(TypeError, match="rows must be dicts, row 0 is str"):
        make(rows=["just text"])
    with pytest.raises(TypeError, match="datasets.Dataset or a list of dicts, got int"):
        make(rows=5)


def test_template_with_unknown_field_lists_the_available_fields():
    with pytest.raises(ValueError) as error:
        make(templates={"pioneer": "{query}", "observer": "{title}: {pioneer}"})
    message = str(error.value)
    assert "role 'observer'" in message and "['title']" in message
    assert "['label', 'query']" in message and "earlier roles and turns ['pioneer', 'pioneer_1']" in message


def test_template_may_not_name_its_own_or_a_later_role():
    with pytest.raises(ValueError, match=r"role 'pioneer' uses unknown field\(s\) \['observer'\]"):
        make(templates={"pioneer": "{query} {observer}", "observer": "{query}"})
    with pytest.raises(ValueError, match=r"role 'observer' uses unknown field\(s\) \['observer'\]"):
        make(templates={"pioneer": "{query}", "observer": "{observer}"})


@pytest.mark.parametrize("template", ["{query.upper}", "{query[0]}", "{}", "{0}"])
def test_template_fields_must_be_plain_names(template):
    with pytest.raises(ValueError, match="is not a plain name"):
        make(roles=("pioneer",), templates=[template])


def test_templates_must_match_the_roles():
    with pytest.raises(ValueError, match=r"missing \['observer'\], unknown \[\]"):
        make(templates={"pioneer": "{query}"})
    with pytest.raises(ValueError, match=r"missing \[\], unknown \['critic'\]"):
        make(templates={"pioneer": "{query}", "observer": "{query}", "critic": "{query}"})
    with pytest.raises(ValueError, match="got 1 templates for 2 roles"):
        make(templates=["{query}"])
    with pytest.raises(TypeError, match="must be a str or a callable, got int"):
        make(templates=["{query}", 3])


def test_callable_template_failures_name_the_role():
    def broken(sample, responses):
        return sample["missing"]

    environment = make(roles=("pioneer",), templates=[broken])
    with pytest.raises(ValueError, match="prompt of role 'pioneer' for sample 0 failed: 'missing'"):
        environment.reset(seed=0)
    environment = make(roles=("pioneer",), templates=[lambda sample, responses: 42])
    with pytest.raises(TypeError, match="template of role 'pioneer' returned int, not str"):
        environment.reset(seed=0)


@pytest.mark.parametrize(
    "roles,match",
    [
        (["a", "a"], "roles must be unique"),
        ([], "at least one role"),
        (["a", ""], "non-empty strings"),
        (["a", 3], "non-empty strings"),
    ],
)
def test_bad_roles(roles, match):
    with pytest.raises(ValueError, match=match):
        SequentialTextEnv(ROWS, roles, ["{query}"] * len(roles), length_reward, batch_size=1)


@pytest.mark.parametrize("batch_size", [0, -2, 2.0, "3", None])
def test_bad_batch_size(batch_size):
    with pytest.raises(ValueError, match=f"batch_size must be a positive int, got {batch_size!r}"):
        make(batch_size=batch_size)


def test_bool_batch_size_is_rejected():
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        make(batch_size=True)


def test_bad_reward_fn_and_render_mode():
    with pytest.raises(TypeError, match="reward_fn must be callable"):
        make(reward_fn=[1.0])
    with pytest.raises(ValueError, match="render_mode must be None or 'ansi', got 'human'"):
        make(render_mode="human")


@pytest.mark.parametrize(
    "action,described",
    [
        ("abc", "a single str"),
        (("a", "b"), "a tuple of 2 items"),
        (["a", "b", "c", "d"], "a list of 4 items"),
        (("a", 1, "c"), "a tuple of 3 items"),
        (None, "'NoneType'"),
        (7, "'int'"),
    ],
)
@pytest.mark.parametrize("factory", [env, SequentialTextEnv], ids=["factory", "raw"])
def test_wrong_action(factory, action, described):
    environment = factory(
        dataset=ROWS,
        roles=["pioneer", "observer"],
        templates={r: STRING_TEMPLATES[r] for r in ("pioneer", "observer")},
        reward_fn=length_reward,
        batch_size=3,
    )
    environment.reset(seed=0)
    with pytest.raises(ValueError) as error:
        environment.step(action)
    assert "action of role 'pioneer' must be a sequence of 3 strings" in str(error.value)
    assert str(error.value).endswith(f"got {described}")
    assert environment.agent_selection == "pioneer"  # the bad action changed nothing


def run_episode(environment, actions):
    environment.reset(seed=0)
    for action in actions:
        environment.step(action)


def test_reward_function_that_raises_names_the_role():
    def reward_fn(samples, responses):
        if responses[0] == "bad":
            raise KeyError("label")
        return [0.0] * len(responses)

    environment = make(batch_size=2, reward_fn=reward_fn)
    with pytest.raises(RewardFunctionError, match=r"reward_fn raised on the responses of role 'observer'") as error:
        run_episode(environment, [("ok", "ok"), ("bad", "ok")])
    assert isinstance(error.value.__cause__, KeyError)


def test_reward_function_returning_nan_names_the_sample():
    environment = make(batch_size=3, reward_fn=lambda s, r: [1.0, math.nan, 2.0])
    with pytest.raises(RewardFunctionError) as error:
        run_episode(environment, [("a", "b", "c")] * 2)
    message = str(error.value)
    assert "non-finite values for role 'pioneer' at sample(s) [1]" in message
    assert repr(environment.samples[1]["query"]) in message


def test_reward_function_returning_inf_is_rejected():
    environment = make(roles=("pioneer",), batch_size=2, reward_fn=lambda s, r: [math.inf, 0.0])
    with pytest.raises(RewardFunctionError, match=r"at sample\(s\) \[0\]: \[inf\]"):
        run_episode(environment, [("a", "b")])


def test_reward_function_returning_the_wrong_number_of_values():
    environment = make(batch_size=3, reward_fn=lambda s, r: [1.0, 2.0])
    with pytest.raises(RewardFunctionError, match=r"returned 2 values for role 'pioneer'; expected 3"):
        run_episode(environment, [("a", "b", "c")] * 2)


@pytest.mark.parametrize(
    "values",
    [["good", "bad"], ["1.5", "2"], [object(), 1.0], {"a": 1.0}],
    ids=["str", "numeric-str", "object", "dict"],
)
def test_reward_function_returning_non_numbers(values):
    environment = make(roles=("pioneer",), batch_size=2, reward_fn=lambda s, r: values)
    with pytest.raises(RewardFunctionError, match=r"returned \w+ \(dtype .*\) for role 'pioneer', not one number per"):
        run_episode(environment, [("a", "b")])


def test_groups_repeat_each_query_in_consecutive_dialogues_and_pass_the_api():
    rows = [{"query": f"q{i}"} for i in range(5)]
    environment = make(rows=rows, batch_size=6, group_size=3)
    api_test(environment, num_cycles=3)
    environment.reset(seed=2)
    drawn = []
    for _ in range(5):
        batch = queries(environment)
        groups = [batch[i : i + 3] for i in range(0, 6, 3)]
        assert all(len(set(group)) == 1 for group in groups) and groups[0][0] != groups[1][0]
        drawn += [group[0] for group in groups]
        environment.reset()
    # the distinct queries still walk through shuffled passes over the data: 10 draws are two whole passes
    assert sorted(drawn[:5]) == sorted(drawn[5:]) == [r["query"] for r in rows]


@pytest.mark.parametrize(("group_size", "message"), [(4, "group_size 4 must divide batch_size 6"),
                                                    (0, "group_size must be a positive int"),
                                                    (True, "group_size must be a positive int")])
def test_bad_group_sizes_are_refused(group_size, message):
    with pytest.raises(ValueError, match=message):
        make(batch_size=6, group_size=group_size)


def test_reward_function_returning_a_tensor_that_requires_grad():
    import torch

    weights = torch.ones(2, requires_grad=True)
    environment = make(roles=("pioneer",), batch_size=2, reward_fn=lambda s, r: weights * 2)
    with pytest.raises(RewardFunctionError, match=r"returned Tensor \(.*requires grad.*\).*detached from any graph"):
        run_episode(environment, [("a", "b")])


def test_a_dataset_smaller_than_a_batch_is_warned_about_once():
    rows = [{"query": f"q{i}"} for i in range(3)]
    with pytest.warns(UserWarning, match=r"3 row\(s\) but a batch asks for 8 queries .*every batch repeats queries"):
        environment = make(rows=rows, batch_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        environment.reset(seed=0)  # not again at every batch
