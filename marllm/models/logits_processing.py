"""The log-probs' side of sampling: the logits processors responses are drawn through, applied again at every
response position so that the log-probs are those of the distributions the tokens were sampled from.

:func:`sampling_processors` is the list :func:`~marllm.models.generation.generate_responses` hands to ``generate``;
:func:`logprob_logits` and :func:`reference_logprob_logits` give the policy's and the reference's logits whose
log-softmax is their log-probs (``GenerationConfig.logprobs_from``).
"""

from __future__ import annotations

import torch
from transformers import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from marllm.models.generation_config import GenerationConfig

# Processors that remove tokens by their rank in the distribution they are applied to (see reference_processors).
_TRUNCATING = (TopKLogitsWarper, TopPLogitsWarper)


def sampling_processors(
    generation: GenerationConfig, prompt_mask: torch.Tensor, eos_token_id: int | None, budget: int
) -> LogitsProcessorList:
    """The logits processors that turn a model's next-token logits into the distribution responses are drawn from.

    :func:`~marllm.models.generation.generate_responses` hands this list to ``generate`` (which then adds none of its
    own), and the on-policy log-probs (``GenerationConfig.logprobs_from="sampling"``, see :func:`process_logits`)
    apply the same list at every response position, so sampling and log-probs cannot drift apart. In transformers'
    own order: repetition penalty, EOS suppression for the first ``budget`` new tokens (only when ``stop_at_eos`` is
    False), temperature, top-k, top-p.

    Args:
        generation: the sampling settings.
        prompt_mask: (B, P) attention mask of the left-padded prompts; padding is no token to penalise.
        eos_token_id: the EOS token (None: no EOS suppression).
        budget: the response's token budget (``max_new_tokens`` of this batch).
    """
    processors = LogitsProcessorList()
    if generation.repetition_penalty != 1.0:
        # Index of each row's first real token: the left padding before it is ignored, as generate does (a per-row
        # prompt_ignore_length needs transformers >= 5.23, pyproject's floor: with one length for the whole batch a
        # re-padded row's penalty, and so its log-probs, would change).
        first_real = (prompt_mask != 0).int().argmax(dim=1)
        processors.append(
            RepetitionPenaltyLogitsProcessor(float(generation.repetition_penalty), prompt_ignore_length=first_real)
        )
    if not generation.stop_at_eos and eos_token_id is not None:
        # Without stop_at_eos every response runs to the budget: EOS is suppressed until then.
        processors.append(
            MinNewTokensLengthLogitsProcessor(
                prompt_mask.shape[1], budget, eos_token_id, device=str(prompt_mask.device)
            )
        )
    if generation.temperature != 1.0:
        processors.append(TemperatureLogitsWarper(float(generation.temperature)))
    if generation.top_k > 0:
        processors.append(TopKLogitsWarper(int(generation.top_k)))
    if generation.top_p < 1.0:
        processors.append(TopPLogitsWarper(float(generation.top_p)))
    return processors


def reference_processors(processors: LogitsProcessorList) -> LogitsProcessorList:
    """The processors of ``processors`` that reweight tokens: all but top-k/top-p, which remove tokens by rank.

    Top-k/top-p of the reference's own logits would keep other tokens than the policy's, and a token kept by the
    policy but not by the reference would have an infinite log-ratio; the reference is instead restricted to the
    policy's kept tokens (see ``GenerationConfig.logprobs_from``).
    """
    return LogitsProcessorList(p for p in processors if not isinstance(p, _TRUNCATING))


def _process_into(
    out: torch.Tensor,
    processors: LogitsProcessorList,
    input_ids: torch.Tensor,
    logits: torch.Tensor,
    prompt_length: int,
) -> torch.Tensor:
    for t in range(logits.shape[1]):
        out[:, t] = processors(input_ids[:, : prompt_length + t], logits[:, t])
    return out


