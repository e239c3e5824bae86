"""The LM head applied chunk by chunk of rows, its logits recomputed in the backward: an update's vocabulary-wide
memory is one chunk's logits instead of the whole pass's.

A forward over prompt and response normally projects every response position onto the vocabulary at once: (rows ×
response tokens × vocabulary) logits, which autograd keeps until the backward (the log-probs' backward writes their
gradient over them). With Qwen2.5's 151,936-token vocabulary, 32 rows of 64 tokens are 1.2 GiB of float32 logits.
:func:`head_deferred` makes the model's forward return the hidden states its head would have read, and
:func:`chunked_head_logprobs` projects them a few rows at a time inside :func:`torch.utils.checkpoint.checkpoint`:
each chunk's logits live only while its log-probs are computed, and again while its gradient is, so the peak is one
chunk's logits (and their gradient, written in their place). The numbers are those of the whole pass up to the
rounding of a matrix product over fewer rows.

This needs a model whose logits are its output embeddings applied to the hidden state they read, nothing after
(:func:`check_plain_head` refuses one that soft-caps or scales its logits).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

__all__ = ["check_plain_head", "chunked_head_logprobs", "head_deferred"]


@contextlib.contextmanager
def head_deferred(model: PreTrainedModel) -> Iterator[torch.nn.Module]:
    """While open, ``model``'s output embeddings return their input: the model's "logits" are the hidden states the
    head would have projected (at the positions it would have kept), with their autograd history. Yields the head.
    Forward pre-hooks on the head (a value head reading its input) still see the hidden states."""
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embeddings (LM head) to apply by chunks")
    head.forward = lambda hidden: hidden  # an instance attribute: nn.Module.__call__ looks it up first
    try:
        yield head
    finally:
        del head.forward


def check_plain_head(model: PreTrainedModel, owner: str) -> None:
    """Raise ``ValueError`` unless ``model``'s logits are its head applied to the hidden state (checked on one short
    forward: the logits of the model and those of the head over :func:`head_deferred`'s output must agree)."""
    parameter = next(model.parameters())
    ids = torch.arange(1, 5, device=parameter.device).unsqueeze(0) % max(2, model.config.get_text_config().vocab_size)
    training = model.training
    model.eval()  # without dropout: the two forwards must see the same function
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits
            with head_deferred(model) as head:
                hidden = model(input_ids=ids, use_cache=False).logits
            projected = head(hidden.to(head.weight.dtype))
    finally:
        model.train(training)
    if projected.shape != logits.shape or not torch.allclose(projected.float(), logits.float(), rtol=1e-3, atol=1e-3):
        raise ValueError(
            f"{owner}: ppo.logits_chunk_rows needs a model whose logits are its LM head applied to the last hidden "
            f"state; {type(model).__name__} changes them after its head (soft-capping or scaling): set "
            "ppo.logits_chunk_rows: null"
        )


def chunked_head_logprobs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    chunk_rows: int,
    logprobs_of_rows: Callable[[torch.Tensor, slice], tuple[torch.Tensor, torch.Tensor]],
    head_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies (B, L) from ``hidden`` (B, L, H), ``chunk_rows`` rows at a time.

    ``logprobs_of_rows(logits, rows)`` turns the logits (b, L, V) of the rows ``rows`` into their (log-probs,
    entropies), as the whole pass would (processing, restriction, log-softmax); the head runs in ``head_context()``
    (the forward's autocast). Each chunk runs under a non-reentrant checkpoint: its logits are freed after the
    forward and recomputed for its backward.
    """

    def chunk(rows: slice) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        def project(states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            with head_context():
                logits = head(states)
            return logprobs_of_rows(logits, rows)

        return project

    parts = []
    for start in range(0, hidden.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        states = hidden[rows]
        if torch.is_grad_enabled() and states.requires_grad:
            parts.append(checkpoint(chunk(rows), states, use_reentrant=False))
        else:
            parts.append(chunk(rows)(states))
    logprobs, entropy = zip(*parts, strict=True)
    return torch.cat(logprobs), torch.cat(entropy)
