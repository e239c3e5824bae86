"""bfloat16 weights multiplied in float32 (CPUs without bfloat16 instructions): the products, gradients and a
model's logits are those of torch's bfloat16 kernels up to the order of float32 sums; tensors kept stay bfloat16."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from marllm.models import float32_products
from marllm.models.float32_products import needs_float32_products, use_float32_products
from marllm.models.memory import saved_tensor_bytes
from tests.conftest import make_tiny_gpt2
from tests.test_gradient_checkpointing import tiny_qwen2

# Both paths round a float32 sum to bfloat16; summed in another order, the float32 sums differ in their last bits,
# which moves a rounded result by at most one bfloat16 unit in the last place (2^-8 relative) where the sum sits
# next to a rounding boundary.
BF16_ULP = 2.0**-8


def assert_close_in_bfloat16(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.dtype == expected.dtype == torch.bfloat16
    scale = expected.float().abs().clamp_min(expected.float().abs().max() * 1e-3)
    assert ((got.float() - expected.float()).abs() <= 2 * BF16_ULP * scale).all()


@pytest.mark.parametrize("block", [None, 100], ids=["whole weight", "blocks of 2 rows"])
@pytest.mark.parametrize("layer", ["linear", "conv1d"])
def test_a_layer_gives_the_bfloat16_kernel_result_and_gradients(layer, block, monkeypatch):
    if block is not None:  # the weight widened to float32 a few rows at a time, as a large head's is
        monkeypatch.setattr(float32_products, "_BLOCK_ELEMENTS", block)
    torch.manual_seed(0)
    native = (nn.Linear(48, 40) if layer == "linear" else Conv1D(40, 48)).to(torch.bfloat16)
    patched = copy.deepcopy(native)
    assert use_float32_products(patched) == 1 and isinstance(patched, type(native))
    x = torch.randn(3, 7, 48, dtype=torch.bfloat16, requires_grad=True)
    outputs = []
    for module in (native, patched):
        out = module(x)
        (grad_x,) = torch.autograd.grad(out.float().pow(2).sum(), x, retain_graph=True)
        out.float().pow(2).sum().backward()
        outputs.append((out, grad_x, module.weight.grad, module.bias.grad))
        x.grad = None
    for got, expected in zip(outputs[1], outputs[0], strict=True):
        assert_close_in_bfloat16(got, expected)
    assert patched.state_dict().keys() == native.state_dict().keys()


def test_a_model_keeps_bfloat16_activations_and_matches_its_bfloat16_logits(tokenizer):
    native = tiny_qwen2(tokenizer).to(torch.bfloat16).eval()
    patched = copy.deepcopy(native)
    assert use_float32_products(patched) > 0
    ids = torch.randint(1, len(tokenizer), (2, 12))
    with saved_tensor_bytes(exclude=list(native.parameters())) as native_bytes:
        expected = native(input_ids=ids).logits
    with saved_tensor_bytes(exclude=list(patched.parameters())) as patched_bytes:
        got = patched(input_ids=ids).logits
    # The same activations are kept for the backward (bfloat16, no float32 copies); the logits agree to bfloat16's
    # precision compounded over two layers.
    assert patched_bytes[0] <= native_bytes[0]
    assert (got.float() - expected.float()).abs().max() <= 0.05 * expected.float().abs().max()


def test_only_bfloat16_on_a_cpu_without_bfloat16_instructions(monkeypatch, tokenizer):
    cpu = torch.device("cpu")
    assert not needs_float32_products(torch.float32, cpu)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True, raising=False)
    assert not needs_float32_products(torch.bfloat16, cpu)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False, raising=False)
    assert needs_float32_products(torch.bfloat16, cpu)
    assert not needs_float32_products(torch.bfloat16, torch.device("meta"))
    assert use_float32_products(make_tiny_gpt2(tokenizer)) == 0  # float32 layers are left alone
