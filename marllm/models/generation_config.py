"""Sampling settings of responses, validated when built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from marllm.utils.checks import choice, non_negative, positive


@dataclass
class GenerationConfig:
    """Sampling of responses. Defaults are the paper's IMDB setting.

    Attributes:
        min_new_tokens, max_new_tokens: each batch's response length is drawn uniformly from this range (inclusive)
            and used as the batch's token budget; a response may end earlier with EOS. A game's ``constrained`` and
            ``score`` answers do not read them (a move's own tokens and EOS are its budget); they are accepted there,
            so that one config switches ``game.actions`` by one override.
        top_k: keep the k most likely tokens (0: no top-k filtering).
        top_p: nucleus sampling mass (1.0: no filtering).
        temperature: softmax temperature of sampling.
        repetition_penalty: > 1 discourages repeating earlier tokens.
        stop_at_eos: end a response at EOS; if False, EOS is suppressed and every response runs to the budget.
        logprobs_from: which distribution the log-probs of PPO's ratio, the reference log-probs and the KL come from.
            Temperature applies to the policy's and the reference's logits either way (as in TRL), so that the KL
            of an unchanged policy is 0 at any temperature.
            ``"tempered"`` (the paper's code): softmax(logits / temperature) of each model. Responses are sampled
            after the repetition penalty, top-k/top-p and EOS suppression too, from a distribution μ ≠ π: the PPO
            ratio π_θ(a)/π_old(a) is not the sampler's, and the k1 KL E_μ[log π(a) − log π_0(a)] is a biased
            estimate of KL(π ‖ π_0). The gap, KL(μ ‖ π) per token, grows with the penalty and with the scale of the
            logits (0.03 nats at repetition penalty 1.1 and 0.46 at 1.3 on a tiny random GPT-2). Exact when
            repetition_penalty is 1, top_k 0, top_p 1 and stop_at_eos True.
            ``"sampling"``: the policy's log-probs are those of μ itself, every processor applied at every response
            position as generate applied it, so the ratio is exactly on-policy. The reference's distribution μ_0
            gets the same temperature, repetition penalty and EOS suppression and is restricted to the tokens the
            policy's top-k/top-p kept (renormalised over them): both are distributions over the same candidates, so
            KL(μ ‖ μ_0) is finite, 0 while the policy equals the reference, estimated without bias by k1 and exactly
            by ``ppo.kl.kl_penalty: full``; the entropy metric is μ's. Costs one pass of the processors per response
            position in the rollout and in each PPO forward.
        chat_template: render each prompt as the user turn of the tokenizer's chat template followed by its
            generation prompt, so that the response is the assistant turn (instruct models); False feeds the prompt
            text as it is. The tokenizer must have a chat template.
        cache: the KV cache of sampling. ``"dynamic"`` grows the cache by one position per token (transformers'
            default). ``"static"`` preallocates it for prompt + the batch's budget, so that every decode step runs
            with the same shapes: on a GPU transformers then compiles the decode step (``torch.compile``, once per
            prompt width and budget, which vary from batch to batch: a recompilation each), on the CPU it runs as it
            is. Attention then sums over the whole preallocated length (padding masked), so the logits differ from
            the dynamic cache's by float rounding (~1e-7 on a tiny model), not bit for bit; a prompt's shared prefix
            is not run once ahead (that cache is a dynamic one). A model whose ``generate`` does not build a KV cache
            of its own (RWKV, xLSTM: generate would ignore the setting) is refused.
    """

    min_new_tokens: int = 4
    max_new_tokens: int = 16
    top_k: int = 0
    top_p: float = 1.0
    temperature: float = 1.0
    repetition_penalty: float = 1.1
    stop_at_eos: bool = True
    logprobs_from: Literal["tempered", "sampling"] = "tempered"
    chat_template: bool = False
    cache: Literal["dynamic", "static"] = "dynamic"

    def __post_init__(self) -> None:
        positive("generation", self, "min_new_tokens", "max_new_tokens", "temperature", "repetition_penalty")
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"generation.min_new_tokens ({self.min_new_tokens}) must be <= generation.max_new_tokens "
                f"({self.max_new_tokens})"
            )
        non_negative("generation", self, "top_k")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"generation.top_p must be in (0, 1], got {self.top_p}")
        choice("generation", self, "logprobs_from", ("tempered", "sampling"))
        choice("generation", self, "cache", ("dynamic", "static"))
        if not isinstance(self.chat_template, bool):
            raise ValueError(f"generation.chat_template must be true or false, got {self.chat_template!r}")
