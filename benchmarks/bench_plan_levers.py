"""``marllm plan``'s estimate beside the peak resident memory of ``marllm train`` on the same config, on this CPU, for
the runs the plan reads differently from a plain text run: a game and gradient checkpointing (and, on request, the
LoRA run the plan once erred 17% low on).

Each case is an example config run on a random model built on the spot (nothing is downloaded; the weights do not
matter to memory):

- ``kuhn``: ``examples/games/kuhn_poker_offline.yaml`` (game.batch_size 8, free-text moves), on a random GPT-2 of
  4 layers × 256 with a word-level vocabulary of 8,192. The plan takes the game's batch and its prompts measured on a
  batch of games played with random moves, and no task reward model.
- ``checkpointing``: ``examples/ppo_arith_offline.yaml`` (batch 32, 64 new tokens, 4 PPO epochs) with
  ``ppo.compute.gradient_checkpointing: true``, on a random GPT-2 of 8 layers × 512, vocabulary 8,192; the longest
  prompt is given as ``--prompt-tokens`` would, from the task's problems rendered and tokenized (the arithmetic task
  does not bound its queries).
- ``lora-smollm2`` (not run by default: a few minutes): ``examples/ppo_smollm2.yaml`` (LoRA r = 16 on q_proj and
  v_proj, float32, batch 32, 4 PPO epochs) on a random model of SmolLM2-135M's shape (Llama: 30 layers × 576, 9
  heads, 3 key/value heads, 1,536 intermediate, 49,152 tokens), its reviews and sentiment classifier stood in for by
  random-word reviews and a random one-layer DistilBERT (``task.dataset``, ``task.reward_model``).

Each run is ``marllm train`` for ``--iterations`` iterations in a fresh process (its own ``ru_maxrss``; the parent
never holds a model, as Linux carries ``ru_maxrss`` into children); the plan is made as ``marllm plan`` makes it.

    .venv/bin/python benchmarks/bench_plan_levers.py [kuhn checkpointing lora-smollm2] [--iterations 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
QUIET = ["logging.tensorboard=false", "logging.eval_queries=0", "logging.samples_per_iteration=0"]
CASES: dict[str, dict[str, Any]] = {
    "kuhn": {
        "config": EXAMPLES / "games" / "kuhn_poker_offline.yaml",
        "model": {"kind": "gpt2", "n_layer": 4, "n_embd": 256, "n_head": 4, "vocab": 8192},
        "overrides": ["logging.checkpoint_every=null"],
    },
    "checkpointing": {
        "config": EXAMPLES / "ppo_arith_offline.yaml",
        "model": {"kind": "gpt2", "n_layer": 8, "n_embd": 512, "n_head": 8, "vocab": 8192},
        "overrides": [
            "ppo.compute.gradient_checkpointing=true",
            "logging.pass_at_k=null",
            "task.num_problems=200",
            "model.device=cpu",
        ],  # fmt: skip
        "prompt_from_task": True,
    },
    "lora-smollm2": {
        "config": EXAMPLES / "ppo_smollm2.yaml",
        "model": {
            "kind": "llama",
            "n_layer": 30,
            "n_embd": 576,
            "n_head": 9,
            "kv_heads": 3,
            "intermediate": 1536,
            "vocab": 49152,
        },  # fmt: skip
        "overrides": ["model.device=cpu"],
        "task_files": True,
    },
}
DEFAULT_CASES = ["kuhn", "checkpointing"]


def save_model(directory: str, spec: dict[str, Any]) -> None:
    """A random causal LM of ``spec``'s shape and a word-level tokenizer, saved to ``directory`` (run in a child)."""
    import torch
    from _models import save_random_model, word_tokenizer

    if spec.get("task_files"):
        save_task_files(str(Path(directory).parent), spec["vocab"])
    if spec["kind"] == "gpt2":
        save_random_model(directory, spec["vocab"], spec["n_layer"], spec["n_embd"], spec["n_head"], n_positions=1024)
        return
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = word_tokenizer(spec["vocab"])
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=spec["vocab"], hidden_size=spec["n_embd"], intermediate_size=spec["intermediate"],
        num_hidden_layers=spec["n_layer"], num_attention_heads=spec["n_head"], num_key_value_heads=spec["kv_heads"],
        max_position_embeddings=2048, tie_word_embeddings=True, bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    read_as_generic_tokenizer(Path(directory))


