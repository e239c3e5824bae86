"""Tasks and rewards of one's own in a YAML config (issue 22): the plain text task, a reward named by import path or
by a file beside the config, a task class named likewise, each checked when the config is read; and pass@k decided
by what a task declares, not by its name."""

import json
import sys

import pytest
import yaml

from marllm.cli import main
from marllm.config import ConfigError, config_from_dict, load_config
from marllm.evaluation.deployed import check_pass_at_k_request
from marllm.run.setup import build, build_env
from marllm.tasks import SentimentTask, TextTask, has_binary_reward

REWARDS = '''
def haggle(samples, responses, context):
    return [1.0 if context.role == "seller" else -1.0 for _ in responses]

def length(samples, responses):
    return [float(len(r)) for r in responses]

def one_argument(samples):
    return []

NOT_CALLABLE = 3
'''

TASK_CLASS = '''
from dataclasses import dataclass

from marllm.tasks import TaskParts


@dataclass
class Echo:
    """A task of one's own: generated prompts, a reward of its own."""

    name: str = "echo"
    count: int = 3
    binary_reward = True

    def build(self, tokenizer, seed, device="auto"):
        rows = [{"query": f"say {i}", "target": str(i)} for i in range(self.count)]
        return TaskParts(rows, {"speaker": "{query}:"}, self.reward(device))

    def default_templates(self):
        return {"speaker": "{query}:"}

    def check_references(self):
        pass

    def reward(self, device="auto"):
        return lambda samples, responses: [float(s["target"] in r) for s, r in zip(samples, responses)]

    def load_split(self, split):
        return self.build(None, 0).dataset


class NotADataclass:
    name = "x"
'''

PROMPTS = [
    "A long prompt that the sentiment task would have cut to its first few tokens, used here as written.",
    "Another prompt, also kept whole, with every one of its words.",
    "A third prompt.",
    "A fourth prompt.",
]


@pytest.fixture
def project(tmp_path):
    """A folder holding a config's reward module, a task module and a prompts file, as a user's project would."""
    (tmp_path / "rewards.py").write_text(REWARDS)
    (tmp_path / "tasks.py").write_text(TASK_CLASS)
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p, "price": 10}) + "\n" for p in PROMPTS))
    return tmp_path


def text_config(project, lm_dir, **task):
    return {
        "model": {"name_or_path": str(lm_dir), "device": "cpu"},
        "task": {"name": "text", "dataset": str(project / "prompts.jsonl"), "query_column": "prompt",
                 "reward": f"{project / 'rewards.py'}:length", **task},
        "env": {"roles": ["speaker"], "templates": {"speaker": "{query}"}, "batch_size": 2},
        "ppo": {"batching": {"mini_batch_size": 2, "ppo_epochs": 1}},
        "generation": {"min_new_tokens": 2, "max_new_tokens": 4},
        "logging": {"tensorboard": False, "progress": False, "eval_queries": 2, "checkpoint_every": None},
    }


def write_config(project, data, name="config.yaml"):
    path = project / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_reward_file_beside_the_config_is_found_from_anywhere(project, tiny_lm_dir, monkeypatch, tmp_path_factory):
    path = write_config(project, text_config(project, tiny_lm_dir, reward="rewards.py:length"))  # beside it
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    config = load_config(path)
    assert isinstance(config.task, TextTask)
    assert config.task.reward == f"{project / 'rewards.py'}:length"  # absolute: the run's saved config finds it too
    assert config.task.reward_fn([{}], ["abc"]) == [3.0]
    again = config_from_dict(config.to_dict())  # what --resume and marllm eval RUN_DIR/config.yaml read back
    assert again.task.reward_fn is config.task.reward_fn


