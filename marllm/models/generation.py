"""Batched sampling of responses with left padding and the KV cache."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import (
    BatchEncoding,
    LogitsProcessor,
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from marllm.models.generation_config import GenerationConfig
from marllm.parallel.sharding import whole_for_generation

# Processors that remove tokens by their rank in the distribution they are applied to (see reference_processors).
_TRUNCATING = (TopKLogitsWarper, TopPLogitsWarper)
# The settings of a model's own generation_config that may differ from transformers' defaults: token ids, lengths,
# caching and output options, and the four sampling settings generate_responses passes explicitly. Any other
# setting (min_new_tokens, num_beams, no_repeat_ngram_size, guidance_scale, ...) could make generate add a
# processor of its own that the log-probs would not see, so a model that sets one is refused.
_HARMLESS_MODEL_SETTINGS = frozenset(
    {
        "_from_model_config",
        "transformers_version",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "decoder_start_token_id",
        "max_length",
        "max_new_tokens",
        "do_sample",
        "use_cache",
        "cache_implementation",
        "cache_config",
        "output_attentions",
        "output_hidden_states",
        "output_scores",
        "output_logits",
        "return_dict_in_generate",
        "temperature",
        "top_k",
        "top_p",
        "repetition_penalty",
    }
)


class PromptTooLongError(ValueError):
    """A prompt plus the response budget does not fit in the model's context."""


@dataclass
class GeneratedBatch:
    """Responses to a batch of prompts, as text and as the token ids that produced them.

    ``prompt_ids``/``prompt_mask`` are (B, P), left-padded; ``response``/``mask`` are (B, L), with ``mask`` 1 up to
    and including the first EOS. ``logits`` (B, L, V) and ``hidden`` (B, L, H) are there only when asked for
    (:func:`generate_responses` with ``capture``): the raw logits each response token was sampled from (before any
    processor) and the last hidden states they were projected from, as ``generate``'s own KV-cached forwards computed
    them.
    """

    texts: tuple[str, ...]
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response: torch.Tensor
    mask: torch.Tensor
    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None


def check_chat_template(tokenizer: PreTrainedTokenizerBase, chat_template: bool, owner: str = "generation") -> None:
    """With ``generation.chat_template`` on, the tokenizer must have a chat template."""
    if chat_template and not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(
            f"{owner}: generation.chat_template is true but the tokenizer of {name!r} has no chat template; set "
            "generation.chat_template: false to feed prompts as plain text, or use an instruct model's tokenizer"
        )


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], chat_template: bool, owner: str = "generation"
) -> BatchEncoding:
    """Left-padded ``input_ids`` and ``attention_mask`` of ``prompts``, each as plain text or, with
    ``chat_template``, as a user turn of the tokenizer's chat template ending in its generation prompt."""
    if not chat_template:
        return tokenizer(list(prompts), return_tensors="pt", padding=True)
    check_chat_template(tokenizer, chat_template, owner)
    rendered = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]
    # The template writes its own special tokens (BOS, turn markers): the tokenizer must not add them again.
    return tokenizer(rendered, return_tensors="pt", padding=True, add_special_tokens=False)


def check_prompt_lengths(
    prompts: Sequence[str], prompt_mask: torch.Tensor, budget: int, context: int | None, owner: str
) -> None:
    """Every prompt must have a token, and prompt + ``budget`` new tokens must fit in ``context``."""
    lengths = prompt_mask.sum(1)
    empty = torch.nonzero(lengths == 0).flatten().tolist()
    if empty:
        raise ValueError(f"{owner}: prompt(s) {empty[:10]} tokenize to nothing; every prompt needs at least one token")
    if context is not None:
        too_long = torch.nonzero(lengths + budget > context).flatten().tolist()
        if too_long:
            i = too_long[0]
            raise PromptTooLongError(
                f"{owner}: prompt {i} has {int(lengths[i])} tokens; with up to {budget} new tokens it exceeds the "
                f"model context of {context} ({len(too_long)} prompt(s) too long; prompt {i} starts "
                f"{prompts[i][:80]!r}). Shorten the prompt (env.templates or game.templates, or what it shows: a "
                "task's query, a game's state), lower generation.max_new_tokens, or use a model of longer context"
            )


