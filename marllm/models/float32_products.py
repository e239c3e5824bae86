"""bfloat16 weights multiplied in float32 arithmetic, for CPUs that have no bfloat16 matrix instructions.

On a CPU without AVX-512 BF16 or AMX, torch has no fast kernel for a bfloat16 matrix product and falls back to a
reference loop: measured on a 2-core AMD EPYC (AVX2), a (256 × 896) · (896 × 4,864) product took 2.0 s in bfloat16
against 35 ms in float32, which makes a bfloat16 model unusable there. :func:`use_float32_products` makes each linear
layer of a bfloat16 model compute its product in float32 from its bfloat16 weight and input, and round the result to
bfloat16: the products of bfloat16 numbers are exact in float32 and both paths accumulate in float32, so the result
is the one the bfloat16 kernel gives up to the order of the float32 sums — at float32's speed, with every tensor that
is kept (weights, their gradients, Adam's moments, the activations saved for the backward) still in bfloat16. A
layer's float32 copy of its weight lives only while it multiplies.

:func:`needs_float32_products` says where: a bfloat16 model on a CPU whose torch reports no bfloat16 support
(``torch.ops.mkldnn._is_mkldnn_bf16_supported()``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.pytorch_utils import Conv1D

__all__ = ["needs_float32_products", "use_float32_products"]


def needs_float32_products(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a model in ``dtype`` on ``device`` should multiply in float32: bfloat16 on a CPU without bfloat16
    matrix instructions."""
    if dtype != torch.bfloat16 or device.type != "cpu":
        return False
    return not torch.ops.mkldnn._is_mkldnn_bf16_supported()


_BLOCK_ELEMENTS = 1 << 24
"""A weight's float32 copy is made this many elements at a time (64 MiB): a 151,936-token LM head's whole would be
545 MB at each product."""


def _blocks(weight: torch.Tensor) -> list[slice]:
    """Slices of the weight's rows (output features), each at most :data:`_BLOCK_ELEMENTS` elements."""
    rows = max(1, _BLOCK_ELEMENTS // max(1, weight.shape[1]))
    return [slice(start, start + rows) for start in range(0, weight.shape[0], rows)]


class _Float32Product(torch.autograd.Function):
    """x · wᵀ + b for bfloat16 ``x``, ``weight`` (out, in) and ``bias``, computed in float32 and rounded to bfloat16;
    saves the bfloat16 input and weight (not float32 copies) for the backward, which computes in float32 too. The
    weight is widened block by block of its rows, so that its float32 copy is never whole."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        x32 = x.float()
        out = torch.empty(*x.shape[:-1], weight.shape[0], dtype=x.dtype, device=x.device)
        for rows in _blocks(weight):
            part = F.linear(x32, weight[rows].float(), None if bias is None else bias[rows].float())
            out[..., rows] = part.to(x.dtype)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        grad32 = grad.float().reshape(-1, grad.shape[-1])  # (N, out)
        x32 = x.reshape(-1, x.shape[-1]).float()  # (N, in)
        grad_x32 = torch.zeros_like(x32) if ctx.needs_input_grad[0] else None
        grad_weight = torch.empty_like(weight) if ctx.needs_input_grad[1] else None
        for rows in _blocks(weight):
            block = grad32[:, rows]
            if grad_x32 is not None:
                grad_x32.addmm_(block, weight[rows].float())
            if grad_weight is not None:
                grad_weight[rows] = (block.T @ x32).to(weight.dtype)
        grad_x = None if grad_x32 is None else grad_x32.view(x.shape).to(x.dtype)
        grad_bias = grad32.sum(0).to(x.dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


def _product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16:
        return F.linear(x, weight, bias)  # an autocast or float32 input: torch's own kernel
    return _Float32Product.apply(x, weight, bias)


class _Float32ProductLinear(nn.Linear):
    """An ``nn.Linear`` whose bfloat16 product is computed in float32 (the class a patched layer takes)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _product(x, self.weight, self.bias)


class _Float32ProductConv1D(Conv1D):
    """transformers' ``Conv1D`` (GPT-2's linear layers, weight (in, out)) with its product computed in float32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _product(x, self.weight.T, self.bias)


def use_float32_products(model: nn.Module) -> int:
    """Make every bfloat16 ``nn.Linear`` and ``Conv1D`` of ``model`` multiply in float32 (see the module's docstring);
    return how many layers were changed. Idempotent; the layers keep their parameters, names and state dicts."""
    changed = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if weight is None or weight.dtype != torch.bfloat16:
            continue
        if type(module) is nn.Linear:
            module.__class__ = _Float32ProductLinear
        elif type(module) is Conv1D:
            module.__class__ = _Float32ProductConv1D
        else:
            continue
        changed += 1
    return changed
