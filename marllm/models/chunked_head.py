"""The LM head applied chunk by chunk of rows, its logits recomputed in the backward: an update's vocabulary-wide
memory is one chunk's logits instead of the whole pass's.

A forward over prompt and response normally projects every response position onto the vocabulary at once: (rows ×
response tokens × vocabulary) logits, which autograd keeps until the backward (the log-probs' backward writes their
gradient over them). With Qwen2.5's 151,936-token vocabulary, 32 rows of 64 tokens are 1.2 GiB of float32 logits.
:func:`head_deferred` makes the model's forward return the hidden states its head would have read, and
:func:`chunked_head_logprobs` projects them a few rows at a time: each chunk's logits live only while its log-probs
are computed, and again in the backward while its gradient is, which goes into one gradient buffer for the hidden
states and one for the head's weight (a checkpoint per chunk would make a weight-sized gradient per chunk and sum
them). The peak is one chunk's logits and their gradient. The numbers are those of the whole pass up to the rounding
of matrix products over fewer rows.

This needs a model whose logits are its output embeddings applied to the hidden state they read, nothing after
(:func:`check_plain_head` refuses one that soft-caps or scales its logits).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from transformers import PreTrainedModel

from marllm.models.float32_products import needs_float32_products

__all__ = ["check_plain_head", "chunked_head_logprobs", "head_deferred", "writable_in_place"]


def writable_in_place(logits: torch.Tensor) -> bool:
    """Whether a function of the logits may overwrite them: not when they are a leaf that requires grad (the chunked
    head's backward recomputes a chunk's logits as such a leaf, to take their gradient)."""
    return not (logits.is_leaf and logits.requires_grad)


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
            f"{owner}: ppo.compute.logits_chunk_rows needs a model whose logits are its LM head applied to the last "
            f"hidden state; {type(model).__name__} changes them after its head (soft-capping or scaling): set "
            "ppo.compute.logits_chunk_rows: null"
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
    (the forward's autocast). Differentiable with respect to ``hidden`` and every trainable parameter of the head:
    the backward recomputes each chunk's logits, takes their gradient through ``logprobs_of_rows``, and adds the
    chunk's share to one gradient buffer per input, so that only one chunk's logits and their gradient are alive at a
    time.

    A plain ``torch.nn.Linear`` head has its weight gradient summed in place over the chunks (no weight-sized
    temporary per chunk). Any other head module (peft's LoRA layers on the head, a wrapper that keeps a trained copy)
    is applied as it is, adapters included, and differentiated by autograd chunk by chunk: the gradient reaches
    every trainable parameter it holds, and the gradient into ``hidden`` goes through the whole module.
    """
    parameters = [p for p in head.parameters() if p.requires_grad]
    logprobs, entropy = _ChunkedHead.apply(hidden, head, chunk_rows, logprobs_of_rows, head_context, *parameters)
    return logprobs, entropy


def _is_plain_linear(head: torch.nn.Module) -> bool:
    return type(head) is torch.nn.Linear


class _ChunkedHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, head, chunk_rows, logprobs_of_rows, head_context, *parameters):  # type: ignore[override]
        ctx.save_for_backward(hidden)
        ctx.settings = (head, chunk_rows, logprobs_of_rows, head_context, parameters)
        parts = []
        with torch.no_grad():
            for rows in _row_chunks(hidden.shape[0], chunk_rows):
                with head_context():
                    logits = head(hidden[rows])
                parts.append(logprobs_of_rows(logits, rows))
                del logits
        logprobs, entropy = zip(*parts, strict=True)
        entropy = torch.cat(entropy)
        ctx.mark_non_differentiable(entropy)
        return torch.cat(logprobs), entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logprobs, _grad_entropy):  # type: ignore[override]
        (hidden,) = ctx.saved_tensors
        head, chunk_rows, logprobs_of_rows, head_context, parameters = ctx.settings
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        chunks = _row_chunks(hidden.shape[0], chunk_rows)
        if _is_plain_linear(head):
            parameter_grads = _plain_linear_backward(
                head, hidden, grad_hidden, grad_logprobs, chunks, logprobs_of_rows, head_context, parameters
            )
        else:
            parameter_grads = _module_backward(
                head, hidden, grad_hidden, grad_logprobs, chunks, logprobs_of_rows, head_context, parameters
            )
        return (grad_hidden, None, None, None, None, *parameter_grads)


