"""The update's logits path on a real vocabulary: LM head, log-probs and their backward, whole or by chunks of rows.

One update pass of a learner ends in the LM head: hidden states (rows × response tokens × hidden) projected onto the
vocabulary, the log-probs of the taken tokens (marllm's chunked log-softmax, whose backward writes the gradient over
the logits), and the backward into the hidden states and the head's weight. This times that path and measures its
peak resident memory above what the inputs and the head hold, in a fresh process per variant:

- ``whole``: the head applied to the whole pass at once (``ppo.compute.logits_chunk_rows: null``, the default);
- ``chunks of N``: :func:`marllm.models.chunked_head.chunked_head_logprobs` with N rows per chunk
  (``ppo.compute.logits_chunk_rows: N``).

Both make the head's weight gradient (vocabulary × hidden), counted with the model's other gradients; the last
column but one is the peak without it: the logits path proper.

The head has Qwen2.5-0.5B's shape by default (896 → 151,936, float32, random weights).

    .venv/bin/python benchmarks/bench_logits_path.py [--rows 16] [--tokens 16] [--chunks 1 4] [--hidden 896]
        [--vocab 151936] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch
from bench_memory_profile import hwm_mib, reset_hwm, rss_mib

from marllm.algorithms.core import logprobs_and_entropy
from marllm.models.chunked_head import chunked_head_logprobs
from marllm.models.devices import resolve_dtype


def run(args: argparse.Namespace, chunk: int | None) -> dict[str, float]:
    """One forward and backward of the path; peak RSS above the inputs', and seconds."""
    torch.manual_seed(0)
    dtype = resolve_dtype(args.dtype)
    head = torch.nn.Linear(args.hidden, args.vocab, bias=False).to(dtype)
    hidden = torch.randn(args.rows, args.tokens, args.hidden, dtype=dtype, requires_grad=True)
    tokens = torch.randint(0, args.vocab, (args.rows, args.tokens))

    def logprobs_of_rows(logits: torch.Tensor, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        return logprobs_and_entropy(logits, tokens[rows], overwrite_logits=True)

    def path() -> None:
        if chunk is None:
            logprobs, _ = logprobs_of_rows(head(hidden), slice(None))
        else:
            logprobs, _ = chunked_head_logprobs(head, hidden, chunk, logprobs_of_rows)
        logprobs.sum().backward()

    path()  # warm-up: the head's weight gradient and the allocator's first blocks
    hidden.grad = None
    head.weight.grad = None
    baseline = rss_mib()
    reset_hwm()
    started = time.perf_counter()
    path()
    seconds = time.perf_counter() - started
    return {"peak_above_inputs_mib": hwm_mib() - baseline, "seconds": seconds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16, help="rows of the update pass")
    parser.add_argument("--tokens", type=int, default=16, help="response tokens per row")
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--chunks", type=int, nargs="*", default=[1, 4], help="rows per chunk to compare")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(run(args, None if args.child == "whole" else int(args.child))))
        return
    logits_mib = args.rows * args.tokens * args.vocab * resolve_dtype(args.dtype).itemsize / 1024**2
    print(f"head {args.hidden} → {args.vocab:,} ({args.dtype}); pass of {args.rows} rows × {args.tokens} tokens: "
          f"one copy of its logits is {logits_mib:,.0f} MiB")  # fmt: skip
    # Both paths make the head's weight gradient (also what the model's other parameters' gradients are counted
    # with): the logits path proper is what the peak holds besides it.
    weight_grad_mib = args.hidden * args.vocab * resolve_dtype(args.dtype).itemsize / 1024**2
    print(f"{'path':<16}{'peak above inputs MiB':>24}{'of which not the weight gradient':>34}{'seconds':>10}")
    rows = []
    for variant in ["whole", *map(str, args.chunks)]:
        options = [f"--rows={args.rows}", f"--tokens={args.tokens}", f"--hidden={args.hidden}",
                   f"--vocab={args.vocab}", f"--dtype={args.dtype}", f"--child={variant}"]  # fmt: skip
        out = subprocess.run([sys.executable, __file__, *options], check=True, stdout=subprocess.PIPE, text=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        name = "whole" if variant == "whole" else f"chunks of {variant}"
        peak = row["peak_above_inputs_mib"]
        print(f"{name:<16}{peak:>24,.0f}{peak - weight_grad_mib:>34,.0f}{row['seconds']:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
