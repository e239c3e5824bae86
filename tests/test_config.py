"""Typed configuration: the example YAMLs, dotted overrides, and errors that name the offending key."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from marllm.cli import main
from marllm.config import TrainConfig, config_from_dict, load_config
from marllm.config.loading import ConfigError, apply_overrides, read_yaml

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CORY = EXAMPLES / "cory_imdb.yaml"
PPO = EXAMPLES / "ppo_imdb.yaml"


def write_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


# --- the paper's settings ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [CORY, PPO], ids=["cory", "ppo"])
def test_examples_hold_the_papers_imdb_hyperparameters(path):
    config = load_config(path)
    assert isinstance(config, TrainConfig)
    assert config.iterations == 100 and config.seed == 0
    assert config.model.name_or_path == "gpt2-large"
    assert config.task.name == "sentiment" and config.task.dataset == "imdb"
    assert config.task.reward_model == "lvwerra/distilbert-imdb"
    assert (config.task.query_min_tokens, config.task.query_max_tokens) == (2, 8)
    ppo = config.ppo
    assert ppo.optimiser.learning_rate == 1.41e-5
    assert config.env.batch_size == 256
    assert (ppo.batching.mini_batch_size, ppo.batching.gradient_accumulation_steps, ppo.batching.ppo_epochs) == (
        256,
        1,
        4,
    )
    assert (ppo.gamma, ppo.lam, ppo.clip_range, ppo.clip_range_value, ppo.vf_coef) == (1.0, 0.95, 0.2, 0.2, 0.1)
    assert (ppo.kl.kl_control, ppo.kl.init_kl_coef, ppo.kl.target_kl, ppo.kl.kl_horizon) == (
        "adaptive",
        0.3,
        6.0,
        10000,
    )
    assert ppo.score_transform == "normalize"
    gen = config.generation
    assert (gen.min_new_tokens, gen.max_new_tokens, gen.top_k, gen.top_p) == (4, 16, 0, 1.0)
    assert gen.repetition_penalty == 1.1


def test_cory_example_is_two_learners_sharing_rewards_and_swapping_every_five_iterations():
    config = load_config(CORY)
    assert config.name == "cory"
    assert config.env.roles == ["pioneer", "observer"]
    assert config.env.templates == {
        "pioneer": "{query}",
        "observer": 'I can make this sentence "{query}{pioneer}" more positive: {query}',
    }
    assert config.learner_ids == ["llm1", "llm2"]
    assert config.agents.role_period == 5
    np.testing.assert_array_equal(config.coefficient_matrix(), np.ones((2, 2)))


def test_ppo_example_is_one_learner_on_its_own_reward():
    config = load_config(PPO)
    assert config.name == "ppo"
    assert config.env.roles == ["pioneer"] and config.learner_ids == ["llm1"]
    assert config.agents.role_period is None
    assert config.coefficient_matrix() is None


def test_to_dict_round_trips_through_yaml(tmp_path):
    config = load_config(CORY, ["ppo.optimiser.learning_rate=1e-5", "agents.reward_coefficients=[[1, 0.5], [0.5, 1]]"])
    path = write_yaml(tmp_path, yaml.safe_dump(config.to_dict()))
    assert load_config(path) == config


def test_defaults_are_the_cory_paper_setting():
    config = config_from_dict({})
    assert config.env.roles == ["pioneer", "observer"] and config.learner_ids == ["llm1", "llm2"]
    assert config.ppo.optimiser.learning_rate == 1.41e-5 and config.ppo.kl.init_kl_coef == 0.3
    assert config.coefficient_matrix() is None  # no sharing unless asked


# --- overrides --------------------------------------------------------------------------------------------------


def test_override_1e_minus_5_is_a_float():
    assert yaml.safe_load("1e-5") == "1e-5"  # YAML 1.1: a string, since it has no dot
    config = load_config(CORY, ["ppo.optimiser.learning_rate=1e-5"])
    assert config.ppo.optimiser.learning_rate == 1e-5 and type(config.ppo.optimiser.learning_rate) is float


def test_float_written_as_1e_minus_5_in_a_yaml_file(tmp_path):
    config = load_config(
        write_yaml(tmp_path, "ppo:\n  optimiser:\n    learning_rate: 1e-5\n  kl:\n    init_kl_coef: 2\n")
    )
    assert config.ppo.optimiser.learning_rate == 1e-5 and config.ppo.kl.init_kl_coef == 2.0
    assert type(config.ppo.kl.init_kl_coef) is float


def test_override_list_null_and_bool_values():
    config = load_config(
        CORY,
        [
            "env.roles=[a, b, c]",
            "env.templates=null",
            "agents.learners=null",
            "logging.tensorboard=false",
            "iterations=3",
            "iterations=7",  # the last override of a key wins
        ],
    )
    assert config.env.roles == ["a", "b", "c"] and config.env.templates is None
    assert config.learner_ids == ["llm1", "llm2", "llm3"]
    np.testing.assert_array_equal(config.coefficient_matrix(), np.ones((3, 3)))
    assert config.logging.tensorboard is False and config.iterations == 7


def test_override_coefficients():
    assert load_config(CORY, ["agents.reward_coefficients=null"]).coefficient_matrix() is None
    np.testing.assert_array_equal(
        load_config(CORY, ["agents.reward_coefficients=-0.5"]).coefficient_matrix(), [[1, -0.5], [-0.5, 1]]
    )
    np.testing.assert_array_equal(
        load_config(CORY, ["agents.reward_coefficients=[[1, 0], [2, 1]]"]).coefficient_matrix(), [[1, 0], [2, 1]]
    )


def test_override_into_a_new_nested_mapping():
    config = load_config(PPO, ["env.templates.pioneer='Review: {query}'"])
    assert config.env.templates == {"pioneer": "Review: {query}"}
    # unquoted, the value is YAML for a mapping, and the error says which key did not get a string
    with pytest.raises(ConfigError, match=r"env.templates.pioneer must be a string, got dict \{'Review'"):
        load_config(PPO, ["env.templates.pioneer=Review: {query}"])
    data = apply_overrides({"env": {"templates": None}}, ["env.templates.pioneer=x"])
    assert data == {"env": {"templates": {"pioneer": "x"}}}


# --- errors -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["foo=1"], "unknown config key 'foo'; valid keys here: ['agents', 'critic_free', 'env', 'game', 'generation'"),
        (["ppo.lr=1e-5"], "unknown config key 'ppo.lr'; valid keys here: ['batching', 'clip_range'"),
        (["ppo.optimiser.lr=1e-5"], "unknown config key 'ppo.optimiser.lr'; valid keys here: ['adam_eps'"),
        (["agents.period=5"], "unknown config key 'agents.period' (did you mean 'agents.role_period'?)"),
        (["iterations=ten"], "iterations must be an integer, got str 'ten'"),
        (["seed=1.0"], "seed must be an integer, got float 1.0"),
        (["ppo.batching.ppo_epochs=1.5"], "ppo.batching.ppo_epochs must be an integer, got float 1.5"),
        (["logging.tensorboard='yes'"], "logging.tensorboard must be true or false, got 'yes'"),
        (["ppo.optimiser.learning_rate=abc"], "ppo.optimiser.learning_rate must be a number, got str 'abc'"),
        (["env.roles=pioneer"], "env.roles must be a list, got str 'pioneer'"),
        (["agents.role_period=true"], "agents.role_period must be an integer, got bool True"),
        (["model=3"], "model must be a mapping, got int 3"),
        (["ppo.kl.kl_control=pid"], "ppo.kl.kl_control must be one of ['adaptive', 'fixed'], got 'pid'"),
        (["ppo.score_transform=whiten"], "ppo.score_transform must be one of ['none', 'scale', 'normalize']"),
        (
            ["env.batch_size=100"],
            "env.batch_size: batch size 100 is not divisible by ppo.batching.mini_batch_size × "
            "ppo.batching.gradient_accumulation_steps = 256 × 1 = 256",
        ),
        (
            ["env.batch_size=64", "ppo.batching.mini_batch_size=16", "ppo.batching.gradient_accumulation_steps=3"],
            "= 16 × 3 = 48",
        ),
        (["agents.reward_coefficients=[[1, 1, 1], [1, 1, 1]]"], "agents.reward_coefficients: reward coefficients"),
        (["agents.reward_coefficients=[[1, 1, 1], [1, 1, 1]]"], "must be an 2x2 matrix"),
        (["agents.reward_coefficients=[[1, 0, 0], [0, 1, 0], [0, 0, 1]]"], "got shape (3, 3)"),
        (["agents.reward_coefficients=[1, 1]"], "agents.reward_coefficients[0] must be a list, got int 1"),
        (
            ["agents.reward_coefficients=[[1, .nan], [1, 1]]"],
            "agents.reward_coefficients: reward coefficients must be finite",
        ),
        (["agents.role_period=0"], "agents.role_period must be an int >= 1 or null, got 0"),
        (["agents.role_period=-2"], "agents.role_period must be an int >= 1 or null, got -2"),
        (["agents.learners=[llm1]"], "agents.learners has 1 ids for 2 roles ['pioneer', 'observer']"),
        (["agents.learners=[a, b, c]"], "agents.learners has 3 ids for 2 roles"),
        (["agents.learners=[a, a]"], "agents.learners must be distinct, got ['a', 'a']"),
        (["env.roles=[a, a]", "agents.learners=null", "env.templates=null"], "env: roles must be unique"),
        (["env.templates={pioneer: '{query}'}"], "env.templates: templates must have one entry per role"),
        (["env.templates={pioneer: '{query}'}"], "missing ['observer'], unknown []"),
        (["env.templates.critic=x"], "missing [], unknown ['critic']"),
        (["generation.min_new_tokens=20"], "generation.min_new_tokens (20) must be <= generation.max_new_tokens (16)"),
        (["generation.top_p=0"], "generation.top_p must be in (0, 1], got 0.0"),
        (["task.name=gsm9k"], "task.name: unknown task 'gsm9k'; one of ["),
        (["task.query_min_tokens=9"], "task.query_min_tokens (9) and task.query_max_tokens (8)"),
        (["iterations=0"], "iterations must be >= 1, got 0"),
        (["foo"], "override 'foo' must look like section.key=value"),
        (["=3"], "override '=3' must look like section.key=value"),
        (["iterations.count=1"], "override 'iterations.count=1': iterations is not a section"),
        (["env.roles.first=a"], "override 'env.roles.first=a': env.roles is not a section"),
        (["ppo.optimiser.learning_rate=[1"], "override 'ppo.optimiser.learning_rate=[1': value is not valid YAML"),
    ],
)
def test_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as error:
        load_config(CORY, overrides)
    assert message in str(error.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"config file '.*nope\.yaml' does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="is a directory; give a YAML config file"):
        read_yaml(tmp_path)  # a directory is not a config file


@pytest.mark.parametrize("text,kind", [("- a\n- b\n", "list"), ("just words\n", "str"), ("3\n", "int")])
def test_yaml_that_is_not_a_mapping(tmp_path, text, kind):
    with pytest.raises(ConfigError, match=f"must hold a mapping of keys, got {kind}"):
        load_config(write_yaml(tmp_path, text))


def test_invalid_yaml_and_empty_file(tmp_path):
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(write_yaml(tmp_path, "ppo: [1,\n"))
    # an empty file is a mistake, not a request for every default (gpt2-large on imdb)
    with pytest.raises(ConfigError, match=r"config file '.*config\.yaml' is empty; it must hold a mapping"):
        load_config(write_yaml(tmp_path, ""))


def test_unknown_key_in_a_file_names_its_full_path(tmp_path):
    path = write_yaml(tmp_path, "generation:\n  max_tokens: 16\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'generation.max_tokens'"):
        load_config(path)


# --- the command line -------------------------------------------------------------------------------------------


def test_cli_train_with_a_missing_config_returns_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "nonexistent.yaml"]) == 2
    captured = capsys.readouterr()
    assert "marllm: config error: config file 'nonexistent.yaml' does not exist" in captured.err
    assert not (tmp_path / "runs").exists()


def test_cli_train_with_an_unknown_key_returns_2(tmp_path, capsys):
    path = write_yaml(tmp_path, "iterations: 1\nppo:\n  lr: 0.1\n")
    assert main(["train", str(path), "--run-dir", str(tmp_path / "run")]) == 2
    assert "marllm: config error: unknown config key 'ppo.lr'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_cli_train_with_a_bad_override_returns_2(capsys):
    assert main(["train", str(CORY), "ppo.kl.kl_control=pid"]) == 2
    assert "ppo.kl.kl_control must be one of ['adaptive', 'fixed'], got 'pid'" in capsys.readouterr().err


def test_cli_overrides_may_follow_options(tmp_path, capsys):
    # the override after --run-dir must be applied (and here rejected), not dropped or misparsed
    assert main(["train", str(CORY), "--run-dir", str(tmp_path / "run"), "ppo.kl.kl_control=pid"]) == 2
    assert "ppo.kl.kl_control must be one of" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", str(CORY), "ppo.batching.ppo_epochs=1", "--no-such-option"])
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_full_parameter_training_in_float16_is_a_config_error(dtype):
    if dtype == "float16":
        with pytest.raises(ConfigError, match=rf"model.dtype {dtype} with model.lora: null .* float32"):
            load_config(CORY, [f"model.dtype={dtype}"])
    else:  # trained with stochastic rounding (tests/test_stochastic_rounding.py)
        assert load_config(CORY, [f"model.dtype={dtype}"]).model.dtype == dtype
    # LoRA keeps its adapters in float32 on a half-precision base: allowed
    config = load_config(CORY, [f"model.dtype={dtype}", "model.lora={r: 4}"])
    assert config.model.dtype == dtype and config.model.lora.r == 4


def test_new_ppo_switches_load_from_yaml_overrides():
    config = load_config(CORY, ["ppo.guards.ratio_threshold=null", "ppo.batching.loss_reduction=step_token_mean"])
    assert config.ppo.guards.ratio_threshold is None and config.ppo.batching.loss_reduction == "step_token_mean"
    config = load_config(CORY, ["ppo.guards.ratio_threshold=5"])
    assert config.ppo.guards.ratio_threshold == 5.0
    with pytest.raises(
        ConfigError, match=r"ppo.batching.loss_reduction must be one of \['minibatch_token_mean', 'step_token"
    ):
        load_config(CORY, ["ppo.batching.loss_reduction=sum"])


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_config_loads(path):
    config = load_config(path)
    assert config.iterations >= 1


@pytest.mark.parametrize("task", ["", "arith_"])
def test_smollm2_cory_and_ppo_examples_differ_only_in_the_agents(task):
    cory = load_config(EXAMPLES / f"cory_{task}smollm2.yaml").to_dict()
    ppo = load_config(EXAMPLES / f"ppo_{task}smollm2.yaml").to_dict()
    assert cory["model"]["name_or_path"] == "marllm:smollm2-135m-instruct" and cory["model"]["lora"]
    for config in (cory, ppo):
        del config["name"], config["env"]["roles"], config["env"]["templates"], config["agents"]
    assert cory == ppo


@pytest.mark.parametrize(
    ("override", "valid"),
    [
        ("ppo.compute.rollout_from_generate=maybe", "'maybe' matches none of bool or 'auto'"),
        ("ppo.compute.micro_batch_size=big", "'big' matches none of int or 'auto' or null"),
    ],
)
def test_a_value_of_a_union_type_is_refused_naming_what_is_valid(override, valid):
    with pytest.raises(ConfigError, match=re.escape(f"{override.split('=')[0]}: {valid}")):
        load_config(EXAMPLES / "cory_offline.yaml", [override])
