"""What keeps marllm's training memory small without changing what it computes: composite activations recomputed
in the backward pass, the heavy optional imports left out of a run that does not need them, and torch's idle threads
told to wait briefly."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from marllm.models.activations import (
    FusedTanhGELU,
    RecomputedActivation,
    fuse_tanh_gelus,
    recompute_activations_in_backward,
)
from marllm.utils.threads import SPIN_COUNT, wait_briefly_when_idle


def _gpt2(activation: str = "gelu_new") -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=2, activation_function=activation)
    return GPT2LMHeadModel(config).eval()


def _loss_and_grads(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _saved_bytes(model: torch.nn.Module, ids: torch.Tensor) -> int:
    saved = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(ids, labels=ids).loss.backward()
    return saved


def test_recomputed_activations_give_bit_identical_losses_and_gradients_and_keep_less():
    plain = _gpt2()
    wrapped = copy.deepcopy(plain)
    assert recompute_activations_in_backward(wrapped) == 2  # one per layer
    assert recompute_activations_in_backward(wrapped) == 0  # wrapping twice changes nothing
    assert all(isinstance(block.mlp.act, RecomputedActivation) for block in wrapped.transformer.h)
    assert wrapped.state_dict().keys() == plain.state_dict().keys()
    ids = torch.randint(0, 97, (4, 24), generator=torch.Generator().manual_seed(1))
    loss, grads = _loss_and_grads(plain, ids)
    wrapped_loss, wrapped_grads = _loss_and_grads(wrapped, ids)
    assert torch.equal(loss, wrapped_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, wrapped_grads, strict=True))
    # gelu_new keeps several (batch, tokens, 4 * n_embd) intermediates per layer; recomputed, only its input.
    mlp_tensor = 4 * 24 * 4 * 32 * 4
    assert _saved_bytes(plain, ids) - _saved_bytes(wrapped, ids) >= 2 * 3 * mlp_tensor
    with torch.no_grad():
        assert torch.equal(plain(ids).logits, wrapped(ids).logits)


def test_fused_activations_are_left_alone():
    model = _gpt2("gelu")
    assert recompute_activations_in_backward(model) == 0


def test_fused_tanh_gelus_compute_gelu_new_rounded_differently_and_a_learner_fuses_policy_and_reference(tokenizer):
    plain = _gpt2()
    fused = copy.deepcopy(plain)
    recompute_activations_in_backward(fused)  # a wrapped gelu_new is replaced too
    assert fuse_tanh_gelus(fused) == 2 and fuse_tanh_gelus(fused) == 0
    assert all(isinstance(block.mlp.act, FusedTanhGELU) for block in fused.transformer.h)
    assert recompute_activations_in_backward(fused) == 0  # one fused kernel: nothing to recompute
    ids = torch.randint(0, 97, (4, 24), generator=torch.Generator().manual_seed(1))
    loss, grads = _loss_and_grads(plain, ids)
    fused_loss, fused_grads = _loss_and_grads(fused, ids)
    # The same function, rounded in another order: equal to float32's last bits, not bit for bit.
    torch.testing.assert_close(fused_loss, loss, rtol=1e-6, atol=1e-6)
    for a, b in zip(grads, fused_grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    assert fuse_tanh_gelus(_gpt2("relu")) == 0
    from tests.test_ppo_learner import make_learner

    learner = make_learner(tokenizer, fused_kernels=True)
    for network in (learner.model, learner.reference):
        assert all(isinstance(block.mlp.act, FusedTanhGELU) for block in network.transformer.h)
    assert learner.optimizer.defaults["fused"] is True
    default = make_learner(tokenizer)
    assert isinstance(default.model.transformer.h[0].mlp.act, FusedTanhGELU)  # on by default
    assert default.optimizer.defaults["fused"] is True
    plain = make_learner(tokenizer, fused_kernels=False)
    assert not isinstance(plain.model.transformer.h[0].mlp.act, FusedTanhGELU)  # the path before, when asked for
    assert not plain.optimizer.defaults["fused"]


def test_a_text_run_without_lora_loads_neither_peft_nor_datasets():
    code = (
        "import sys\n"
        "from marllm import make_learners, run_iteration\n"
        "from marllm.envs import env\n"
        "import marllm.algorithms.ppo, marllm.run.learners, marllm.config\n"
        "print(sorted(m for m in ('peft', 'datasets') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, SPIN_COUNT),
        ({"GOMP_SPINCOUNT": "300000"}, "300000"),  # the user's own choice wins
        ({"OMP_WAIT_POLICY": "ACTIVE"}, None),
    ],
)
def test_idle_threads_wait_briefly_unless_the_user_chose(environ, expected):
    environ = dict(environ)
    wait_briefly_when_idle(environ)
    assert environ.get("GOMP_SPINCOUNT") == expected


def test_the_marllm_command_sets_the_spin_before_torch_loads():
    env = {key: value for key, value in os.environ.items() if key not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    code = (
        "import os, sys\n"
        "from marllm.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.split()[-2:] == [SPIN_COUNT, "False"]


@pytest.mark.parametrize(("first", "expected"), [("import marllm", SPIN_COUNT), ("import torch, marllm", SPIN_COUNT)])
def test_the_python_api_sets_the_spin_whichever_is_imported_first(first, expected):
    """A program using the library gets the command's spin whether it imports marllm or torch first (with torch
    first it is also written into the loaded libgomp: tests/test_busy_machine_guard.py)."""
    env = {key: value for key, value in os.environ.items() if key not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    code = f"import os\n{first}\nprint(os.environ.get('GOMP_SPINCOUNT'))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.split()[-1] == expected
