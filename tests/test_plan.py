"""``marllm plan``: its arithmetic checked against what a tiny model really allocates — the activations autograd saves
at full depth, the weights, gradients and Adam state of learners after an update, the peak of an update pass under
gradient checkpointing and with processed logits, the resident memory of a LoRA run — a game planned as it runs, and
its command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast, Qwen2Config

from marllm.cli import main
from marllm.config import config_from_dict
from marllm.models.checkpointing import enable_gradient_checkpointing
from marllm.models.memory import activation_bytes, model_shape, saved_tensor_bytes
from marllm.models.policy import load_tokenizer, ready_for_generation
from marllm.run.learners import learners_from_config
from marllm.run.plan import CPU_RUNTIME_BYTES, game_lengths, plan_memory, prompt_tokens
from tests.conftest import make_tiny_gpt2
from tests.test_durable_runs import cory_data, with_settings
from tests.test_gradient_checkpointing import tiny_qwen2

ROOT = Path(__file__).resolve().parent.parent


def identity(name: str) -> str:
    return name


@pytest.fixture
def cory(tiny_lm_dir, tiny_classifier_dir, reviews_file):
    def make(**top):
        return config_from_dict(cory_data(tiny_lm_dir, tiny_classifier_dir, reviews_file, **top))

    return make


def real_saved_bytes(model, rows: int, tokens: int, checkpointing: bool = False) -> int:
    """What autograd keeps for the backward of the full-depth trunk, measured on a real forward."""
    ids = torch.randint(1, 100, (rows, tokens))
    mask = torch.ones_like(ids)
    mask[0, : tokens // 4] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with saved_tensor_bytes(exclude=list(model.parameters())) as saved:
        model.get_decoder()(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
    return saved[0]


@pytest.mark.parametrize("architecture", ["gpt2", "qwen2"])
def test_activations_measured_on_two_layers_are_those_of_the_full_depth(tmp_path, tokenizer, architecture):
    from tests.conftest import make_tiny_gpt2

    model = make_tiny_gpt2(tokenizer) if architecture == "gpt2" else tiny_qwen2(tokenizer)
    text = model.config
    for key in ("n_layer", "num_hidden_layers"):
        if hasattr(text, key):
            setattr(text, key, 5)
    if getattr(text, "layer_types", None):
        text.layer_types = text.layer_types[:1] * 5
    deep = AutoModelForCausalLM.from_config(text).eval()
    deep.save_pretrained(tmp_path)
    shape = model_shape(str(tmp_path))
    assert shape.layers == 5 and shape.parameters == sum(p.numel() for p in deep.parameters())
    estimated = activation_bytes(shape, 24, "float32").total(6)
    # Linear in rows and layers by construction; the only approximation is that each row costs what the measured
    # pair's average row does (one of two rows is left-padded there, as one of six here).
    assert estimated == pytest.approx(real_saved_bytes(deep, 6, 24), rel=0.02)


def test_weights_gradients_and_adam_state_are_counted_as_allocated(cory, tiny_lm_dir, tokenizer):
    """After an update the plan's kept lines match the learners' real tensors: fp32, pure bfloat16, LoRA."""
    for overrides in ({}, {"model__dtype": "bfloat16"}, {"model__lora": {"r": 4}, "model__dtype": "bfloat16"}):
        config = cory(**overrides, env__batch_size=4, ppo__batching__mini_batch_size=4, ppo__batching__ppo_epochs=1)
        plan = plan_memory(config, identity)
        learners, reference = learners_from_config(config, tokenizer)
        for learner in learners.values():
            learner.act({"prompt": ["the film was", "i think", "what a", "it is"]})
            learner.finish(np.zeros(4))
            learner.update()
        kept = {line.name: line.bytes for line in plan.kept}
        models = {id(learner.model): learner.model for learner in learners.values()}
        weights = sum(p.numel() * p.element_size() for m in models.values() for n, p in m.named_parameters()
                      if "lora_" not in n)  # fmt: skip
        adapters = sum(p.numel() * p.element_size() for m in models.values() for n, p in m.named_parameters()
                       if "lora_" in n)  # fmt: skip
        assert kept["weights"] == weights, overrides
        assert kept["adapters"] == adapters, overrides
        assert kept["reference"] == (0 if reference is None else sum(
            p.numel() * p.element_size() for p in reference.parameters()))  # fmt: skip
        heads = {id(p) for learner in learners.values() for p in learner.value_head.parameters()}
        state = sum(t.numel() * t.element_size() for learner in learners.values()
                    for p, s in learner.optimizer.state.items() if id(p) not in heads
                    for t in s.values() if torch.is_tensor(t) and t.dim() > 0)  # fmt: skip
        assert kept["optimiser"] == state, overrides
        # Gradients are freed when an update ends: the plan counts one learner's, while it updates.
        assert all(p.grad is None for learner in learners.values() for p in learner.model.parameters())
        assert plan.update[0].name == "gradients" and plan.update[0].bytes == state / 2 / len(learners)


def test_levers_are_listed_when_the_run_does_not_fit(cory):
    config = cory()
    plan = plan_memory(config, identity, capacity=CPU_RUNTIME_BYTES + 1, device="cpu")
    assert plan.fits is False and plan.levers
    levers = dict(plan.levers)
    assert levers["model.dtype: bfloat16"] < plan.peak
    assert levers["ppo.compute.gradient_checkpointing: true"] < plan.peak
    assert any(name.startswith("model.lora") for name in levers)
    assert [peak for _, peak in plan.levers] == sorted(peak for _, peak in plan.levers)
    assert plan_memory(config, identity, capacity=1e15).levers == []


def test_prompt_length_follows_the_templates(cory):
    config = cory(task__query_max_tokens=8, generation__max_new_tokens=16)
    templates = config.role_templates()
    literal = len(templates["observer"].replace("{query}", "").replace("{pioneer}", ""))
    assert prompt_tokens(config) == 8 * templates["observer"].count("{query}") + 16 + -(-literal // 3)


def test_the_plan_follows_the_levers(cory):
    base = plan_memory(cory(), identity)
    chunked = plan_memory(cory(ppo__compute__logits_chunk_rows=1), identity)
    assert chunked.update[2].bytes < base.update[2].bytes
    checkpointed = plan_memory(cory(ppo__compute__gradient_checkpointing=True), identity)
    assert checkpointed.update[1].bytes < base.update[1].bytes
    half = plan_memory(cory(model__reference_dtype="bfloat16"), identity)
    assert half.kept[3].bytes == base.kept[3].bytes / 2


def test_cli_prints_the_plan_and_refuses_a_bad_device(tmp_path, cory, tiny_lm_dir, tiny_classifier_dir, reviews_file,
                                                      capsys):  # fmt: skip
    import yaml

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cory_data(tiny_lm_dir, tiny_classifier_dir, reviews_file)))
    assert main(["plan", str(path), "env.batch_size=8", "--device", "0.0001"]) == 0
    out = capsys.readouterr().out
    assert "batch 8" in out and "does NOT fit" in out and "levers" in out and "model.dtype: bfloat16" in out
    assert main(["plan", str(path), "--device", "tpu"]) == 2
    assert "--device must be cpu, cuda or a finite number of GiB above 0, got 'tpu'" in capsys.readouterr().err


# --- the runs the plan once misread: games, checkpointing, processed logits, LoRA on a CPU, bad flags --------------


def word_tokenizer(size: int) -> PreTrainedTokenizerFast:
    """One token per word ``w0 … w<size-2>`` (and EOS): prompts of exactly as many tokens as words."""
    words = ["<|endoftext|>", *(f"w{i}" for i in range(size - 1))]
    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token=words[0]))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=words[0], pad_token=words[0])


def word_prompts(rows: int, words: int) -> list[str]:
    """``rows`` prompts of ``words`` words, the first a quarter shorter (left padding, as real batches have)."""
    generator = np.random.default_rng(0)
    lengths = [words - words // 4] + [words] * (rows - 1)
    return [" ".join(f"w{i}" for i in generator.integers(0, 200, n)) for n in lengths]


def arithmetic_data(model_dir: Path, batch: int, new_tokens: int, **top) -> dict:
    """A one-learner PPO config on the arithmetic task (no dataset, no reward model) as YAML data; ``top`` as in
    :func:`~tests.test_durable_runs.cory_data` (``ppo__compute__gradient_checkpointing=True``)."""
    data = {
        "name": "plan", "seed": 0, "iterations": 1,
        "model": {"name_or_path": str(model_dir), "device": "cpu"},
        "task": {"name": "arithmetic", "num_problems": 10, "eval_problems": 2},
        "env": {"roles": ["pioneer"], "templates": {"pioneer": "{query}"}, "batch_size": batch},
        "agents": {"learners": ["llm1"], "reward_coefficients": None, "role_period": None},
        "ppo": {"batching": {"mini_batch_size": batch, "ppo_epochs": 1}},
        "generation": {"min_new_tokens": new_tokens, "max_new_tokens": new_tokens, "stop_at_eos": False,
                       "top_k": 0, "top_p": 1.0},
        "logging": {"tensorboard": False, "eval_queries": 0},
    }  # fmt: skip
    return with_settings(data, top)


def tensor_peak(run) -> int:
    """The most bytes of CPU tensors that ``run()`` allocates and holds at once (torch's profiler)."""
    activity = torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity], profile_memory=True) as profiler:
        run()
    events = sorted(
        (event.start_ns(), event.nbytes())
        for event in profiler.profiler.kineto_results.events()
        if event.name() == "[memory]" and str(event.device_type()).endswith("CPU")
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def update_lines(plan) -> float:
    """The update phase's tensors: its lines but the CPU heap's slack."""
    return sum(line.bytes for line in plan.update if line.name != "heap slack")


def kuhn_data(model_dir: Path) -> dict:
    data = yaml.safe_load((ROOT / "examples" / "games" / "kuhn_poker_offline.yaml").read_text())
    data["model"]["name_or_path"] = str(model_dir)
    return data


def test_a_game_is_planned_with_its_batch_and_measured_prompts_and_no_reward_model(
    tmp_path, tokenizer, monkeypatch, capsys
):
    """A game config's plan: game.batch_size rows (not env.batch_size's 256), prompts measured on the game's own
    rendered prompts (no --prompt-tokens asked for), no task reward model (the default task's is a hub id: offline
    it would fail), the game's rows per update."""
    pytest.importorskip("pyspiel")
    from marllm.games.build import game_env

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model_dir = tmp_path / "model"
    make_tiny_gpt2(tokenizer, n_positions=512).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    config = config_from_dict(kuhn_data(model_dir))
    assert config.env.batch_size == 256 and config.game.batch_size == 8
    plan = plan_memory(config, identity)
    lengths = game_lengths(config, load_tokenizer(str(model_dir)))
    env = game_env(config.game, config.game.batch_size, config.seed)
    env.reset(seed=config.seed)
    first = env.observe(env.agent_selection)["prompt"]
    assert len(first) == 8
    assert plan.summary["batch"] == 8 and plan.summary["prompt_tokens"] == lengths.prompt
    assert lengths.prompt >= max(len(ids) for ids in tokenizer(list(first))["input_ids"])
    assert "measured" in plan.summary["prompt_source"]
    shape = model_shape(str(model_dir))
    kv = next(line for line in plan.rollout if line.name == "kv cache")
    assert kv.bytes == 8 * (lengths.prompt + config.generation.max_new_tokens) * shape.kv_elements_per_token * 4
    reward = next(line for line in plan.kept if line.name == "reward model")
    assert reward.bytes == 0 and "game" in reward.note
    assert plan.summary["update_rows"] == 1  # ppo.batching.mini_batch_size: 1
    # --prompt-tokens still sets the prompts; the batch stays the game's and no reward model is read
    given = plan_memory(config, identity, prompt_length=40)
    assert given.summary["batch"] == 8 and given.summary["prompt_tokens"] == 40
    path = tmp_path / "kuhn.yaml"
    path.write_text(yaml.safe_dump(kuhn_data(model_dir)))
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "batch 8" in out and "measured on a batch of 8" in out and "--prompt-tokens" not in out


def test_checkpointed_activations_count_the_layer_recomputed_in_the_backward(tmp_path, tokenizer):
    """Under gradient checkpointing a backward holds each layer's input and the activations of the layer it
    recomputes: the plan's activations cover what a real forward and backward hold (within 35%)."""
    rows, tokens = 4, 128
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=384, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp_path)
    data = arithmetic_data(tmp_path, rows, 16, ppo__compute__gradient_checkpointing=True)
    plan = plan_memory(config_from_dict(data), identity, prompt_length=tokens - 16)
    planned = next(line.bytes for line in plan.update if line.name == "activations")
    model.eval()
    enable_gradient_checkpointing(model)
    ids = torch.randint(1, 100, (rows, tokens))
    mask = torch.ones_like(ids)
    mask[0, : tokens // 4] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    trunk = model.get_decoder()

    def forward_backward() -> None:
        trunk(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False
        ).last_hidden_state.sum().backward()

    forward_backward()  # the gradients' buffers, which the peak below then reuses
    gradients = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    model.zero_grad(set_to_none=True)
    measured = tensor_peak(forward_backward) - gradients
    assert measured <= planned <= 1.35 * measured, (planned / 2**20, measured / 2**20)


@pytest.mark.parametrize(
    ("dtype", "generation"),
    [("bfloat16", {"temperature": 0.7}), ("float32", {"logprobs_from": "sampling", "temperature": 0.7})],
)
def test_an_update_counts_the_float32_copies_of_processed_logits(tmp_path, dtype, generation):
    """With generation.temperature != 1 or logprobs_from: sampling, the log-probs process float32 copies of the
    logits (half-precision ones widened first): an update pass's peak, on a model whose logits dwarf the rest, is
    what the plan's update lines say (within 30%)."""
    rows, words, new_tokens = 8, 16, 64
    tokenizer = ready_for_generation(word_tokenizer(8192))
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=8192, n_positions=256, n_embd=32, n_layer=2, n_head=2,
                               bos_token_id=0, eos_token_id=0, pad_token_id=0)).save_pretrained(tmp_path)  # fmt: skip
    data = arithmetic_data(tmp_path, rows, new_tokens, model__dtype=dtype, generation={
        **arithmetic_data(tmp_path, rows, new_tokens)["generation"], **generation})  # fmt: skip
    config = config_from_dict(data)
    planned = update_lines(plan_memory(config, identity, prompt_length=words))
    learners, _ = learners_from_config(config, tokenizer)
    learner = learners["llm1"]
    prompts = word_prompts(rows, words)
    for iteration in range(2):  # the second update: Adam's moments exist, as in every update but the first
        learner.act({"prompt": prompts})
        learner.finish(np.zeros(rows))
        measured = tensor_peak(learner.update) if iteration else learner.update()
    assert measured <= planned <= 1.3 * measured, (planned / 2**20, measured / 2**20)


