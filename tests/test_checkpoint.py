"""Durable training state: exact resumption, atomic saves, pruning, damage reports, and no unpickling anywhere."""

import itertools
import json
import os
import pickle
import random
import shutil
import signal
import time
import warnings

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from marllm.algorithms import GenerationConfig, PPOConfig, PPOLearner
from marllm.config import config_from_dict
from marllm.envs.text_env import env as text_env
from marllm.loop import run_iteration
from marllm.models.policy import ReferencePool, load_causal_lm, load_tokenizer
from marllm.run.checkpoint import (
    CHECKPOINTS_DIR,
    MANIFEST_FILE,
    CheckpointError,
    CheckpointInfo,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from marllm.run.setup import build
from marllm.wrappers import RolePermutation, SharedReward
from tests.conftest import make_tiny_gpt2
from tests.test_train import ROOT, merge_settings, tiny_overrides

LORA = {"r": 2, "alpha": 4, "target_modules": ["c_attn"]}


# ----------------------------------------------------------------------------------------------- exact resumption
def cory_config(lm, classifier, reviews, lora):
    data = yaml.safe_load((ROOT / "examples" / "cory_imdb.yaml").read_text())
    merge_settings(data, tiny_overrides(lm, classifier, reviews))
    data["agents"]["role_period"] = 1  # the roles swap at every iteration, so across the checkpoint too
    data["model"]["lora"] = LORA if lora else None
    return config_from_dict(data)


def train_for(setup, iterations, first):
    history = []
    for iteration in range(first, first + iterations):
        seed = setup.config.seed if iteration == 0 else None  # as marllm.run.train does
        metrics, _ = run_iteration(setup.env, setup.learners, seed=seed)
        history.append({k: v for k, v in metrics.items() if not k.startswith("time/")})
    return history


def trained_state(learners):
    """Every tensor training changes: the policies' parameters, value heads and Adam state."""
    state = {}
    for learner_id, learner in learners.items():
        for name, parameter in learner.model.named_parameters():
            state[f"{learner_id}/{name}"] = parameter.detach().clone()
        for name, parameter in learner.value_head.named_parameters():
            state[f"{learner_id}/value_head/{name}"] = parameter.detach().clone()
        for index, values in learner.optimizer.state_dict()["state"].items():
            for key, value in values.items():
                state[f"{learner_id}/adam/{index}/{key}"] = value.clone()
    return state


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_resumed_cory_run_continues_bit_for_bit(tmp_path, tiny_lm_dir, tiny_classifier_dir, reviews_file, lora):
    config = cory_config(tiny_lm_dir, tiny_classifier_dir, reviews_file, lora)
    setup = build(config)
    before = train_for(setup, 3, first=0)
    path = save_checkpoint(tmp_path, 3, setup.learners, setup.env, extra={"config": config.to_dict()})
    uninterrupted = train_for(setup, 2, first=3)
    expected_state = trained_state(setup.learners)

    fresh = build(config)
    info = load_checkpoint(latest_checkpoint(tmp_path).path, fresh.learners, fresh.env)
    assert info == CheckpointInfo(path, 3, {"config": json.loads(json.dumps(config.to_dict()))})
    resumed = train_for(fresh, 2, first=3)

    roles = [m["llm1/role"] for m in before + uninterrupted]
    assert roles == ["pioneer", "observer", "pioneer", "observer", "pioneer"]  # a swap across the checkpoint
    assert resumed == uninterrupted
    state = trained_state(fresh.learners)
    assert state.keys() == expected_state.keys()
    assert all(torch.equal(state[key], expected_state[key]) for key in state)
    policy = [key for key in load_file(path / "learner-llm1.safetensors") if key.startswith("policy/")]
    if lora:  # one base carries both adapters; each learner saves its own adapter only
        assert fresh.learners["llm1"].model is fresh.learners["llm2"].model
        assert policy and all(".lora_" in key and "llm" not in key for key in policy)
    else:
        assert "policy/transformer.wte.weight" in policy


# ----------------------------------------------------------------------------------------------- small setups
def tiny_learners(tokenizer, ids=("llm1", "llm2"), n_positions=128):
    reference = make_tiny_gpt2(tokenizer, n_positions).requires_grad_(False).eval()
    ppo = PPOConfig.from_flat(mini_batch_size=4, learning_rate=1e-3)
    generation = GenerationConfig(2, 4)
    return {
        learner_id: PPOLearner(
            learner_id,
            model=make_tiny_gpt2(tokenizer, n_positions, seed=i),
            tokenizer=tokenizer,
            reference=reference,
            config=ppo,
            generation=generation,
        )
        for i, learner_id in enumerate(ids)
    }


def tiny_env(rows=10, learners=("llm1", "llm2")):
    data = [{"query": f"this movie {i}"} for i in range(rows)]
    inner = text_env(
        dataset=data,
        roles=["pioneer", "observer"],
        templates={"pioneer": "{query}", "observer": "{query}{pioneer}"},
        reward_fn=lambda samples, responses: [len(r) / 10 for r in responses],
        batch_size=4,
    )
    return RolePermutation(SharedReward(inner), 1, list(learners))


@pytest.fixture
def trained(tokenizer):
    """Two learners and their env after one iteration (so Adam and the statistics have state)."""
    torch.manual_seed(0)
    learners, env = tiny_learners(tokenizer), tiny_env()
    run_iteration(env, learners, seed=0)
    return learners, env


# ----------------------------------------------------------------------------------------------- layout
def test_a_checkpoint_is_safetensors_and_json_listed_in_its_manifest(tmp_path, trained):
    learners, env = trained
    path = save_checkpoint(tmp_path, 1, learners, env, extra={"note": "x", "lr": 0.1 + 0.2})
    assert path == tmp_path / CHECKPOINTS_DIR / "iteration-000001"
    assert sorted(os.listdir(tmp_path / CHECKPOINTS_DIR)) == ["iteration-000001"]  # no temporary left
    names = sorted(os.listdir(path))
    assert names == [
        "env.safetensors",
        "learner-llm1.safetensors",
        "learner-llm2.safetensors",
        "manifest.json",
        "rng.safetensors",
        "state.json",
    ]
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    assert manifest["iteration"] == 1 and manifest["extra"] == {"note": "x", "lr": 0.1 + 0.2}  # floats exact
    assert sorted(manifest["files"]) == [name for name in names if name != MANIFEST_FILE]
    for name, entry in manifest["files"].items():
        assert entry["bytes"] == (path / name).stat().st_size
        assert len(entry["sha256"]) == 64
    tensors = load_file(path / "learner-llm1.safetensors")
    assert {key.split("/")[0] for key in tensors} == {"policy", "value_head", "optimizer"}
    assert "optimizer/value_head/summary.weight/exp_avg_sq" in tensors
    state = json.loads((path / "state.json").read_text())
    assert state["learners"]["llm1"]["state"]["num_updates"] == 1
    assert [entry["part"] for entry in state["env"]] == ["0.RolePermutation", "1.SequentialTextEnv"]
    assert latest_checkpoint(tmp_path) == CheckpointInfo(path, 1, manifest["extra"])


def test_generator_states_are_restored(tmp_path, trained):
    learners, env = trained
    path = save_checkpoint(tmp_path, 1, learners, env)
    draws = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)], learners["llm1"]._rng.random())
    env_order = (env.unwrapped._order.copy(), env.unwrapped._cursor, env.unwrapped._rng.random())
    load_checkpoint(path, learners, env)
    assert torch.equal(torch.rand(3), draws[0])
    assert np.array_equal(np.random.rand(3), draws[1])
    assert [random.random() for _ in range(3)] == draws[2]
    assert learners["llm1"]._rng.random() == draws[3]
    unwrapped = env.unwrapped
    assert np.array_equal(unwrapped._order, env_order[0]) and unwrapped._cursor == env_order[1]
    assert unwrapped._rng.random() == env_order[2]


