"""Evaluation: the Evaluator, the policies it runs, perturbation suites, rollouts and videos, over any task of
roboloop.sim (the environments and tasks live there)."""