LORA_RUN = textwrap.dedent(
    """
    import json, sys
    import numpy as np, peft, torch, transformers  # imported before the baseline, as a run's process has them
    from transformers import PreTrainedTokenizerFast
    from marllm.config import config_from_dict
    from marllm.models.policy import ready_for_generation
    from marllm.run.learners import learners_from_config

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

    torch.set_num_threads(1)
    torch.manual_seed(0)
    data, prompts = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    config = config_from_dict(data)
    tokenizer = ready_for_generation(PreTrainedTokenizerFast.from_pretrained(config.model.name_or_path))
    learner = learners_from_config(config, tokenizer)[0]["llm1"]
    with torch.no_grad():  # the weights read once: resident, as the kept part of the plan counts them
        sum(float(p.float().sum()) for p in learner.model.parameters())
    baseline = status("VmRSS")
    for _ in range(2):
        learner.act({"prompt": prompts})
        learner.finish(np.zeros(len(prompts)))
        learner.update()
    print(json.dumps({"peak": status("VmHWM") - baseline}))
    """
)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the resident memory from /proc")
def test_a_lora_run_on_a_cpu_is_planned_within_a_fifth_of_its_resident_memory(tmp_path):
    """A LoRA run of SmolLM2's kind (Llama, adapters on q_proj and v_proj, float32, batch 32) on a CPU holds more
    resident memory than its tensors: malloc keeps the blocks its passes freed. What its iterations add to the
    learner once built (weights resident) is the plan's larger phase, within 20%."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = word_tokenizer(8192)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(
        vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
        pad_token_id=0)).save_pretrained(tmp_path)  # fmt: skip
    tokenizer.save_pretrained(tmp_path)
    lora = {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    data = arithmetic_data(tmp_path, 32, 16, model__lora=lora, generation__repetition_penalty=1.1)
    plan = plan_memory(config_from_dict(data), identity, prompt_length=8)
    planned = max(plan.rollout_bytes, plan.update_bytes)
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", LORA_RUN, json.dumps(data), json.dumps(word_prompts(32, 8))],
                          capture_output=True, text=True, env=environment, cwd=ROOT, check=True)  # fmt: skip
    measured = json.loads(done.stdout.strip().splitlines()[-1])["peak"]
    assert 0.8 <= planned / measured <= 1.2, (planned / 2**20, measured / 2**20)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--prompt-tokens", "0"], "--prompt-tokens must be a whole number of tokens >= 1, got 0"),
        (["--prompt-tokens", "-5"], "--prompt-tokens must be a whole number of tokens >= 1, got -5"),
        (["--device", "inf"], "--device must be cpu, cuda or a finite number of GiB above 0, got 'inf'"),
        (
            ["--prompt-tokens", "5000"],
            "--prompt-tokens 5000: with 16 new tokens (generation.max_new_tokens) a "
            "sequence of 5016 tokens exceeds the model context of 128 tokens; give "
            "--prompt-tokens 112 or less",
        ),  # fmt: skip
    ],
)
def test_cli_refuses_flags_out_of_range_in_one_line(tmp_path, tiny_lm_dir, flags, message, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(arithmetic_data(tiny_lm_dir, 4, 16)))
    assert main(["plan", str(path), *flags]) == 2
    err = capsys.readouterr().err
    assert err == f"marllm: config error: {message}\n"


def test_cli_says_in_one_line_that_the_model_directory_is_missing_or_not_a_model(tmp_path, capsys):
    path = tmp_path / "config.yaml"
    (tmp_path / "empty").mkdir()
    for model, says in ((tmp_path / "absent", "does not exist"), (tmp_path / "empty", "has no config.json")):
        path.write_text(yaml.safe_dump(arithmetic_data(model, 4, 16)))
        assert main(["plan", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("marllm: config error: model.name_or_path: ") and says in err
        assert err.count("\n") == 1


def test_a_game_played_as_sequences_is_planned_a_row_per_seats_game(tmp_path, tokenizer, monkeypatch):
    """With game.history: sequence a row is a seat's game: its first prompt, then its later observations and every
    answer as the response; a learner's rows are its sequences."""
    pytest.importorskip("pyspiel")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model_dir = tmp_path / "model"
    make_tiny_gpt2(tokenizer, n_positions=512).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = kuhn_data(model_dir)
    data["game"]["history"] = "sequence"
    config = config_from_dict(data)
    lengths = game_lengths(config, load_tokenizer(str(model_dir)))
    first, observed, answers, sequences = lengths.sequence
    assert first <= lengths.prompt and observed > 0 and answers >= 2  # Kuhn: a seat answers once or twice
    assert sequences == config.game.batch_size * 2  # self-play: one learner in both seats
    plan = plan_memory(config, identity)
    assert plan.summary["prompt_tokens"] == first and "one token sequence per seat" in plan.summary["prompt_source"]
    assert config_from_dict(kuhn_data(model_dir)).game.history == "prompt"
