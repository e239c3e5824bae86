"""Seconds per iteration, history tokens processed and peak memory of multi-turn games played from re-rendered
prompts (``game.history: prompt``) and as one token sequence per seat (``game.history: sequence``), per round count.

Each cell trains the example config with ``marllm train`` in a process of its own (so that its peak resident memory
is its own) on a random-weight Llama whose context holds the longest game, with the embedded base's tokenizer:
Deal or no deal (``examples/deal_or_no_deal``) at 2, 4 and 8 rounds and the iterated prisoner's dilemma (OpenSpiel's
``repeated_game``) at 5 and 20 rounds, both in free text (``game.actions: generate``) with ``game.illegal: random``,
so that an unreadable answer plays a random move and games run their rounds (a Deal or no deal game still ends early
where a random proposal accepts). Figures are the mean over the iterations after the first (the first warms up).
History tokens are the tokens every forward of the policy and the reference reads (generation's prefill and decode
steps, the rollout's scoring and the update's epochs; padding included), counted at the input embedding.

    .venv/bin/python benchmarks/bench_sequences.py [--shape small|smollm2] [--games 8] [--iterations 3]
        [--only deal] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPES = {
    # SmolLM2-135M's (LlamaConfig of HuggingFaceTB/SmolLM2-135M-Instruct), its vocabulary the embedded tokenizer's
    "smollm2": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                "num_key_value_heads": 3},
    "small": {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4, "num_attention_heads": 4,
              "num_key_value_heads": 2},
}  # fmt: skip
GAMES = {
    "deal": ("examples/deal_or_no_deal/deal_or_no_deal_offline.yaml", "rounds", (2, 4, 8)),
    "ipd": ("examples/games/ipd_offline.yaml", "num_repetitions", (5, 20)),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--games", type=int, default=8, help="games per iteration")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--only", choices=sorted(GAMES), default=None)
    parser.add_argument("--rounds", type=int, nargs="*", default=None, help="round counts (default: the game's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cell", nargs=4, metavar=("GAME", "ROUNDS", "HISTORY", "MODEL"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def save_model(shape: str, directory: Path) -> Path:
    """A random Llama of ``shape`` with the embedded base's tokenizer and an 8,192-token context, saved."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from marllm.assets import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("marllm:offline-base"))
    config = LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=8192, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **SHAPES[shape],
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.generation_config.bos_token_id = model.generation_config.eos_token_id = None
    path = directory / shape
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def overrides(game: str, rounds: int, history: str, model: str, games: int, iterations: int) -> list[str]:
    config, option, _ = GAMES[game]
    common = [
        f"model.name_or_path={model}", f"iterations={iterations}", f"game.batch_size={games}",
        "game.actions=generate", "game.illegal=random", f"game.history={history}", "logging.progress=false",
        f"logging.checkpoint_every={iterations}", f"ppo.batching.mini_batch_size={games}",
        "ppo.batching.last_minibatch=merge", "generation.max_new_tokens=8", "generation.min_new_tokens=4",
    ]  # fmt: skip
    if game == "deal":
        return [str(ROOT / config), f"game.options.{option}={rounds}", *common]
    name = f"openspiel:repeated_game(stage_game=matrix_pd(),num_repetitions={rounds})"
    return [str(ROOT / config), f"game.name={name}", *common]


def run_cell(game: str, rounds: int, history: str, model: str, games: int, iterations: int) -> dict[str, float]:
    """Train one cell here, counting the tokens each input embedding reads; its figures."""
    import torch

    from marllm.cli import main

    counted = {"tokens": 0}
    original = torch.nn.Embedding.forward

    def counting(self: torch.nn.Embedding, input: torch.Tensor) -> torch.Tensor:
        counted["tokens"] += input.numel()
        return original(self, input)

    torch.nn.Embedding.forward = counting  # the Llama's only embedding is its input one
    with tempfile.TemporaryDirectory() as run_dir:
        main(["train", *overrides(game, rounds, history, model, games, iterations), "--run-dir", run_dir])
        rows = [json.loads(line) for line in Path(run_dir, "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in rows if "time/iteration_s" in row][1:]
    mean = lambda key: sum(row.get(key, 0.0) for row in rows) / len(rows)  # noqa: E731
    lengths = [value for key, value in rows[-1].items() if key.endswith("game/game_length")]
    return {
        "s_per_iteration": mean("time/iteration_s"),
        "generation_s": mean("time/generation_s"),
        "forward_s": mean("time/forward_s"),
        "update_s": mean("time/update_s"),
        "tokens_per_iteration": counted["tokens"] / iterations,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "game_length": lengths[0] if lengths else float("nan"),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.cell:
        game, rounds, history, model = args.cell
        figures = run_cell(game, int(rounds), history, model, args.games, args.iterations)
        print("CELL " + json.dumps(figures))
        return
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    print(f"shape {args.shape}, {args.games} games an iteration, {args.iterations} iterations (the first not counted)")
    header = (
        "| game | rounds | history | s/iteration | generation s | forward s | update s | history tokens | peak RSS MiB "
        "| moves/game |"
    )
    failed = 0
    with tempfile.TemporaryDirectory() as directory:
        model = save_model(args.shape, Path(directory))
        print(header)
        print("|---" * (header.count("|") - 1) + "|")
        for game, (_, _, default_rounds) in GAMES.items():
            if args.only and game != args.only:
                continue
            for rounds in args.rounds or default_rounds:
                for history in ("prompt", "sequence"):
                    command = [sys.executable, __file__, "--cell", game, str(rounds), history, str(model),
                               "--games", str(args.games), "--iterations", str(args.iterations)]  # fmt: skip
                    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
                    lines = [line for line in done.stdout.splitlines() if line.startswith("CELL ")]
                    if done.returncode or not lines:
                        print(f"| {game} | {rounds} | {history} | failed: {done.stderr.strip().splitlines()[-1:]} |")
                        failed += 1
                        continue
                    f = json.loads(lines[-1][5:])
                    print(
                        f"| {game} | {rounds} | {history} | {f['s_per_iteration']:.2f} | {f['generation_s']:.2f} | "
                        f"{f['forward_s']:.2f} | {f['update_s']:.2f} | {f['tokens_per_iteration']:,.0f} | "
                        f"{f['peak_rss_mib']:,.0f} | {f['game_length']:.1f} |",
                        flush=True,
                    )
    if failed:
        sys.exit(f"{failed} cell(s) failed")


if __name__ == "__main__":
    main()
