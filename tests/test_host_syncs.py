"""Host synchronisations of one PPO iteration, counted and bounded.

Every operation that reads a device tensor's value on the host — ``.item()``, ``.tolist()``, ``.cpu()``, ``bool``/
``int``/``float`` of a tensor (an ``if`` on one), indexing with a boolean mask (its result's size is data), and
``nonzero`` — makes the host wait until the device has run everything queued before it. On a GPU each one drains the
kernel queue; inside the per-token decode loop and the per-mini-batch forward/backward they add up.

Here they are counted on the CPU by patching those Python entry points (torch's own C++ does not go through them, so
nothing is counted twice), during (a) one ``act`` — the collector's rollout: generate, then the policy's and the
reference's scoring — and (b) each mini-batch of the update (:meth:`PPOSteps.accumulate`). On the CPU every tensor
is a "device" tensor, so the count is an upper bound of a GPU's: a few of the counted calls read tensors the update
moved to the host once beforehand (the masses and token counts of :func:`~marllm.algorithms.ppo_steps.host_rows`),
which cost nothing on a GPU. Each bound is the count measured when it was written plus about 10% (at least 1): a new
sync in the hot path fails the test, and its message names the call sites, so that the new one is easy to find. A
count that fell (a sync removed) should lower its bound.

Measured (transformers 5.x, torch 2.13, GPT-2 with SDPA attention, 8 prompts, 8 new tokens, mini-batches of 4):

- act: 29 — 15 in transformers' decode loop (its stopping check ``unfinished.max() == 0`` at each token, the SDPA
  mask's "can the causal mask be skipped" test at each decode forward), 5 in generate's set-up, 4 in the two scoring
  forwards' mask tests, and 5 of marllm's: the prompts' lengths check, the response lengths and tokens to decode
  (1 each), the shared-prefix test (2). None grows with the batch
  (:func:`test_syncs_of_an_act_do_not_grow_with_the_batch`). It was 39 before the reductions that came with this
  test: a ``.tolist()`` per response to decode it, and two ``nonzero`` and ``.tolist()`` in the lengths check.
- mini-batch, one pass: 10 — transformers' mask tests (2), the shared-prefix test (1), the padding trim (1), the
  loss's finiteness (1), the rescore's and the objective's statistics (1 each), and 3 on host tensors (the pass's
  mass shares and tokens: free on a GPU). It was 22: each statistic an ``.item()``, the trim four syncs and a
  ``nonzero``, the token count and the lengths read off the device at every mini-batch.
- mini-batch of two micro-batch passes: 20.4 (the mask test's count depends on the padding a pass keeps).
- the update outside its mini-batches: 23 — the targets and their statistics (14), one copy of the rows' masses,
  tokens and lengths to the host (1), the gradient norm's finiteness at each of the 8 optimiser steps.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from marllm.algorithms import GenerationConfig, PPOConfig, PPOLearner, ppo_steps
from tests.conftest import make_tiny_gpt2

# The Python entry points that read a tensor's value on the host. numpy() is not among them: on a device tensor it
# fails, a .cpu() (counted) comes first.
SYNCING_METHODS = ("item", "tolist", "cpu", "__bool__", "__int__", "__float__", "__index__", "nonzero")

PROMPTS = ("this movie was", "the film", "i loved the story , a", "what a terrible")
NEW_TOKENS = 8

# Bounds: measured + ~10% (see the module docstring). Raise one only for a sync that cannot be avoided, and say why.
MAX_SYNCS_PER_ACT = 32  # measured 29
MAX_SYNCS_PER_MINIBATCH = {"auto": 11, 2: 23}  # by ppo.compute.micro_batch_size; measured 10 (one pass) and 20.4 (two)
MAX_SYNCS_PER_UPDATE_OUTSIDE_MINIBATCHES = 26  # measured 23


def _is_mask_index(tensor: torch.Tensor, index: Any, *rest: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(item, torch.Tensor) and item.dtype == torch.bool for item in items)


def _call_site() -> str:
    """Where the syncing call was made: the innermost frame outside torch and this file."""
    here = os.path.abspath(__file__)
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if f"{os.sep}torch{os.sep}" not in path and path != here:
            where = path.split(f"site-packages{os.sep}")[-1] if "site-packages" in path else os.path.relpath(path)
            return f"{where}:{frame.lineno} ({frame.name})"
    return "?"


class SyncCounter:
    """Counts the syncing calls made while a phase is open (:meth:`phase`), by phase and call site."""

    def __init__(self) -> None:
        self.sites: Counter[tuple[str, str, str]] = Counter()  # (phase, operation, call site) -> calls
        self._phase: str | None = None
        self._depth = 0  # inside a counted call: what it calls in turn is not a sync of its own

    def patch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in SYNCING_METHODS:
            monkeypatch.setattr(torch.Tensor, name, self._counted(getattr(torch.Tensor, name), name))
        monkeypatch.setattr(
            torch.Tensor, "__getitem__", self._counted(torch.Tensor.__getitem__, "mask index", _is_mask_index)
        )
        monkeypatch.setattr(torch, "nonzero", self._counted(torch.nonzero, "nonzero"))

    def _counted(
        self, original: Callable[..., Any], name: str, applies: Callable[..., bool] | None = None
    ) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self._phase is not None and not self._depth and (applies is None or applies(*args, **kwargs)):
                self.sites[(self._phase, name, _call_site())] += 1
            self._depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._depth -= 1

        return counted

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        outer, self._phase = self._phase, name
        try:
            yield
        finally:
            self._phase = outer

    def count(self, phase: str) -> int:
        return sum(calls for (counted, _, _), calls in self.sites.items() if counted == phase)

    def report(self, phase: str) -> str:
        """The phase's calls by site, most first: what a failing bound prints."""
        rows = sorted(((calls, op, site) for (p, op, site), calls in self.sites.items() if p == phase), reverse=True)
        return "\n".join(f"{calls:5}  {op:<11} {site}" for calls, op, site in rows)