def save_task_files(folder: str, vocabulary: int) -> None:
    """``reviews.jsonl`` (random words, 64 reviews) and ``classifier/`` (a random one-layer DistilBERT with the
    word-level tokenizer, labels NEGATIVE/POSITIVE) in ``folder``: the sentiment task's data and reward model."""
    import numpy as np
    import torch
    from _models import word_tokenizer
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    generator = np.random.default_rng(0)
    rows = [{"text": " ".join(f"w{i}" for i in generator.integers(0, vocabulary - 20, 80)), "label": k % 2}
            for k in range(64)]  # fmt: skip
    (Path(folder) / "reviews.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    tokenizer = word_tokenizer(vocabulary)
    torch.manual_seed(0)
    config = DistilBertConfig(
        vocab_size=vocabulary, dim=16, hidden_dim=32, n_layers=1, n_heads=2, max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id, id2label={0: "NEGATIVE", 1: "POSITIVE"},
        label2id={"NEGATIVE": 0, "POSITIVE": 1},
    )  # fmt: skip
    DistilBertForSequenceClassification(config).save_pretrained(Path(folder) / "classifier")
    tokenizer.save_pretrained(Path(folder) / "classifier")
    read_as_generic_tokenizer(Path(folder) / "classifier")


def read_as_generic_tokenizer(directory: Path) -> None:
    """Have transformers read the word-level tokenizer saved in ``directory`` as it is, not as the architecture's own
    tokenizer class (which would rebuild it from files it does not have)."""
    settings = directory / "tokenizer_config.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "tokenizer_class": "TokenizersBackend"}))


def train_peak(config: str, overrides: list[str]) -> dict[str, float]:
    """``marllm train`` in this process (a child); its peak resident memory and seconds."""
    from marllm.cli import main

    started = time.perf_counter()
    status = main(["train", config, *overrides])
    if status != 0:
        raise SystemExit(status)
    return {"peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "seconds": time.perf_counter() - started}  # fmt: skip


def child(*arguments: str) -> dict[str, Any]:
    """This script with ``arguments`` in a fresh interpreter; the JSON it prints last."""
    done = subprocess.run([sys.executable, __file__, *arguments], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(arguments[:2])} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def task_prompt_tokens(config: Any, model: str) -> int:
    """The longest prompt of the config's text task in the model's tokens: each problem's query rendered by the
    pioneer's template (what ``--prompt-tokens`` would be given)."""
    from marllm.models.policy import load_tokenizer

    tokenizer = load_tokenizer(model)
    template = config.role_templates()[config.env.roles[0]]
    queries = config.task.load_split(config.task.split)["query"]
    return max(len(ids) for ids in tokenizer([template.format(query=q) for q in queries])["input_ids"])


def run_case(name: str, folder: Path, iterations: int) -> dict[str, Any]:
    """Plan and measure one case."""
    from marllm.assets import resolve_model
    from marllm.cli.plan import device_capacity
    from marllm.config import load_config
    from marllm.run.plan import plan_memory

    case = CASES[name]
    model = folder / f"{name}-model"
    child("--save-model", str(model), json.dumps({**case["model"], "task_files": case.get("task_files", False)}))
    overrides = [f"model.name_or_path={model}", *QUIET, *case["overrides"]]
    if case.get("task_files"):
        overrides += [f"task.dataset={folder / 'reviews.jsonl'}", f"task.reward_model={folder / 'classifier'}"]
    config = load_config(case["config"], overrides)
    prompt = task_prompt_tokens(config, str(model)) if case.get("prompt_from_task") else None
    kind, capacity = device_capacity("cpu")
    plan = plan_memory(config, resolve_model, capacity, kind, prompt, with_levers=False)
    measured = child("--train", str(case["config"]), json.dumps(
        [*overrides, f"iterations={iterations}", f"run_dir={folder / name}-run"]))  # fmt: skip
    return {"case": name, "plan": plan, "prompt_given": prompt, **measured}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", default=DEFAULT_CASES, help=f"cases: {', '.join(CASES)}")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--save-model", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--train", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.save_model:
        save_model(args.save_model[0], json.loads(args.save_model[1]))
        print("{}")
        return
    if args.train:
        print(json.dumps(train_peak(args.train[0], json.loads(args.train[1]))))
        return
    unknown = [name for name in args.cases if name not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; cases: {list(CASES)}")
    if args.iterations < 1:
        parser.error(f"--iterations must be >= 1, got {args.iterations}")
    from marllm.cli.plan import format_plan

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.cases:
            row = run_case(name, Path(folder), args.iterations)
            rows.append(row)
            given = "" if row["prompt_given"] is None else f" --prompt-tokens {row['prompt_given']}"
            print(f"== {name}: marllm plan{given}")
            print(format_plan(row["plan"]), flush=True)
            print()
    print(f"{'case':<16}{'plan MiB':>10}{'measured MiB':>14}{'plan/measured':>15}  phase   seconds")
    for row in rows:
        planned = row["plan"].peak / 1024**2
        print(f"{row['case']:<16}{planned:>10,.0f}{row['peak_mib']:>14,.0f}{planned / row['peak_mib']:>15.2f}  "
              f"{row['plan'].peak_phase:<8}{row['seconds']:.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