# ----------------------------------------------------------------------------------------------- keeping, replacing
def saved_iterations(run_dir):
    return sorted(os.listdir(run_dir / CHECKPOINTS_DIR))


def test_keep_removes_older_checkpoints_and_abandoned_later_ones(tmp_path, trained):
    learners, env = trained
    for iteration in (1, 2, 3, 4):
        save_checkpoint(tmp_path, iteration, learners, env, keep=2)
    assert saved_iterations(tmp_path) == ["iteration-000003", "iteration-000004"]
    save_checkpoint(tmp_path, 5, learners, env, keep=3)
    assert saved_iterations(tmp_path) == ["iteration-000003", "iteration-000004", "iteration-000005"]
    # Going on from iteration 3 abandons 4 and 5: a later resume must not pick them up.
    save_checkpoint(tmp_path, 3, learners, env, keep=1, extra={"second": True})
    assert saved_iterations(tmp_path) == ["iteration-000003"]
    assert latest_checkpoint(tmp_path).extra == {"second": True}  # replaced in place
    with pytest.raises(ValueError, match="keep must be an int >= 1"):
        save_checkpoint(tmp_path, 6, learners, env, keep=0)


def test_bad_arguments_write_nothing(tmp_path, trained):
    learners, env = trained
    with pytest.raises(TypeError, match="extra must be JSON-able"):
        save_checkpoint(tmp_path, 1, learners, env, extra={"model": object()})
    with pytest.raises(ValueError, match="iteration must be an int >= 0"):
        save_checkpoint(tmp_path, -1, learners, env)
    learners["llm2"].act({"prompt": ["a"] * 4})
    with pytest.raises(RuntimeError, match="'llm2' holds 1 rollout"):
        save_checkpoint(tmp_path, 1, learners, env)
    assert saved_iterations(tmp_path) == []
    assert latest_checkpoint(tmp_path) is None and latest_checkpoint(tmp_path / "elsewhere") is None


