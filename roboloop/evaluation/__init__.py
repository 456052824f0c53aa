"""Evaluation: batched environments (Isaac Lab, gymnasium), policies, the Evaluator, rollouts."""