def _chunk_logits_gradient(logits: torch.Tensor, rows: slice, grad_logprobs: torch.Tensor, logprobs_of_rows):
    """The gradient of the chunk's log-probs with respect to ``logits``, a leaf that requires grad: whatever
    ``logprobs_of_rows`` does to it before the log-softmax must be out of place (:func:`writable_in_place`)."""
    with torch.enable_grad():
        logprobs, _ = logprobs_of_rows(logits, rows)
        (grad_logits,) = torch.autograd.grad(logprobs, logits, grad_logprobs[rows])
    return grad_logits


def _plain_linear_backward(head, hidden, grad_hidden, grad_logprobs, chunks, logprobs_of_rows, head_context, params):
    weight, bias = head.weight, head.bias
    compute = _product_dtype(weight)
    # Summed in place over the chunks (addmm_), in the products' dtype: no weight-sized temporary per chunk.
    grad_weight = torch.zeros_like(weight, dtype=compute) if weight.requires_grad else None
    grad_bias = torch.zeros_like(bias) if bias is not None and bias.requires_grad else None
    weight_compute = weight.detach().to(compute)
    for rows in chunks:
        states = hidden[rows].detach()
        with torch.no_grad(), head_context():
            # contiguous(): a linear over (b, L, H) returns a view made under no_grad, which autograd refuses to
            # let anything modify in place once it requires grad
            logits = head(states).contiguous().requires_grad_(True)
        grad_logits = _chunk_logits_gradient(logits, rows, grad_logprobs, logprobs_of_rows)
        del logits
        flat = grad_logits.reshape(-1, grad_logits.shape[-1]).to(compute)  # (n, V)
        if grad_hidden is not None:
            grad_hidden[rows] = (flat @ weight_compute).view_as(states).to(hidden.dtype)
        if grad_weight is not None:
            grad_weight.addmm_(flat.T, states.reshape(-1, states.shape[-1]).to(compute))
        if grad_bias is not None:
            grad_bias += flat.sum(0).to(bias.dtype)
        del grad_logits, flat
    by_parameter = {id(weight): None if grad_weight is None else grad_weight.to(weight.dtype), id(bias): grad_bias}
    return tuple(by_parameter[id(p)] for p in params)


def _module_backward(head, hidden, grad_hidden, grad_logprobs, chunks, logprobs_of_rows, head_context, params):
    grads: list[torch.Tensor | None] = [None] * len(params)
    for rows in chunks:
        with torch.enable_grad():
            states = hidden[rows].detach().requires_grad_(grad_hidden is not None)
            with head_context():
                logits = head(states)
            logprobs, _ = logprobs_of_rows(logits, rows)
            inputs = ([states] if grad_hidden is not None else []) + list(params)
            chunk_grads = torch.autograd.grad(logprobs, inputs, grad_logprobs[rows], allow_unused=True)
        del logits, logprobs
        if grad_hidden is not None:
            grad_hidden[rows] = chunk_grads[0].to(hidden.dtype)
            chunk_grads = chunk_grads[1:]
        for i, grad in enumerate(chunk_grads):
            if grad is not None:
                grads[i] = grad if grads[i] is None else grads[i].add_(grad)
    return tuple(grads)


def _row_chunks(rows: int, chunk_rows: int) -> list[slice]:
    return [slice(start, start + chunk_rows) for start in range(0, rows, chunk_rows)]


def _product_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype the backward's products run in: the weight's, or float32 for a bfloat16 weight on a CPU without
    bfloat16 instructions (:mod:`marllm.models.float32_products`)."""
    return torch.float32 if needs_float32_products(weight.dtype, weight.device) else weight.dtype
