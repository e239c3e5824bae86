"""Activation functions that keep less for the backward pass, and compute exactly what they did.

GPT-2's ``gelu_new`` (and a few other activations in transformers) is written as a chain of elementwise tensor ops,
and autograd keeps every intermediate of that chain for the backward pass: about nine tensors of the MLP's width per
layer and token, most of a small model's training memory. :func:`recompute_activations_in_backward` wraps such
activations so that the forward keeps only their input and the backward recomputes the chain from it, with the same
ops in the same order: outputs and gradients are bit-identical, for one more elementwise pass per layer.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = [
    "COMPOSITE_ACTIVATIONS",
    "TANH_GELUS",
    "FusedTanhGELU",
    "RecomputedActivation",
    "fuse_tanh_gelus",
    "recompute_activations_in_backward",
]

# transformers' activations written as several tensor ops (the fused ones, nn.GELU, nn.SiLU, keep one tensor).
COMPOSITE_ACTIVATIONS = ("NewGELUActivation", "FastGELUActivation", "QuickGELUActivation", "AccurateGELUActivation")


# transformers' composite forms of the tanh approximation of GELU, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
TANH_GELUS = ("NewGELUActivation", "FastGELUActivation")


class FusedTanhGELU(nn.Module):
    """The tanh approximation of GELU in torch's one fused kernel (``F.gelu(x, approximate="tanh")``): the function
    ``gelu_new`` computes, rounded differently (the float32 results differ in the last bits), in one pass over the
    tensor instead of eight, keeping only its input for the backward."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(hidden, approximate="tanh")


def fuse_tanh_gelus(model: nn.Module) -> int:
    """Replace every composite tanh-approximated GELU of ``model`` (:data:`TANH_GELUS`, also inside a
    :class:`RecomputedActivation`) by :class:`FusedTanhGELU`, in place; return how many were replaced. Not
    bit-identical: a switch (``ppo.compute.fused_kernels``)."""
    replaced = 0
    for parent in list(model.modules()):
        if isinstance(parent, RecomputedActivation):  # replaced whole, from its own parent
            continue
        for name, child in list(parent.named_children()):
            inner = child.inner if isinstance(child, RecomputedActivation) else child
            if type(inner).__name__ in TANH_GELUS:
                setattr(parent, name, FusedTanhGELU())
                replaced += 1
    return replaced


class RecomputedActivation(nn.Module):
    """``inner`` applied as it is, except that under autograd only its input is kept and its intermediates are
    recomputed in the backward pass (``torch.utils.checkpoint`` on this one module)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and hidden.requires_grad:
            # The activation draws no random numbers: nothing to replay but its ops.
            return checkpoint(self.inner, hidden, use_reentrant=False, preserve_rng_state=False)
        return self.inner(hidden)


def recompute_activations_in_backward(model: nn.Module) -> int:
    """Wrap every composite activation module of ``model`` (:data:`COMPOSITE_ACTIVATIONS`) in a
    :class:`RecomputedActivation`, in place; return how many were wrapped. Wrapping twice changes nothing, and the
    state dict is unchanged (activations hold no parameters)."""
    wrapped = 0
    for parent in list(model.modules()):
        if isinstance(parent, RecomputedActivation):
            continue
        for name, child in list(parent.named_children()):
            if type(child).__name__ in COMPOSITE_ACTIVATIONS:
                setattr(parent, name, RecomputedActivation(child))
                wrapped += 1
    return wrapped
