"""Evaluation of generated code: pass@k and HumanEval (``trainer_lib.eval.humaneval``, imported on use)."""

from trainer_lib.eval.pass_at_k import mean_pass_at_k, pass_at_k

__all__ = ["mean_pass_at_k", "pass_at_k"]
