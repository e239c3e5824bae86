"""What a new user gets wrong, and the one clear error each mistake gives: what was wrong and what is valid.

Model and dataset references, devices, YAML files, local dataset files, numbers in the config and on the command
line, reward shapes, the CLI's catch-all and its run directory, non-ASCII queries, and a damaged offline asset.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import datasets
import huggingface_hub
import numpy as np
import pytest
import torch
import yaml
from datasets.exceptions import DatasetGenerationError, DatasetNotFoundError
from huggingface_hub.errors import LocalEntryNotFoundError

from marllm.assets import resolve_dataset, resolve_model
from marllm.assets.offline import ensure_assets, prepare
from marllm.assets.offline import preparation as prepare_module
from marllm.assets.references import (
    MissingReferenceError,
    check_dataset_reference,
    check_model_reference,
    model_load_error,
)
from marllm.cli import main
from marllm.config import config_from_dict, load_config
from marllm.config.loading import ConfigError, parse_yaml
from marllm.envs.text_env import RewardFunctionError, SequentialTextEnv
from marllm.loop import IterationResult
from marllm.models.policy import load_causal_lm, load_tokenizer
from marllm.parallel.placement import Placement
from marllm.tasks import base as base_module
from marllm.tasks.gsm8k import load_gsm8k
from marllm.tasks.math import MathTask
from marllm.tasks.sentiment import SentimentTask, text_openings
from tests.offline_support import tiny_recipe, write_tiny_corpus

# the module, not the function ``marllm.run.train`` that the package also exports
train_module = importlib.import_module("marllm.run.train")
build_module = importlib.import_module("marllm.run.setup")
learner_factory = importlib.import_module("marllm.run.learners")
ROOT = Path(__file__).resolve().parents[1]
CORY = ROOT / "examples" / "cory_imdb.yaml"


@pytest.fixture
def hub_offline(monkeypatch):
    """The hub switched off, as under HF_HUB_OFFLINE=1 (the test suite's setting)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture
def nothing_loads(monkeypatch):
    """Fail the test if build() gets as far as loading a tokenizer, a model or the offline assets."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the references were checked")

    for module in (build_module, learner_factory):
        for name in ("load_tokenizer", "load_causal_lm", "resolve_model"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, refuse)


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def tiny_config(lm_dir: Path, reviews: Path, classifier: Path) -> dict:
    return {
        "model": {"name_or_path": str(lm_dir), "device": "cpu"},
        "task": {"dataset": str(reviews), "eval_split": None, "min_text_chars": 20, "reward_model": str(classifier)},
        "env": {"batch_size": 2},
        "ppo": {"batching": {"mini_batch_size": 2}},
        "logging": {"tensorboard": False, "progress": False, "save_checkpoint": False, "eval_queries": 0},
    }


# --- model, reward model and dataset references -----------------------------------------------------------------


def test_a_model_path_that_does_not_exist_fails_before_anything_loads(
    nothing_loads, tiny_classifier_dir, reviews_file, tmp_path
):
    missing = str(tmp_path / "no" / "such" / "model")
    config = config_from_dict(tiny_config(Path(missing), reviews_file, tiny_classifier_dir))
    with pytest.raises(MissingReferenceError) as error:
        train_module.build(config)
    message = str(error.value)
    assert message.startswith(f"model.name_or_path: {missing!r} does not exist")
    assert "give a local model directory (holding config.json), a hub id such as 'gpt2'" in message
    assert "marllm:offline-base" in message


@pytest.mark.parametrize(
    "name,message",
    [
        ("./no/such/dir", r"'./no/such/dir' does not exist \(/"),
        ("~/no-such-marllm-model", r"'~/no-such-marllm-model' does not exist"),
        ("a/b/c", r"'a/b/c' is neither an existing local path nor a hub id \('name' or 'org/name'\)"),
        ("bad name!", r"'bad name!' is neither an existing local path nor a hub id"),
        ("marllm:offline-reviews", r"'marllm:offline-reviews' is a dataset, not a causal LM; use marllm:offline-base"),
        ("marllm:gpt", r"unknown marllm asset 'marllm:gpt'; known: \['marllm:offline-base'"),
    ],
)
def test_model_references_that_cannot_be_right(name, message, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MissingReferenceError, match=rf"^model.name_or_path: .*{message}"):
        check_model_reference(name, "model.name_or_path", asset="offline-base")


def test_a_file_or_a_directory_without_config_json_is_not_a_model(tmp_path):
    weights = write(tmp_path / "model.bin", b"\0")
    with pytest.raises(MissingReferenceError, match=r"model.bin' is a file, not a model directory"):
        check_model_reference(str(weights), "model.name_or_path")
    with pytest.raises(MissingReferenceError, match=r"directory '.*' has no config.json: not a saved model"):
        check_model_reference(str(tmp_path), "model.name_or_path")


def test_a_hub_model_while_offline_fails_at_once_and_says_how_to_point_at_a_directory(
    hub_offline, nothing_loads, tiny_classifier_dir, reviews_file
):
    config = config_from_dict(tiny_config(Path("nobody-xyz/no-such-model"), reviews_file, tiny_classifier_dir))
    started = time.perf_counter()
    with pytest.raises(MissingReferenceError) as error:
        train_module.build(config)
    assert time.perf_counter() - started < 5  # no retries: the cache is looked at, the network is not
    message = str(error.value)
    assert "model.name_or_path: 'nobody-xyz/no-such-model' is not a local path" in message
    assert "the Hugging Face hub is offline (HF_HUB_OFFLINE=1)" in message
    assert "is not in the local cache" in message
    assert "`hf download nobody-xyz/no-such-model`" in message and "a local model directory" in message


def test_a_hub_reward_model_or_dataset_while_offline_names_its_key(
    hub_offline, nothing_loads, tiny_lm_dir, tiny_classifier_dir, reviews_file
):
    config = config_from_dict(tiny_config(tiny_lm_dir, reviews_file, Path("nobody-xyz/no-such-classifier")))
    with pytest.raises(MissingReferenceError, match=r"^task.reward_model: 'nobody-xyz/no-such-classifier' is not a"):
        train_module.build(config)
    config = config_from_dict(tiny_config(tiny_lm_dir, Path("nobody-xyz/no-such-reviews"), tiny_classifier_dir))
    with pytest.raises(MissingReferenceError) as error:
        train_module.build(config)
    assert str(error.value).startswith("task.dataset: 'nobody-xyz/no-such-reviews' is not a local path")
    assert "--repo-type dataset" in str(error.value) and "a local .csv, .json, .jsonl" in str(error.value)


def test_a_hub_id_is_left_to_the_hub_when_online(monkeypatch):
    """Online, a hub id passes the check without a network call (the hub answers when it loads); offline, the same
    id, not in the cache, is refused: the check did look at it."""
    import socket

    calls = []

    def no_network(*args, **kwargs):
        calls.append(args)
        raise OSError("a reference check reached for the network")

    for owner, name in ((socket, "getaddrinfo"), (socket, "create_connection"), (socket.socket, "connect")):
        monkeypatch.setattr(owner, name, no_network)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    check_model_reference("nobody-xyz/no-such-model", "model.name_or_path")  # no error: the hub answers later
    check_dataset_reference("nobody-xyz/no-such-data", "task.dataset", "a local file")
    assert calls == []
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(MissingReferenceError, match="is not in the local cache"):
        check_model_reference("nobody-xyz/no-such-model", "model.name_or_path")
    assert calls == []


def test_a_missing_dataset_file_is_named(tmp_path):
    with pytest.raises(MissingReferenceError, match=r"^task.dataset: 'reviews.jsonl' does not exist \(/"):
        check_dataset_reference("reviews.jsonl", "task.dataset", "a local .jsonl file")
    with pytest.raises(MissingReferenceError, match=r"a local .json or .jsonl file, a folder holding <split>.jsonl"):
        MathTask(name="gsm8k", dataset=str(tmp_path / "gsm8k")).check_references()
    MathTask(name="arithmetic").check_references()  # generated problems: nothing to find


def test_loading_a_missing_model_directly_names_it(tmp_path):
    missing = str(tmp_path / "gone")
    with pytest.raises(MissingReferenceError, match=r"^model\.name_or_path: '.*gone' does not exist"):
        load_causal_lm(missing, device="cpu")
    with pytest.raises(MissingReferenceError, match=r"^model\.name_or_path: '.*gone' does not exist"):
        load_tokenizer(missing)


def test_a_load_error_names_the_config_key_it_is_given(tmp_path, tiny_lm_dir):
    missing = str(tmp_path / "gone")
    problem = model_load_error(missing, "weights", OSError("no file"), key="task.reward_model")
    assert isinstance(problem, MissingReferenceError)
    assert str(problem).startswith(f"task.reward_model: {missing!r} does not exist")
    problem = model_load_error(str(tiny_lm_dir), "weights", OSError("bad header\n  more"))  # the reference is fine
    assert type(problem) is OSError
    assert str(problem) == f"could not load the weights of model {str(tiny_lm_dir)!r}: bad header"


def test_a_directory_is_not_a_dataset_file(tmp_path, monkeypatch):
    folder = tmp_path / "reviews"
    folder.mkdir()
    for name in (str(folder), str(tmp_path / "data.jsonl")):
        Path(name).mkdir(exist_ok=True)
        with pytest.raises(MissingReferenceError, match=rf"^task.dataset: '{name}' is a directory, not a data file; "):
            SentimentTask(dataset=name).check_references()
        with pytest.raises(IsADirectoryError, match=rf"^dataset '{name}' is a directory, not a data file; give a "):
            load_reviews(Path(name))
    write(folder / "train.jsonl", '{"question": "q", "answer": "#### 1"}\n')
    MathTask(name="gsm8k", dataset=str(folder)).check_references()  # gsm8k reads <split>.jsonl in a folder
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(MissingReferenceError, match=r"pipe.jsonl' is not a regular file; give a local"):
        SentimentTask(dataset=str(fifo)).check_references()


def test_a_wrong_kind_of_asset_is_refused_before_the_assets_are_prepared(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the offline assets were prepared before the name was checked")

    monkeypatch.setattr("marllm.assets.offline.ensure_assets", refuse)
    with pytest.raises(ValueError, match=r"^model.name_or_path: 'marllm:offline-reviews' is a dataset, not a causal"):
        resolve_model("marllm:offline-reviews")
    with pytest.raises(ValueError, match=r"^task.dataset: 'marllm:offline-base' is a causal LM, not a dataset; use "):
        resolve_dataset("marllm:offline-base", "train")
    with pytest.raises(ValueError, match=r"^task.dataset: unknown marllm asset 'marllm:reviews'; known: "):
        resolve_dataset("marllm:reviews", "train")
    with pytest.raises(ValueError, match=r"^task.reward_model: 'marllm:offline-base' is a causal LM, not a sentiment"):
        SentimentTask(reward_model="marllm:offline-base").reward("cpu")
    with pytest.raises(ValueError, match=r"^marllm:offline-reviews has splits \['heldout', 'train'\], not 'test'"):
        resolve_dataset("marllm:offline-reviews", "test")


def test_damaged_weights_and_missing_tokenizer_files_name_the_model(tiny_lm_dir, tmp_path):
    copy = Path(shutil.copytree(tiny_lm_dir, tmp_path / "lm"))
    write(copy / "model.safetensors", b"not safetensors")
    with pytest.raises(OSError, match=r"could not load the weights of model '.*lm': .*header"):
        load_causal_lm(str(copy), device="cpu")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (copy / name).unlink(missing_ok=True)
    with pytest.raises(OSError, match=r"model '.*lm' has no tokenizer files .*tokenizer.save_pretrained"):
        load_tokenizer(str(copy))


# --- devices ----------------------------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_a_config_error_naming_model_device(tmp_path, capsys):
    config = load_config(CORY, ["model.device=cuda"])  # a GPU config loads anywhere (to inspect, or send elsewhere)
    with pytest.raises(ConfigError) as error:
        config.check_references()  # what build() checks first, before anything loads
    message = str(error.value)
    assert "model.device: 'cuda' needs a CUDA GPU, but torch" in message
    assert "finds none on this machine; available here: ['auto', 'cpu']" in message
    assert main(["train", str(CORY), "--run-dir", str(tmp_path / "run"), "model.device=cuda"]) == 2
    assert "config error: model.device: 'cuda' needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_an_unknown_or_absent_device_lists_the_available_ones():
    with pytest.raises(ConfigError, match=r"model.device: 'gpu' is not a device name; give auto, cpu, cuda"):
        load_config(CORY, ["model.device=gpu"])
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ConfigError, match=r"model.device: 'cuda:7\d*'.*available"):
        load_config(CORY, [f"model.device=cuda:{70 + count}"]).check_references()


# --- YAML files -------------------------------------------------------------------------------------------------


def test_an_empty_config_file_is_an_error_naming_it(tmp_path, capsys):
    path = write(tmp_path / "empty.yaml", "# nothing but a comment\n")
    assert main(["train", str(path), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"marllm: config error: config file '{path}' is empty; it must hold a mapping of config keys")
    assert not (tmp_path / "run").exists()


def test_a_duplicate_key_names_the_key_and_both_lines(tmp_path):
    path = write(tmp_path / "dup.yaml", "name: a\nppo:\n  optimiser:\n    learning_rate: 1.0e-5\n    adam_eps: 1.0e-8\n"
                 "    learning_rate: 1\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(error.value) == (
        f"config file '{path}': key 'learning_rate' appears twice in one mapping (lines 4 and 6); give each key once"
    )
    write(path, "name: a\niterations: 3\nname: b\n")
    with pytest.raises(ConfigError, match=r"key 'name' appears twice in one mapping \(lines 1 and 3\)"):
        load_config(path)


def test_yaml_merge_keys_may_still_be_overridden():
    text = "base: &b {batch_size: 8, roles: [pioneer]}\nenv:\n  <<: *b\n  batch_size: 4\n"
    assert parse_yaml(text)["env"] == {"batch_size": 4, "roles": ["pioneer"]} == yaml.safe_load(text)["env"]


# --- local dataset files ----------------------------------------------------------------------------------------


def load_reviews(path: Path) -> datasets.Dataset:
    return SentimentTask(dataset=str(path)).load_split("train")


@pytest.mark.parametrize(
    "content,message",
    [
        ("", r" is empty; it must hold one JSON object per line, such as \{\"text\": \"...\"\}$"),
        ("\n \n", r" is empty"),
        (
            '{"text": "fine"}\n\n{"text": "cut off\n',
            r": line 3 is not valid JSON \(column 10: Unterminated string starting at\): '\{\"text\": \"cut off'; it "
            r"must hold one JSON object per line",
        ),
        ('{"text": "fine"}\n["a list"]\n', r": line 2 holds a JSON list, not an object; it must hold one JSON object"),
        ('{"text": "fine"}\n{"text": null}\n', r": line 2: 'text' is null; it must be a non-empty string$"),
        ('{"text": "fine"}\n{"text": 5}\n', r": line 2: 'text' is int 5; it must be a non-empty string$"),
        ('{"text": "fine"}\n{"text": ["a"]}\n', r": line 2: 'text' is list \['a'\]; it must be a non-empty string$"),
        ('{"text": "fine"}\n{"text": " \\t "}\n', r": line 2: 'text' is ' \\t ': empty or only whitespace; it must"),
    ],
    ids=["empty", "blank", "malformed", "not-an-object", "null", "int", "list", "whitespace"],
)
def test_bad_jsonl_names_the_file_and_line(content, message, tmp_path):
    path = write(tmp_path / "reviews.jsonl", content)
    with pytest.raises(ValueError, match=rf"^dataset file '{path}'{message}"):
        load_reviews(path)


def test_non_utf8_bytes_name_the_line_and_byte(tmp_path):
    path = write(tmp_path / "reviews.jsonl", b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(ValueError) as error:
        load_reviews(path)
    assert str(error.value) == (
        f"dataset file '{path}': line 2 is not UTF-8 text (byte 0xe9 at byte 14 of the line); save the file as UTF-8"
    )


def test_a_json_list_file_names_the_item(tmp_path):
    path = write(tmp_path / "reviews.json", json.dumps([{"text": "fine"}, {"text": None}], indent=1))
    with pytest.raises(ValueError, match=r"reviews.json': item 1 of the list: 'text' is null"):
        load_reviews(path)
    write(path, '[{"text": "fine"},\n {"text": }]')
    with pytest.raises(ValueError, match=r"reviews.json': not valid JSON at line 2, column 11"):
        load_reviews(path)


@pytest.mark.parametrize(
    "content,line",
    [
        ('{"text": "fine"}\n\n  \n{"text": "also fine"}\r\n\t\n{"text": null}\n', 6),
        ('{"text": "fine"}\n{"title": "no text"}\n', 2),
        ('\ufeff{"text": "fine"}\n{"text": ""}\n', 2),
    ],
    ids=["after-blank-lines", "missing-key", "byte-order-mark"],
)
def test_a_bad_text_in_jsonl_names_its_line_past_blank_lines(content, line, tmp_path):
    path = write(tmp_path / "reviews.jsonl", content)
    with pytest.raises(ValueError, match=rf"^dataset file '{path}': line {line}: 'text' is "):
        load_reviews(path)


def test_a_non_utf8_byte_in_a_csv_or_txt_file_names_its_line(tmp_path):
    for name in ("reviews.csv", "reviews.txt"):
        path = write(tmp_path / name, b"text\nfine\n\nok \xc3\n")
        with pytest.raises(ValueError) as error:
            load_reviews(path)
        assert str(error.value) == (
            f"dataset file '{path}': line 4 is not UTF-8 text (byte 0xc3 at byte 4 of the line); save the file as UTF-8"
        )


def test_a_local_file_for_both_splits_is_read_once(tmp_path, tokenizer, tiny_classifier_dir, monkeypatch):
    lines = [json.dumps({"text": f"review number {i} " * 3}) + "\n" for i in range(6)]
    path = write(tmp_path / "reviews.jsonl", "".join(lines))
    reads = []
    original = base_module.check_local_file
    monkeypatch.setattr(base_module, "check_local_file", lambda *args: reads.append(args) or original(*args))
    task = SentimentTask(dataset=str(path), eval_split="test", min_text_chars=20, reward_model=str(tiny_classifier_dir))
    parts = task.build(tokenizer, seed=0, device="cpu")
    assert len(reads) == 1
    assert parts.dataset["text"] == parts.eval_dataset["text"] and len(parts.dataset) == 6


def test_blank_texts_in_a_csv_name_the_row(tmp_path, tokenizer):
    path = write(tmp_path / "reviews.csv", "text,label\na long enough review of a film,1\n,0\n")
    task = SentimentTask(dataset=str(path), min_text_chars=5)
    with pytest.raises(ValueError, match=r"reviews.csv:train': row 1 \(counting from 0\): 'text' is null"):
        task.queries(task.load_split("train"), tokenizer, 0)


def test_gsm8k_files_name_the_line(tmp_path):
    path = write(tmp_path / "train.jsonl", '{"question": "q", "answer": "#### 1"}\n{"question": "q2", "answer": 2\n')
    with pytest.raises(ValueError, match=r"train.jsonl': line 2 is not valid JSON \(column 31: Expecting ',' delim"):
        load_gsm8k(str(path))
    write(path, '{"question": null, "answer": "#### 1"}\n')
    with pytest.raises(ValueError, match=r"train.jsonl': line 1: 'question' is null"):
        load_gsm8k(str(path))
    write(path, "")
    with pytest.raises(ValueError, match=r"train.jsonl' is empty"):
        load_gsm8k(str(path))


# --- numbers in the config and on the command line ---------------------------------------------------------------


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_a_non_finite_reward_coefficient_is_refused(value):
    with pytest.raises(ConfigError, match=r"agents.reward_coefficients must be a finite number λ, a matrix of finite"):
        load_config(CORY, [f"agents.reward_coefficients={value}"])


@pytest.mark.parametrize(
    "override,message",
    [
        ("seed=-1", "seed must be an integer in [0, 2**32 - 1], got -1"),
        ("logging.samples_per_iteration=-1", "logging.samples_per_iteration must be >= 0 (0 writes none), got -1"),
        ("logging.eval_queries=-3", "logging.eval_queries must be >= 0 (0 writes none), got -3"),
        ("logging.pass_at_k_samples=0", "logging.pass_at_k_samples must be >= 1, got 0"),
        ("logging.pass_at_k_problems=-5", "logging.pass_at_k_problems must be >= 1, or null for every problem, got -5"),
    ],
)
def test_negative_counts_are_refused(override, message):
    with pytest.raises(ConfigError) as error:
        load_config(CORY, [override])
    assert message in str(error.value)


@pytest.mark.parametrize(
    "option,value,message",
    [
        ("--limit", "0", "argument --limit: must be an integer >= 1, got 0"),
        ("--samples", "-2", "argument --samples: must be an integer >= 1, got -2"),
        ("--batch-size", "0", "argument --batch-size: must be an integer >= 1, got 0"),
        ("--limit", "ten", "argument --limit: must be an integer >= 1, got 'ten'"),
    ],
)
def test_eval_counts_must_be_positive(option, value, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["eval", str(CORY), option, value])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_eval_of_a_missing_model_is_one_config_error_line(tmp_path, capsys):
    config = write(tmp_path / "arith.yaml", f"model:\n  name_or_path: {tmp_path / 'gone'}\ntask:\n  name: arithmetic\n")
    assert main(["eval", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"marllm: config error: model.name_or_path: '{tmp_path / 'gone'}' does not exist")
    assert err.count("\n") == 1


# --- reward shapes ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values,shape",
    [(np.zeros((2, 2)), "(2, 2)"), (np.zeros((4, 1)), "(4, 1)"), (np.float64(1.0), "()"), ([[1.0, 2.0]] * 2, "(2, 2)")],
    ids=["half-by-two", "column", "scalar", "nested-list"],
)
def test_a_reward_that_is_not_one_number_per_sample_names_its_shape(values, shape):
    environment = SequentialTextEnv(
        [{"query": f"q{i}"} for i in range(4)], ["pioneer"], ["{query}"], lambda s, r: values, batch_size=4
    )
    environment.reset(seed=0)
    with pytest.raises(RewardFunctionError) as error:
        environment.step(("a", "b", "c", "d"))
    assert f"returned an array of shape {shape} for role 'pioneer'; expected a 1-D sequence of 4 numbers" in str(
        error.value
    )


@pytest.mark.parametrize("values", [[1, 2, 3, 4], np.arange(1.0, 5.0), torch.arange(1.0, 5.0)], ids=str)
def test_a_flat_list_or_array_of_rewards_is_fine(values):
    environment = SequentialTextEnv([{"query": "q"}], ["pioneer"], ["{query}"], lambda s, r: values, batch_size=4)
    environment.reset(seed=0)
    environment.step(("a", "b", "c", "d"))
    np.testing.assert_array_equal(environment.infos["pioneer"]["task_rewards"], [1.0, 2.0, 3.0, 4.0])


# --- the command line's catch-all and its run directory ----------------------------------------------------------


def failing_build(error: Exception):
    def build(config, placement=None):
        raise error

    return build


@pytest.mark.parametrize(
    "error,expected",
    [
        (OSError("could not read\n  the weights"), "marllm: error: could not read the weights"),
        (
            LocalEntryNotFoundError("Cannot find the requested files in the disk cache."),
            "marllm: error: LocalEntryNotFoundError: Cannot find the requested files in the disk cache.",
        ),
        (
            DatasetNotFoundError("Dataset 'x' doesn't exist on the Hub"),
            "marllm: error: DatasetNotFoundError: Dataset 'x' doesn't exist on the Hub",
        ),
    ],
    ids=["oserror", "hub", "datasets"],
)
def test_loading_errors_are_one_line_and_leave_no_run_directory(error, expected, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(train_module, "build", failing_build(error))
    assert main(["train", str(CORY), "--run-dir", str(tmp_path / "run")]) == 1
    assert capsys.readouterr().err == expected + "\n"
    assert not (tmp_path / "run").exists()


def test_a_datasets_error_shows_its_cause(monkeypatch, tmp_path, capsys):
    error = DatasetGenerationError("An error occurred while generating the dataset")
    error.__cause__ = ValueError("row 7 has a list where a string belongs")
    monkeypatch.setattr(train_module, "build", failing_build(error))
    assert main(["train", str(CORY), "--run-dir", str(tmp_path / "run")]) == 1
    assert capsys.readouterr().err == (
        "marllm: error: DatasetGenerationError: An error occurred while generating the dataset (caused by "
        "ValueError: row 7 has a list where a string belongs)\n"
    )


def test_a_programming_error_still_shows_its_traceback(monkeypatch, tmp_path):
    monkeypatch.setattr(train_module, "build", failing_build(KeyError("bug")))
    with pytest.raises(KeyError):
        main(["train", str(CORY), "--run-dir", str(tmp_path / "run")])


def stub_setup(monkeypatch, failures: list[bool]):
    """build() returns a stand-in; each iteration fails or logs one line, in the order of ``failures``."""
    setup = SimpleNamespace(
        env=SimpleNamespace(), learners={}, players={}, concurrent_updates=False, metric_names=None,
        placement=Placement(),
        iteration_metrics=lambda m, infos: m,
    )
    monkeypatch.setattr(train_module, "build", lambda config, placement=None: setup)
    steps = iter(failures)

    def run_iteration(env, learners, seed=None, concurrent_updates=False, names=None):
        if next(steps):
            raise RuntimeError("out of memory in iteration")
        return IterationResult({}, {})

    monkeypatch.setattr(train_module, "run_iteration", run_iteration)


def test_a_run_failing_before_its_first_iteration_removes_only_what_it_created(monkeypatch, tmp_path, capsys):
    stub_setup(monkeypatch, [True, True])
    run_dir = tmp_path / "runs" / "a" / "b"
    assert main(["train", str(CORY), "--run-dir", str(run_dir), "logging.tensorboard=false"]) == 1
    assert "marllm: error: out of memory in iteration" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and tmp_path.exists()

    existing = tmp_path / "mine"
    existing.mkdir()
    write(existing / "notes.txt", "keep me")
    assert main(["train", str(CORY), "--run-dir", str(existing), "logging.tensorboard=false"]) == 1
    assert (existing / "notes.txt").read_text() == "keep me"


def test_a_run_failing_after_an_iteration_keeps_its_logs(monkeypatch, tmp_path):
    stub_setup(monkeypatch, [False, True])
    run_dir = tmp_path / "run"
    overrides = ["iterations=2", "logging.tensorboard=false", "logging.progress=false"]
    assert main(["train", str(CORY), "--run-dir", str(run_dir), *overrides]) == 1
    assert json.loads((run_dir / "metrics.jsonl").read_text())["iteration"] == 0


# --- non-ASCII queries ------------------------------------------------------------------------------------------

NON_ASCII = [
    "😀 this movie was good 😀😀 and the acting was great 🎬",
    "فيلم رائع جدا this movie was good and the story was fine",
    "🙂🙃😉 i loved the story , a wonderful and happy film",
    "naïve café scenes , the cast is good , the music is great",
]


def test_queries_of_non_ascii_reviews_are_whole_character_prefixes(tokenizer):
    task = SentimentTask(min_text_chars=5, query_min_tokens=1, query_max_tokens=8)
    reviews = datasets.Dataset.from_dict({"text": NON_ASCII * 5})
    for seed in range(3):
        queries = task.queries(reviews, tokenizer, seed)
        for row in queries:
            assert "\ufffd" not in row["query"] and row["query"]
            assert row["text"].startswith(row["query"])
    for count in range(1, 12):  # every cut point, also inside the 4-byte emoji and the 2-byte Arabic letters
        for text, query in zip(NON_ASCII, text_openings(tokenizer, NON_ASCII, [count] * 4), strict=True):
            assert "\ufffd" not in query and text.startswith(query)


def test_ascii_queries_are_what_the_first_tokens_decode_to(tokenizer):
    texts = ["this movie was good and the acting was great", "what a terrible waste of time , bad from start"]
    for count in range(1, 9):
        heads = [ids[:count] for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
        assert text_openings(tokenizer, texts, [count, count]) == tokenizer.batch_decode(heads)


# --- a damaged offline asset ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prepared_home(tmp_path_factory):
    base = tmp_path_factory.mktemp("assets")
    source = write_tiny_corpus(base / "corpus")
    prepare(base / "home", progress=False, recipe=tiny_recipe(), corpus_source=source)
    return base / "home", source


class Stop(Exception):
    """Raised instead of rebuilding, once the message has been given."""


def test_a_damaged_base_model_is_announced_before_it_is_rebuilt(prepared_home, tmp_path, monkeypatch, capsys):
    home = Path(shutil.copytree(prepared_home[0], tmp_path / "home"))
    weights = home / tiny_recipe().directory_name / "base_model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    monkeypatch.setattr(prepare_module, "_build_base_model", lambda *args: (_ for _ in ()).throw(Stop()))
    with pytest.raises(Stop):
        ensure_assets(home, recipe=tiny_recipe(), corpus_source=prepared_home[1], progress=False)
    err = capsys.readouterr().err
    assert f"marllm: the offline assets in {weights.parents[1]} are damaged; rebuilding what does not verify" in err
    assert (
        f"marllm: offline assets: rebuilding base_model ({prepare_module.PHASE_WORK['base_model']}) because "
        f"{weights}: sha256 "
    ) in err
    assert "does not match the recorded" in err


def test_a_missing_reward_model_file_is_announced_and_rebuilt(prepared_home, tmp_path, capsys):
    home = Path(shutil.copytree(prepared_home[0], tmp_path / "home"))
    vocabulary = home / tiny_recipe().directory_name / "reward_model" / "vocabulary.json"
    vocabulary.unlink()
    ensure_assets(home, recipe=tiny_recipe(), corpus_source=prepared_home[1], progress=False)
    err = capsys.readouterr().err
    assert "rebuilding reward_model (training the n-gram sentiment classifier: seconds) because " in err
    assert f"because {vocabulary}: missing" in err
    assert "base_model" not in err and vocabulary.is_file()


def test_unprepared_assets_say_so_before_preparing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(prepare_module, "_build_corpus", lambda *args: (_ for _ in ()).throw(Stop()))
    with pytest.raises(Stop):
        ensure_assets(tmp_path / "home", recipe=tiny_recipe(), progress=False)
    err = capsys.readouterr().err
    assert "marllm: no offline assets for recipe" in err and "preparing them now (`marllm prepare`" in err
    assert "marllm: offline assets: building corpus (splitting the review corpus" in err
    assert "because it has not been built yet" in err