def test_unfinished_saves_are_ignored_and_cleaned_up(tmp_path, trained):
    learners, env = trained
    save_checkpoint(tmp_path, 2, learners, env)
    root = tmp_path / CHECKPOINTS_DIR
    # What kills leave: a save's temporary directory (even one that got as far as its manifest), a removal's trash,
    # and a directory with a checkpoint's name but no manifest.
    for name in (".tmp-iteration-000009-4242", ".trash-iteration-000001-4242", "iteration-000007"):
        (root / name).mkdir()
        (root / name / "learner-llm1.safetensors").write_bytes(b"partial")
    (root / ".tmp-iteration-000009-4242" / MANIFEST_FILE).write_text("{}")
    with pytest.warns(RuntimeWarning, match="iteration-000007 has no manifest.json: it is incomplete"):
        info = latest_checkpoint(tmp_path)
    assert info.iteration == 2
    save_checkpoint(tmp_path, 3, learners, env)
    assert saved_iterations(tmp_path) == ["iteration-000002", "iteration-000003"]


def test_a_checkpoint_moved_aside_by_an_interrupted_replacement_is_put_back(tmp_path, trained):
    learners, env = trained
    root = tmp_path / CHECKPOINTS_DIR
    save_checkpoint(tmp_path, 4, learners, env)
    # A kill between moving the old iteration 4 aside and renaming the new one into place.
    os.replace(root / "iteration-000004", root / ".replaced-iteration-000004-4242")
    assert latest_checkpoint(tmp_path).path == root / ".replaced-iteration-000004-4242"
    save_checkpoint(tmp_path, 5, learners, env, keep=2)
    assert saved_iterations(tmp_path) == ["iteration-000004", "iteration-000005"]


