"""Adam for bfloat16 weights: each step computed in float32 and written back with stochastic rounding.

Adam on bfloat16 weights rounds each updated weight to the nearest bfloat16, whose spacing is 2^-8 of the weight's
magnitude (2^-7 just above 1): at PPO's learning rates (1.41e-5) nearly every update is far below half a spacing and
rounds away, so the weights never move. Stochastic rounding (Gupta et al., *Deep Learning with Limited Numerical
Precision*, 2015) rounds a float32 value up to the next bfloat16 with probability equal to its distance from the
lower one in units of the spacing, and down otherwise: the rounded weight equals the float32 one in expectation, so
a run of small updates moves the weight by their sum on average, as float32 master weights would, at 2 bytes a
weight instead of 4 + 4.

:class:`StochasticRoundingAdam` keeps each parameter, its gradient and both of Adam's moments in the parameter's
dtype (bfloat16: 2 + 2 + 2 + 2 = 8 bytes a parameter, against float32 Adam's 16); a step upcasts one parameter at a
time (a large one by slices of 4M elements) to float32, takes torch's Adam step on it, and rounds the weight and the
moments back stochastically, so the float32 temporaries are at most one slice's size. float32 parameters (a value
head) take the same step in float32, written back as they are. The random bits come from the optimiser's own
generator, seeded by the learner's seed and saved with the optimiser's ``state_dict``, so that a resumed run equals an
uninterrupted one.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["ROUNDED_DTYPES", "StochasticRoundingAdam", "stochastic_round_to_bfloat16"]

ROUNDED_DTYPES = (torch.bfloat16,)
"""The parameter dtypes :class:`StochasticRoundingAdam` rounds stochastically (float16 is refused: Adam's second
moment, the squared gradient, underflows its range, 6e-8 at the smallest)."""

_LOW_BITS = 1 << 16  # a float32 has 16 more mantissa bits than a bfloat16
_HIGH_BITS_MASK = -_LOW_BITS  # as an int32: 0xFFFF0000
_GENERATOR_KEY = "rounding_generator"


def stochastic_round_to_bfloat16(values: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """``values`` (float32) rounded to bfloat16, up (away from zero) with probability equal to the fraction of the
    spacing between the two neighbouring bfloat16s that the value lies above the lower (in magnitude) one.

    A bfloat16 is the high 16 bits of a float32: uniform random 16 low bits are added to the float32's bit pattern
    (its int32 view) and the low 16 bits then cut off, which carries into the kept bits with exactly that
    probability (for either sign: the bits are the magnitude's). Infinities stay infinite; a value within a spacing
    of float32's largest may round to infinity, as bfloat16 cannot hold it. ``generator``: where the bits come from
    (torch's default generator if None); its device must be ``values``'.
    """
    if values.dtype != torch.float32:
        raise TypeError(f"stochastic_round_to_bfloat16 rounds float32 values, got {values.dtype}")
    noise = torch.randint(
        0, _LOW_BITS, values.shape, dtype=torch.int32, device=values.device, generator=generator
    )  # same shape as values
    bits = values.view(torch.int32) + noise
    return bits.bitwise_and_(_HIGH_BITS_MASK).view(torch.float32).to(torch.bfloat16)  # exact: low bits are zero


_SLICE_ELEMENTS = 1 << 22
"""Elements of a bfloat16 parameter whose step is computed at once (16 MiB of float32 per temporary)."""


class StochasticRoundingAdam(torch.optim.Optimizer):
    """Adam (Kingma & Ba; torch's ``Adam`` without weight decay or AMSGrad) whose state is kept in each parameter's
    dtype, with the step of a bfloat16 parameter computed in float32 and written back with
    :func:`stochastic_round_to_bfloat16` (see the module's docstring).

    Args:
        params: the parameters (or parameter groups) to train: bfloat16 or float32.
        lr: the step size.
        betas: the moments' decay rates.
        eps: added to the second moment's root.
        seed: seeds the generator of the rounding's random bits.
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        seed: int = 0,
    ):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps})
        parameters = [p for group in self.param_groups for p in group["params"]]
        unsupported = sorted({str(p.dtype) for p in parameters if p.dtype not in (*ROUNDED_DTYPES, torch.float32)})
        if unsupported:
            raise ValueError(
                f"StochasticRoundingAdam trains bfloat16 and float32 parameters, got {', '.join(unsupported)}"
            )
        device = parameters[0].device if parameters else torch.device("cpu")
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        """One Adam step of every parameter with a gradient, one parameter at a time."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for parameter in group["params"]:
                if parameter.grad is not None:
                    self._step_one(parameter, group["lr"], beta1, beta2, group["eps"])
        return loss

    def _step_one(self, parameter: torch.Tensor, lr: float, beta1: float, beta2: float, eps: float) -> None:
        state = self.state[parameter]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
        state["step"] += 1
        step = float(state["step"])
        tensors = (parameter, parameter.grad, state["exp_avg"], state["exp_avg_sq"])
        if parameter.dtype == torch.float32 or not all(t.is_contiguous() for t in tensors):
            self._update(*tensors, lr, beta1, beta2, eps, step)
            return
        # A bfloat16 parameter by flat slices: the float32 temporaries are one slice's, not the whole tensor's (a
        # 151,936-token embedding would otherwise make five 545 MB float32 copies at every step).
        flat = [t.view(-1) for t in tensors]
        for start in range(0, parameter.numel(), _SLICE_ELEMENTS):
            self._update(*(t[start : start + _SLICE_ELEMENTS] for t in flat), lr, beta1, beta2, eps, step)

    def _update(
        self,
        parameter: torch.Tensor,
        grad: torch.Tensor,
        exp_avg_state: torch.Tensor,
        exp_avg_sq_state: torch.Tensor,
        lr: float,
        beta1: float,
        beta2: float,
        eps: float,
        step: float,
    ) -> None:
        """Adam's step of ``parameter`` (or a slice of it) and its moments, in float32, written back in place."""
        # float32 views of a float32 parameter and its state (updated in place), float32 copies of a bfloat16 one's.
        gradient = grad.float()
        exp_avg, exp_avg_sq = exp_avg_state.float(), exp_avg_sq_state.float()
        exp_avg.lerp_(gradient, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(gradient, gradient, value=1 - beta2)
        del gradient
        step_size = lr / (1 - beta1**step)
        denominator = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
        weights = parameter.float().addcdiv_(exp_avg, denominator, value=-step_size)
        del denominator
        if parameter.dtype == torch.float32:
            parameter.copy_(weights)  # the same tensor where float() returned it; written back for clarity
            return
        for target, value in ((parameter, weights), (exp_avg_state, exp_avg), (exp_avg_sq_state, exp_avg_sq)):
            target.copy_(stochastic_round_to_bfloat16(value, self.generator))

    def state_dict(self) -> dict[str, Any]:
        """torch's optimiser state, and the rounding generator's state (base64 text, JSON-able) under
        ``"rounding_generator"``."""
        state = super().state_dict()
        state[_GENERATOR_KEY] = base64.b64encode(self.generator.get_state().numpy().tobytes()).decode("ascii")
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (a state without the generator's leaves it as it is)."""
        state = dict(state_dict)
        encoded = state.pop(_GENERATOR_KEY, None)
        super().load_state_dict(state)
        if encoded is not None:
            raw = bytearray(base64.b64decode(encoded))
            self.generator.set_state(torch.frombuffer(raw, dtype=torch.uint8).clone())