class _ProcessedLogits(torch.autograd.Function):
    """:func:`process_logits` with gradient, at the memory of two (B, L, V) tensors.

    Autograd through L processor calls would keep each position's output until they are stacked into a copy, and
    its backward would gather L per-position gradients into another. Here the forward runs without graph and the
    backward recomputes one position at a time (as activation checkpointing does): the processors are piecewise
    linear in the logits (scaled by the temperature and the repetition penalty, or set to −inf), so the recomputed
    vector-Jacobian product is exact.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        logits: torch.Tensor,
        input_ids: torch.Tensor,
        processors: LogitsProcessorList,
        prompt_length: int,
        overwrite_logits: bool,
    ) -> torch.Tensor:
        ctx.save_for_backward(logits, input_ids)
        ctx.processors, ctx.prompt_length, ctx.overwrite_logits = processors, prompt_length, overwrite_logits
        return _process_into(torch.empty_like(logits), processors, input_ids, logits, prompt_length)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_processed: torch.Tensor):  # type: ignore[override]
        logits, input_ids = ctx.saved_tensors
        # Position t's gradient needs only position t's logits: it can take their place once computed.
        grad = logits if ctx.overwrite_logits else torch.empty_like(logits)
        for t in range(logits.shape[1]):
            with torch.enable_grad():
                column = logits[:, t].detach().requires_grad_()
                processed = ctx.processors(input_ids[:, : ctx.prompt_length + t], column)
            (grad[:, t],) = torch.autograd.grad(processed, column, grad_processed[:, t])
        return grad, None, None, None, None


def process_logits(
    processors: LogitsProcessorList,
    input_ids: torch.Tensor,
    logits: torch.Tensor,
    prompt_length: int,
    inplace: bool = False,
    overwrite_logits: bool = False,
) -> torch.Tensor:
    """The logits of the distributions each response token was sampled from, position by position.

    ``input_ids`` (B, P+L) is ``[left-padded prompt | response]`` and ``logits`` (B, L, V) the model's logits at the
    positions that predict the response (:func:`marllm.models.policy.response_forward`). Position t is processed
    given the prefix ``input_ids[:, :P+t]``, as ``generate`` processed step t: the repetition penalty sees the prompt
    and the response so far, EOS suppression counts the new tokens, top-k/top-p set removed tokens to −inf.

    Differentiable. ``inplace`` (only without gradient) writes the result into ``logits`` instead of a new tensor;
    ``overwrite_logits`` (with gradient) lets the backward write the logits' gradient over them, for logits nothing
    else reads after the backward (see :func:`marllm.algorithms.core.logprobs_and_entropy`).
    """
    if not processors:
        return logits
    if logits.requires_grad and torch.is_grad_enabled():
        if inplace:
            raise ValueError("process_logits(inplace=True) needs logits without gradient")
        return _ProcessedLogits.apply(logits, input_ids, processors, prompt_length, overwrite_logits)
    return _process_into(logits if inplace else torch.empty_like(logits), processors, input_ids, logits, prompt_length)


def logprob_logits(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    generation: GenerationConfig,
    eos_token_id: int | None,
    inplace: bool = False,
    overwrite_logits: bool = False,
) -> torch.Tensor:
    """The policy's logits whose log-softmax is its log-probs, as ``generation.logprobs_from`` defines them.

    ``"tempered"``: logits / temperature. ``"sampling"``: the logits generate sampled from, every processor of
    :func:`sampling_processors` applied at every position (:func:`process_logits`). ``logits`` (B, L, V) come from
    :func:`marllm.models.policy.response_forward` on ``input_ids``/``attention_mask`` (B, P+L); ``inplace`` (only
    without gradient) overwrites ``logits`` rather than allocating another (B, L, V) tensor, and
    ``overwrite_logits`` (with gradient) lets the backward put their gradient in their place. Half-precision logits
    that need processing are processed in float32, as generate processes them.
    """
    sampling = generation.logprobs_from == "sampling"
    if not sampling and generation.temperature == 1.0:
        return logits
    logits = _as_generate_scores(logits)
    if sampling:
        prompt_mask = attention_mask[:, :prompt_length]
        processors = sampling_processors(generation, prompt_mask, eos_token_id, logits.shape[1])
        return process_logits(processors, input_ids, logits, prompt_length, inplace, overwrite_logits)
    return logits.div_(generation.temperature) if inplace else logits / generation.temperature


def _as_generate_scores(logits: torch.Tensor) -> torch.Tensor:
    # generate upcasts each step's logits to float32 before its processors; rounding after each processor in bfloat16
    # would move the log-probs away from the sampler's.
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def reference_logprob_logits(
    reference_logits: torch.Tensor,
    policy_logits: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    generation: GenerationConfig,
    eos_token_id: int | None,
    inplace: bool = False,
) -> torch.Tensor:
    """The reference's logits to compare with the policy's :func:`logprob_logits` (``policy_logits``).

    ``"tempered"``: reference logits / temperature, like the policy's. ``"sampling"``: the same temperature,
    repetition penalty and EOS suppression as the policy (:func:`reference_processors`), and −inf wherever the
    policy's top-k/top-p removed a token, so that both are distributions over the same tokens.
    """
    if generation.logprobs_from != "sampling":
        return logprob_logits(
            reference_logits, input_ids, attention_mask, prompt_length, generation, eos_token_id, inplace
        )
    prompt_mask = attention_mask[:, :prompt_length]
    processors = reference_processors(
        sampling_processors(generation, prompt_mask, eos_token_id, reference_logits.shape[1])
    )
    processed = process_logits(processors, input_ids, _as_generate_scores(reference_logits), prompt_length, inplace)
    removed = torch.isneginf(policy_logits)
    return processed.masked_fill_(removed, -torch.inf) if inplace else processed.masked_fill(removed, -torch.inf)