def test_a_kill_at_any_moment_leaves_a_complete_checkpoint(tmp_path, trained, tokenizer):
    """Forked savers are killed (SIGKILL) at random moments; the newest checkpoint always loads."""
    learners, env = trained
    save_checkpoint(tmp_path, 0, learners, env)
    started = time.perf_counter()
    save_checkpoint(tmp_path, 1, learners, env)
    duration = time.perf_counter() - started
    chooser = random.Random(0)
    iteration = 2
    interrupted = 0
    for _ in range(8):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child saves until it is killed
            os.close(read_end)
            try:
                for child_iteration in range(iteration, iteration + 1000):
                    save_checkpoint(tmp_path, child_iteration, learners, env, keep=2)
                    os.write(write_end, f"{child_iteration}\n".encode())
            finally:
                os._exit(0)
        os.close(write_end)
        time.sleep(chooser.uniform(0.0, 3.0 * duration))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        with os.fdopen(read_end) as pipe:
            finished = [int(line) for line in pipe.read().split()]
        interrupted += any(name.startswith(".") for name in saved_iterations(tmp_path))
        info = latest_checkpoint(tmp_path)
        assert info.iteration >= max(finished, default=1)
        load_checkpoint(info.path, tiny_learners(tokenizer), tiny_env())  # verifies every file's sha256
        iteration = info.iteration + 1
    assert interrupted, "no kill landed in the middle of a save"
    save_checkpoint(tmp_path, iteration, learners, env, keep=1)
    assert saved_iterations(tmp_path) == [f"iteration-{iteration:06d}"]


def kill_on_call(target):
    """In this (forked) process, the ``target``-th file-system step (fsync, rename, unlink, rmdir) kills it."""
    calls = itertools.count()

    def killing(function):
        def step(*args, **kwargs):
            if next(calls) == target:
                os.kill(os.getpid(), signal.SIGKILL)
            return function(*args, **kwargs)

        return step

    for name in ("fsync", "replace", "unlink", "rmdir"):  # shutil.rmtree goes through os.unlink and os.rmdir
        setattr(os, name, killing(getattr(os, name)))


def test_a_kill_between_any_two_steps_of_a_save_leaves_a_complete_checkpoint(tmp_path, trained, tokenizer):
    """Saves killed before each of their file-system steps in turn: a new checkpoint, one replacing the same
    iteration, one going on from an earlier iteration."""
    learners, env = trained
    base = tmp_path / "base"
    for iteration in (1, 2):
        save_checkpoint(base, iteration, learners, env)
    fresh, fresh_env = tiny_learners(tokenizer), tiny_env()
    for target in itertools.count():
        run_dir = tmp_path / f"killed-at-{target}"
        shutil.copytree(base, run_dir)
        pid = os.fork()
        if pid == 0:
            try:
                kill_on_call(target)
                save_checkpoint(run_dir, 3, learners, env)
                save_checkpoint(run_dir, 3, learners, env, extra={"again": True})
                save_checkpoint(run_dir, 2, learners, env, keep=1)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no damaged checkpoint to skip either
            info = latest_checkpoint(run_dir)
        assert info.iteration in (2, 3), target
        load_checkpoint(info.path, fresh, fresh_env)
        save_checkpoint(run_dir, 4, learners, env, keep=1)  # and the next save cleans up after the killed one
        assert saved_iterations(run_dir) == ["iteration-000004"], target
        if not os.WIFSIGNALED(status):  # the saves ran to the end: every step has been a kill point
            break
    assert info.iteration == 2 and target > 40


# ----------------------------------------------------------------------------------------------- damage and misfits
def test_loading_names_what_is_missing_or_damaged(tmp_path, trained):
    learners, env = trained
    path = save_checkpoint(tmp_path, 1, learners, env)
    original = (path / "learner-llm2.safetensors").read_bytes()
    flipped = bytearray(original)
    flipped[-1] ^= 0xFF
    (path / "learner-llm2.safetensors").write_bytes(bytes(flipped))
    (path / "rng.safetensors").unlink()
    with pytest.raises(
        CheckpointError, match="learner-llm2.safetensors does not match its sha256.*; rng.safetensors is missing"
    ):
        load_checkpoint(path, learners, env)
    (path / "learner-llm2.safetensors").write_bytes(original[:-10])
    with pytest.raises(CheckpointError, match=f"learner-llm2.safetensors has {len(original) - 10} bytes"):
        load_checkpoint(path, learners, env)
    (path / MANIFEST_FILE).unlink()
    with pytest.raises(CheckpointError, match="has no manifest.json: it is incomplete"):
        load_checkpoint(path, learners, env)
    with pytest.raises(CheckpointError, match="there is no checkpoint directory"):
        load_checkpoint(tmp_path / "nowhere", learners, env)


