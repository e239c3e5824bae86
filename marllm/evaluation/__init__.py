"""Evaluation metrics for trained policies."""

from marllm.evaluation.pass_at_k import mean_pass_at_k, pass_at_k

__all__ = ["mean_pass_at_k", "pass_at_k"]
