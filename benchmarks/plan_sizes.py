"""``marllm plan`` at the sizes users train: Qwen2.5-0.5B, 1.5B and 7B (their published shapes, configs only) under
CORY with two learners, in the precisions and with the levers a user can set, against GPUs of 24, 40 and 80 GiB.

Estimates, not measurements: the plan's arithmetic (:mod:`marllm.run.plan`), with activations measured on two-layer
copies on this CPU. On a GPU the caching allocator and the CUDA context add to these figures.

    .venv/bin/python benchmarks/plan_sizes.py [--batch 64] [--new-tokens 64] [--prompt-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from marllm.config import load_config
from marllm.run.plan import plan_memory

CONFIG = Path(__file__).with_name("configs") / "workload_cory.yaml"
# The published configs of Qwen/Qwen2.5-0.5B, -1.5B and -7B (config.json on the hub), the fields the shape needs.
SHAPES = {
    "0.5B": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True},
    "1.5B": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True},
    "7B": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
           "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False},
}  # fmt: skip
SETTINGS = {
    "float32, full": [],
    "bfloat16, full": ["model.dtype=bfloat16"],
    "bfloat16, full, checkpointing, logits by 4 rows": [
        "model.dtype=bfloat16", "ppo.compute.gradient_checkpointing=true", "ppo.compute.logits_chunk_rows=4"],
    "LoRA r=16 on bfloat16": ["model.dtype=bfloat16", "model.lora={r: 16}"],
    "LoRA r=16 on bfloat16, checkpointing, logits by 4 rows": [
        "model.dtype=bfloat16", "model.lora={r: 16}", "ppo.compute.gradient_checkpointing=true",
        "ppo.compute.logits_chunk_rows=4"],
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64, help="env.batch_size = ppo.batching.mini_batch_size")
    parser.add_argument("--new-tokens", type=int, default=64, help="generation.max_new_tokens")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--sizes", nargs="+", choices=list(SHAPES), default=list(SHAPES), help="the shapes to plan")
    parser.add_argument("--settings", nargs="+", type=int, help="the settings to plan, by their row number from 0")
    args = parser.parse_args()
    common = [f"env.batch_size={args.batch}", f"ppo.batching.mini_batch_size={args.batch}",
              f"generation.max_new_tokens={args.new_tokens}"]  # fmt: skip
    print(f"CORY, 2 learners, batch {args.batch}, prompts of {args.prompt_tokens} + {args.new_tokens} new tokens, "
          "update passes of 32 rows (ppo.compute.micro_batch_size: auto); estimated peak GiB on one GPU")  # fmt: skip
    print(f"{'size':<6}{'setting':<58}{'peak GiB':>9}   fits 24 / 40 / 80 GiB")
    with tempfile.TemporaryDirectory() as folder:
        for size, shape in ((size, SHAPES[size]) for size in args.sizes):
            directory = Path(folder) / size
            directory.mkdir()
            (directory / "config.json").write_text(json.dumps({"model_type": "qwen2", "architectures": [
                "Qwen2ForCausalLM"], "max_position_embeddings": 32768, **shape}))  # fmt: skip
            chosen = list(SETTINGS.items())
            for name, overrides in (chosen if args.settings is None else [chosen[i] for i in args.settings]):
                config = load_config(CONFIG, [f"model.name_or_path={directory}", *common, *overrides])
                plan = plan_memory(config, str, device="cuda", prompt_length=args.prompt_tokens, with_levers=False)
                gib = plan.peak / 1024**3
                fits = " / ".join("yes" if gib <= capacity else "no" for capacity in (24, 40, 80))
                print(f"{size:<6}{name:<58}{gib:>9.1f}   {fits}", flush=True)


if __name__ == "__main__":
    main()
