"""PPOLearner: one agent's token-level PPO with a KL-penalised reward and a value head.

tianshou's PPO policies treat one transition as one action with one reward; an LLM response is a sequence of token
actions with a per-token KL-penalised reward over a padded batch, so the maths is written in ``core``; tianshou serves
the running score statistics and the rollout container (:class:`tianshou.data.Batch`). As tianshou builds PPO on an
actor-critic, :class:`PPOLearner` builds on the clipped policy-gradient learner
(:class:`~marllm.algorithms.policy_gradient.PolicyGradientLearner`, which acts, keeps rollouts and runs the optimiser
steps) and adds what PPO is: a value head, token rewards with GAE (:func:`~marllm.algorithms.core.ppo_targets`) and
the clipped surrogate plus the clipped value loss (:func:`~marllm.algorithms.core.ppo_objective`).
"""

from __future__ import annotations

import torch
from tianshou.data import Batch

from marllm.algorithms.core import ppo_objective, ppo_target_stats, ppo_targets
from marllm.algorithms.learner_arguments import new_value_head
from marllm.algorithms.policy_gradient import PolicyGradientLearner
from marllm.algorithms.ppo_steps import NonFiniteLossError
from marllm.algorithms.rollout import Rollout
from marllm.models.policy import ValueHead

__all__ = ["NonFiniteLossError", "PPOLearner", "Rollout"]


class PPOLearner(PolicyGradientLearner):
    """An independent PPO learner (CORY's): it generates for its agent, keeps its rollout, and updates its own policy
    and value head. Its arguments are :class:`~marllm.algorithms.policy_gradient.PolicyGradientLearner`'s.

    PPO adds to the clipped policy gradient a critic (a value head on the policy's last hidden state, trained in the
    same optimiser), token rewards (the score at the last response token, −η·KL at every token), GAE advantages
    against the critic (Schulman et al., 2016), and ``vf_coef`` × the clipped value loss.
    """

    def _critic(self) -> ValueHead:
        """A value head on the policy's hidden states, prepared by the learner's placement as the policy was."""
        return new_value_head(self.model, self.device, self.placement)

    def _advantages(self, b: Batch, scores: torch.Tensor, kl_coef: float) -> dict[str, torch.Tensor]:
        """Token ``rewards`` (the score at the last response token, −η·KL at every token), GAE ``advantages`` and
        ``returns`` against the value head and, if ``whiten_advantages``, the advantages whitened over the batch's
        response tokens."""
        return ppo_targets(b, scores, kl_coef, self.config, self._all_reduce())

    def _advantage_stats(self, b: Batch) -> dict[str, float]:
        return ppo_target_stats(b)

    def _objective(
        self, mb: Batch, logprobs: torch.Tensor, values: torch.Tensor | None, kl_coef: float
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped surrogate plus ``vf_coef`` × the clipped value loss (the KL is in the reward, not here)."""
        if values is None:
            raise ValueError(f"learner {self.name!r}: PPO's loss needs the value head's values of the mini-batch")
        return ppo_objective(mb, logprobs, values, self.config)