def test_a_reward_by_module_path(project, tiny_lm_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.delitem(sys.modules, "rewards", raising=False)
    config = config_from_dict(text_config(project, tiny_lm_dir, reward="rewards:haggle"))
    assert config.task.reward_fn.__name__ == "haggle"


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        ("no_such_package.rewards:haggle", "no module named 'no_such_package.rewards' can be imported"),
        ("rewards.py:missing", r"rewards.py has no 'missing' \(it defines: NOT_CALLABLE, haggle, length, one_arg"),
        ("gone.py:haggle", "gone.py' does not exist"),
        ("rewards.py:one_argument", r"one_argument\(samples\) cannot be called as \(samples, responses\)"),
        ("rewards.py:NOT_CALLABLE", "must be callable"),
        ("haggle", "is not a reference to a Python object"),
    ],
    ids=["missing-module", "missing-name", "missing-file", "wrong-signature", "not-callable", "no-module"],
)
def test_a_bad_reward_reference_is_a_config_error_naming_it(project, tiny_lm_dir, reward, message, capsys):
    path = write_config(project, text_config(project, tiny_lm_dir, reward=reward))
    with pytest.raises(ConfigError, match=message):
        load_config(path)
    assert main(["eval", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("marllm: config error: task.reward") and err.count("\n") == 1


def test_a_reward_per_role_must_name_the_roles(project, tiny_lm_dir):
    data = text_config(project, tiny_lm_dir, reward={"seller": "rewards.py:haggle", "buyer": "rewards.py:length"})
    data["env"] = {"roles": ["seller", "buyer"], "templates": {"seller": "{query}", "buyer": "{seller}"},
                   "batch_size": 2}
    config = load_config(write_config(project, data))
    assert set(config.task.reward_fn) == {"seller", "buyer"}
    data["env"]["roles"] = ["seller", "critic"]
    data["env"]["templates"] = {"seller": "{query}", "critic": "{seller}"}
    with pytest.raises(ConfigError, match=r"task.reward.*\['buyer'\] are not roles.*no reward for \['critic'\]"):
        load_config(write_config(project, data))


def test_the_text_task_needs_templates(project, tiny_lm_dir):
    data = text_config(project, tiny_lm_dir)
    del data["env"]["templates"]
    with pytest.raises(ConfigError, match=r"env.templates: task 'text' has no default prompt templates"):
        load_config(write_config(project, data))


def test_the_text_task_uses_its_prompts_as_written_and_the_sentiment_task_cuts_them(project, tiny_lm_dir):
    text = load_config(write_config(project, text_config(project, tiny_lm_dir)))
    setup = build(text)
    assert setup.task.dataset["query"] == PROMPTS and setup.task.eval_dataset is None
    env = setup.env
    env.reset(seed=0)
    assert set(env.observe(env.agent_selection)["prompt"]) <= set(PROMPTS)
    # the sentiment recipe, on the same file, keeps only each review's opening (and drops short ones)
    reviews = SentimentTask(dataset=str(project / "prompts.jsonl"), text_column="prompt", min_text_chars=20,
                            eval_split=None)
    cut = reviews.queries(reviews.load_split("train"), setup.tokenizer, seed=0)
    assert len(cut) == 2 and all(len(q) < len(p) for q, p in zip(cut["query"], PROMPTS, strict=False))


def test_a_prompt_too_long_for_the_model_is_the_generation_error(project, tiny_lm_dir, tmp_path):
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "word " * 400}) + "\n" + json.dumps({"prompt": "short"}) + "\n")
    config = config_from_dict(text_config(project, tiny_lm_dir, dataset=str(long)))
    setup = build(config)
    from marllm.loop import run_iteration

    with pytest.raises(ValueError, match="too long"):
        run_iteration(setup.env, setup.learners, seed=0)


def test_an_evaluation_file_holds_the_held_out_prompts(project, tiny_lm_dir):
    held_out = project / "held_out.jsonl"
    held_out.write_text(json.dumps({"prompt": "held out", "price": 1}) + "\n")
    config = config_from_dict(text_config(project, tiny_lm_dir, eval_dataset=str(held_out)))
    parts = config.task.build(None, 0)
    assert parts.eval_dataset["query"] == ["held out"] and config.task.held_out
    with pytest.raises(ValueError, match="a local file is one split"):
        config_from_dict(text_config(project, tiny_lm_dir, eval_split="test")).task.build(None, 0)


def test_a_task_class_of_ones_own_by_path(project, tiny_lm_dir):
    data = {
        "model": {"name_or_path": str(tiny_lm_dir), "device": "cpu"},
        "task": {"name": "tasks.py:Echo", "count": 2},
        "env": {"roles": ["speaker"], "batch_size": 2},
        "ppo": {"batching": {"mini_batch_size": 2}},
        "logging": {"pass_at_k": [1]},  # the class says its reward is 0/1
    }
    config = load_config(write_config(project, data))
    assert type(config.task).__name__ == "Echo" and config.task.count == 2
    assert config.to_dict()["task"] == {"name": f"{project / 'tasks.py'}:Echo", "count": 2}
    env = build_env(config, config.task.build(None, 0))
    env.reset(seed=0)
    assert env.observe("llm1")["prompt"] in (("say 0:", "say 1:"), ("say 1:", "say 0:"))
    data["task"] = {"name": "tasks.py:NotADataclass"}
    with pytest.raises(ConfigError, match="task.name: .* not a dataclass"):
        load_config(write_config(project, data))
    data["task"] = {"name": "tasks.py:Missing"}
    with pytest.raises(ConfigError, match="task.name: .*tasks.py has no 'Missing'"):
        load_config(write_config(project, data))
    data["task"] = {"name": "sentimental"}
    with pytest.raises(ConfigError, match="task.name: unknown task .* or one by reference"):
        load_config(write_config(project, data))


def test_pass_at_k_follows_what_the_task_declares_not_its_name(project, tiny_lm_dir):
    binary = config_from_dict(text_config(project, tiny_lm_dir, binary_reward=True))
    assert has_binary_reward(binary.task)
    check_pass_at_k_request(binary, [1], 1)
    data = text_config(project, tiny_lm_dir)
    data["logging"]["pass_at_k"] = [1]
    with pytest.raises(ConfigError, match="needs a task with a 0/1 reward, not 'text'"):
        config_from_dict(data)
    data["task"]["binary_reward"] = True
    assert config_from_dict(data).logging.pass_at_k == [1]
    plain = config_from_dict(text_config(project, tiny_lm_dir))
    with pytest.raises(ValueError, match="does not declare one"):
        check_pass_at_k_request(plain, [1], 1)



def test_a_study_finds_the_reward_beside_its_base_config(project, tiny_lm_dir, monkeypatch, tmp_path_factory):
    from marllm.studies.spec import load_study

    write_config(project, text_config(project, tiny_lm_dir, reward="rewards.py:length"), "base.yaml")
    studies = tmp_path_factory.mktemp("studies")
    (studies / "study.yaml").write_text(yaml.safe_dump({"name": "s", "base": str(project / "base.yaml"), "seeds": [0]}))
    monkeypatch.chdir(studies)
    (run,) = load_study(studies / "study.yaml").runs()
    assert run.config.task.reward == f"{project / 'rewards.py'}:length"