def make_learner(tokenizer: Any, **ppo: Any) -> PPOLearner:
    """A PPO learner on a tiny GPT-2 whose every response runs to ``NEW_TOKENS`` (no EOS): the counts do not depend
    on when a response ends."""
    settings = {"mini_batch_size": 4, "learning_rate": 1e-3} | ppo
    return PPOLearner(
        "llm1",
        model=make_tiny_gpt2(tokenizer),
        tokenizer=tokenizer,
        reference=make_tiny_gpt2(tokenizer).requires_grad_(False).eval(),
        config=PPOConfig.from_flat(**settings),
        generation=GenerationConfig(NEW_TOKENS, NEW_TOKENS, stop_at_eos=False),
        seed=0,
    )


def counted_iteration(
    learner: PPOLearner, counter: SyncCounter, monkeypatch: pytest.MonkeyPatch, batch: int = 8
) -> int:
    """One act, finish and update of ``learner``, counted: the act under ``"act"``, each mini-batch under
    ``"minibatch"``, the rest of the update under ``"update"``. Returns the number of mini-batches."""
    minibatches = 0
    accumulate = ppo_steps.PPOSteps.accumulate

    def counted_accumulate(self: ppo_steps.PPOSteps, *args: Any) -> Any:
        nonlocal minibatches
        minibatches += 1
        with counter.phase("minibatch"):
            return accumulate(self, *args)

    monkeypatch.setattr(ppo_steps.PPOSteps, "accumulate", counted_accumulate)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
    with counter.phase("act"):
        learner.act({"prompt": prompts})
    learner.finish([0.25 * (i % 3) - 0.25 for i in range(batch)])
    with counter.phase("update"):
        learner.update()
    return minibatches


@pytest.fixture
def counter(monkeypatch: pytest.MonkeyPatch) -> SyncCounter:
    counter = SyncCounter()
    counter.patch(monkeypatch)
    return counter


@pytest.mark.parametrize("micro_batch_size", list(MAX_SYNCS_PER_MINIBATCH))
def test_syncs_of_one_act_and_of_each_minibatch_stay_within_their_bounds(
    tokenizer, counter, monkeypatch, micro_batch_size
):
    learner = make_learner(tokenizer, micro_batch_size=micro_batch_size)
    minibatches = counted_iteration(learner, counter, monkeypatch)
    assert minibatches == 8  # 4 epochs of 2 mini-batches

    act = counter.count("act")
    assert act <= MAX_SYNCS_PER_ACT, f"{act} syncs in one act (bound {MAX_SYNCS_PER_ACT}):\n{counter.report('act')}"
    per_minibatch, bound = counter.count("minibatch") / minibatches, MAX_SYNCS_PER_MINIBATCH[micro_batch_size]
    assert per_minibatch <= bound, (
        f"{per_minibatch} syncs per mini-batch (bound {bound}); over the update's {minibatches}:\n"
        f"{counter.report('minibatch')}"
    )
    rest = counter.count("update")  # the mini-batches are counted apart
    assert rest <= MAX_SYNCS_PER_UPDATE_OUTSIDE_MINIBATCHES, (
        f"{rest} syncs in the update outside its mini-batches (bound {MAX_SYNCS_PER_UPDATE_OUTSIDE_MINIBATCHES}):\n"
        f"{counter.report('update')}"
    )


def test_syncs_of_an_act_do_not_grow_with_the_batch(tokenizer, counter, monkeypatch):
    """A per-response sync (a ``.tolist()`` of each row) would cost a GPU a wait per response: the count of an act of
    16 prompts is that of 4."""
    counts = []
    for batch in (4, 16):
        counter.sites.clear()
        counted_iteration(make_learner(tokenizer), counter, monkeypatch, batch)
        counts.append(counter.count("act"))
    assert counts[0] == counts[1], f"acts of 4 and 16 prompts: {counts} syncs\n{counter.report('act')}"


def test_the_counter_sees_each_kind_of_sync(counter):
    """The patched entry points are the ones torch calls: each kind, once."""
    x = torch.arange(4.0)
    with counter.phase("probe"):
        x.sum().item()
        x.tolist()
        x.cpu()
        bool(x[0])
        int(x[1])
        float(x[2])
        x[x > 1]
        torch.nonzero(x)
        x.nonzero()
    operations = Counter(op for (_, op, _), calls in counter.sites.items() for _ in range(calls))
    assert operations == Counter(
        {
            "item": 1,
            "tolist": 1,
            "cpu": 1,
            "__bool__": 1,
            "__int__": 1,
            "__float__": 1,
            "mask index": 1,
            "nonzero": 2,
        }
    )