def sampling_processors(
    generation: GenerationConfig, prompt_mask: torch.Tensor, eos_token_id: int | None, budget: int
) -> LogitsProcessorList:
    """The logits processors that turn a model's next-token logits into the distribution responses are drawn from.

    :func:`generate_responses` hands this list to ``generate`` (which then adds none of its own), and the on-policy
    log-probs (``GenerationConfig.logprobs_from="sampling"``, see :func:`process_logits`) apply the same list at
    every response position, so sampling and log-probs cannot drift apart. In transformers' own order: repetition
    penalty, EOS suppression for the first ``budget`` new tokens (only when ``stop_at_eos`` is False), temperature,
    top-k, top-p.

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


def check_model_sampling_defaults(model: PreTrainedModel, owner: str = "generation") -> None:
    """Refuse a model whose own ``generation_config`` would make ``generate`` filter logits beyond ours.

    ``generate`` fills every setting it is not given from the model's ``generation_config``. Any setting that
    differs from transformers' default, other than token ids, lengths, caching, outputs and the sampling settings
    passed explicitly, is refused: it could add a processor that :func:`sampling_processors` does not know of, so the
    log-probs would not be those of the sampler.
    """
    config = getattr(model, "generation_config", None)
    settings = config.to_diff_dict() if config is not None else {}
    active = {name: value for name, value in settings.items() if name not in _HARMLESS_MODEL_SETTINGS}
    if active:
        raise ValueError(
            f"{owner}: the model's generation_config sets {active}, which generate would apply on top of marllm's "
            "sampling settings (and which the log-probs would not see); unset them (model.generation_config.<name> = "
            "None) before training"
        )


@contextlib.contextmanager
def _last_hidden_states(model: PreTrainedModel, owner: str) -> Iterator[list[torch.Tensor]]:
    """While open, each forward of ``model`` appends the final hidden state (B, H) of its last position: the input of
    the model's output embeddings (the LM head)."""
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{owner}: the model has no output embeddings (LM head) to take the hidden states from")
    steps: list[torch.Tensor] = []

    def keep_last_position(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        # Generation projects only the last position (logits_to_keep=1); a model without it projects them all.
        steps.append(inputs[0][:, -1].detach().contiguous())

    handle = head.register_forward_pre_hook(keep_last_position)
    try:
        yield steps
    finally:
        handle.remove()


@torch.no_grad()
def generate_responses(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    budget: int,
    generation: GenerationConfig,
    context: int | None = None,
    owner: str = "generation",
    capture: bool = False,
    restriction: Callable[[int], LogitsProcessor] | None = None,
) -> GeneratedBatch:
    """Sample one response of at most ``budget`` tokens per prompt, all prompts in one ``generate`` call.

    Sampling goes through :func:`sampling_processors` and nothing else: ``generate``'s own processors are all left off.
    With ``capture``, the batch also holds the logits and last hidden states of ``generate``'s forwards at every
    response position (``GeneratedBatch.logits``/``hidden``): a full forward over prompt and response computes the same
    numbers up to float rounding (the KV cache splits the sums differently), so they can stand in for it.
    ``restriction(P)`` (P: the padded prompts' width) makes a processor applied before the sampling processors (the
    legal moves' :class:`~marllm.models.move_tries.LegalMovesProcessor`).
    """
    device = next(model.parameters()).device
    encoded = encode_prompts(tokenizer, prompts, generation.chat_template, owner)
    prompt_ids = encoded["input_ids"].to(device)  # (B, P), left-padded
    prompt_mask = encoded["attention_mask"].to(device)
    check_prompt_lengths(prompts, prompt_mask, budget, context, owner)
    check_model_sampling_defaults(model, owner)
    eos = tokenizer.eos_token_id
    # A sharded model is gathered once for the call, not at each token's forward; generate keeps every rank
    # stepping until all are done (synced_gpus, on by itself for a model FSDP manages).
    captured = _last_hidden_states(model, owner) if capture else contextlib.nullcontext([])
    with whole_for_generation(model), captured as hidden_steps:
        output = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            do_sample=True,
            max_new_tokens=budget,
            logits_processor=LogitsProcessorList(
                ([restriction(prompt_ids.shape[1])] if restriction is not None else [])
                + list(sampling_processors(generation, prompt_mask, eos, budget))
            ),
            # The neutral values, explicitly: left unset, generate would take them from the model's generation_config.
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            repetition_penalty=1.0,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=eos,
            # Only when asked: the plain call returns the sequences alone, as it always did.
            **({"output_logits": True, "return_dict_in_generate": True} if capture else {}),
        )
    sequences = output.sequences if capture else output
    response = sequences[:, prompt_ids.shape[1] :]  # (B, L), L <= budget
    logits = hidden = None
    if capture:
        if not (len(output.logits) == len(hidden_steps) == response.shape[1]):
            raise RuntimeError(
                f"{owner}: generate returned {len(output.logits)} logits and ran {len(hidden_steps)} forwards for "
                f"{response.shape[1]} response tokens; they cannot be matched to the tokens "
                "(ppo.rollout_from_generate needs one forward per sampled token)"
            )
        logits = torch.stack(output.logits, 1)  # generate's float32 copies of each step's raw logits
        hidden = torch.stack(hidden_steps, 1)
        del output, hidden_steps[:]
    if generation.stop_at_eos and eos is not None:
        is_eos = (response == eos).long()
        # Keep tokens up to and including the first EOS; what generate appends after it is padding.
        mask = ((is_eos.cumsum(1) - is_eos) == 0).long()
    else:
        mask = torch.ones_like(response)
    lengths = mask.sum(1).tolist()
    texts = tokenizer.batch_decode(
        [row[:n].tolist() for row, n in zip(response, lengths, strict=True)], skip_special_tokens=True
    )
    return GeneratedBatch(tuple(texts), prompt_ids, prompt_mask, response, mask, logits, hidden)
