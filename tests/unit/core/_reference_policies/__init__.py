"""Frozen copies of the Tempo and GMAX policies (and their helpers) as they were before the
decision-latency optimisation. Used only by test_policy_plan_regression.py, which checks that
the optimised policies still produce exactly the same StepPlans. Do not edit."""
