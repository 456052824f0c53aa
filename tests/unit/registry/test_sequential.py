"""The early stop's error rate, checked by simulation (roboloop/registry/simulate.py): a challenger exactly `margin`
worse than the champion must be promoted at most about alpha of the time, looks included, and an equally good one
mostly promoted, with fewer episodes played."""

from __future__ import annotations

import pytest

from roboloop.registry.simulate import promotion_rate

ALPHA, SLACK = 0.05, 0.02  # 2,000 runs: a rate's standard error is about 0.005 at 5%


@pytest.mark.parametrize("p, rho", [(0.5, 0.0), (0.8, 0.0), (0.8, 0.7)])
def test_looking_early_keeps_false_promotions_near_alpha(p, rho):
    sequential = promotion_rate(p, delta=0.05, rho=rho)
    assert sequential.promoted <= ALPHA + SLACK, sequential
    assert sequential.stopped_early > 0.02  # the looks happen (and some decide)


def test_the_earlier_rule_that_tested_the_end_at_full_alpha_promotes_too_often():
    """What the looks cost before the gate's last test spent alpha / looks too: the same simulation, above alpha."""
    earlier = promotion_rate(0.8, delta=0.05, rho=0.0, final_alpha_per_look=False)
    fixed = promotion_rate(0.8, delta=0.05, rho=0.0)
    assert earlier.promoted > ALPHA + 0.015 and fixed.promoted < earlier.promoted - 0.02, (earlier, fixed)


def test_an_equally_good_challenger_is_mostly_promoted_and_often_early():
    same = promotion_rate(0.9, delta=0.0, rho=0.7)
    assert same.promoted >= 0.5 and same.mean_episodes < 96, same