def test_loading_refuses_a_state_that_does_not_fit(tmp_path, trained, tokenizer):
    learners, env = trained
    path = save_checkpoint(tmp_path, 1, learners, env)
    with pytest.raises(CheckpointError, match=r"missing from the checkpoint \['llm3'\], not in the run \['llm2'\]"):
        load_checkpoint(path, tiny_learners(tokenizer, ids=("llm1", "llm3")), tiny_env(learners=("llm1", "llm3")))
    with pytest.raises(CheckpointError, match="dataset of 10 rows, this env's has 12"):
        load_checkpoint(path, tiny_learners(tokenizer), tiny_env(rows=12))
    with pytest.raises(CheckpointError, match=r"stateful parts are \['0.RolePermutation', '1.SequentialTextEnv'\]"):
        load_checkpoint(path, tiny_learners(tokenizer), tiny_env().env)
    shorter = tiny_learners(tokenizer, n_positions=64)
    untouched = {name: p.clone() for name, p in shorter["llm1"].model.named_parameters()}
    with pytest.raises(CheckpointError, match=r"learner 'llm1': .*wpe.weight has shape \(128, 32\) in the checkpoint"):
        load_checkpoint(path, shorter, tiny_env())
    # the learner was checked before anything changed
    assert all(torch.equal(p, untouched[name]) for name, p in shorter["llm1"].model.named_parameters())


# ----------------------------------------------------------------------------------------------- safe loading
class Payload:
    """A pickled object that would record that it was unpickled."""

    ran = False

    def __reduce__(self):
        return (_mark_unpickled, ())


def _mark_unpickled():
    Payload.ran = True
    return "unpickled"




def test_loading_a_checkpoint_never_unpickles(tmp_path, trained, tokenizer, monkeypatch):
    learners, env = trained
    path = save_checkpoint(tmp_path, 1, learners, env)
    learners["llm1"].save(tmp_path / "export")

    def refuse(*args, **kwargs):
        raise AssertionError("something was unpickled")

    for owner, name in ((pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (torch, "load")):
        monkeypatch.setattr(owner, name, refuse)
    fresh, fresh_env = tiny_learners(tokenizer), tiny_env()
    load_checkpoint(path, fresh, fresh_env)
    fresh["llm1"].load_state(tmp_path / "export")
    assert fresh["llm1"].num_updates == 1


def test_remote_code_is_off_unless_asked_for(tiny_lm_dir, monkeypatch):
    import transformers

    seen = []
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        original = auto.from_pretrained.__func__

        def recording(cls, *args, _original=original, **kwargs):
            seen.append((cls.__name__, kwargs.get("trust_remote_code")))
            return _original(cls, *args, **kwargs)

        monkeypatch.setattr(auto, "from_pretrained", classmethod(recording))
    load_tokenizer(str(tiny_lm_dir))
    load_causal_lm(str(tiny_lm_dir), device="cpu")
    ReferencePool().get(str(tiny_lm_dir), device="cpu")
    load_causal_lm(str(tiny_lm_dir), device="cpu", trust_remote_code=True)
    assert seen == [
        ("AutoTokenizer", False),
        ("AutoModelForCausalLM", False),
        ("AutoModelForCausalLM", False),
        ("AutoModelForCausalLM", True),
    ]


def test_an_export_carries_a_manifest_and_a_damaged_one_is_refused_naming_the_file(tmp_path, trained):
    from marllm.evaluation.deployed import check_export
    from marllm.utils.errors import CheckpointError
    from marllm.utils.files import verify_directory_manifest

    learners, _ = trained
    export = tmp_path / "checkpoints" / "llm1"
    learners["llm1"].save(export)
    assert verify_directory_manifest(export) == []
    check_export(export)  # intact: no error
    weights = next((export / "policy").glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit in the last tensor's data
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"damaged: .*{weights.name}: sha256"):
        check_export(export)
    (export / "learner_state.json").unlink()
    assert any("learner_state.json: missing" in line for line in verify_directory_manifest(export))
