"""pass@k against values computed by hand from 1 - C(n-c, k) / C(n, k)."""

from math import comb

import pytest

from trainer_lib.eval import mean_pass_at_k, pass_at_k


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (1, 0, 1, 0.0),
        (1, 1, 1, 1.0),
        (2, 1, 1, 0.5),  # one of two samples is right
        (4, 1, 2, 1 - 3 / 6),  # C(3,2)/C(4,2) = 3/6 draws miss it
        (10, 3, 5, 1 - 21 / 252),  # C(7,5) = 21, C(10,5) = 252
        (10, 3, 1, 0.3),  # pass@1 is the fraction correct
        (5, 0, 3, 0.0),
        (5, 5, 3, 1.0),
        (10, 8, 3, 1.0),  # n - c = 2 < k = 3: every draw of 3 holds a correct one
        (200, 1, 100, 0.5),  # C(199,100)/C(200,100) = 100/200
    ],
)
def test_hand_computed_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_matches_the_binomial_formula_everywhere():
    for n in range(1, 30):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)


def test_large_n_is_stable():
    # the binomials here overflow floats; the product form does not
    assert pass_at_k(2000, 1000, 1) == pytest.approx(0.5)
    assert 0.0 <= pass_at_k(5000, 3, 100) <= 1.0


@pytest.mark.parametrize("n, c, k", [(0, 0, 1), (3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_rejects_impossible_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


@pytest.mark.parametrize("args", [(2.0, 1, 1), (2, 1, True), ("2", 1, 1)])
def test_rejects_non_integers(args):
    with pytest.raises(TypeError):
        pass_at_k(*args)


def test_mean_over_problems():
    assert mean_pass_at_k([(2, 1), (2, 2), (2, 0)], 1) == pytest.approx((0.5 + 1 + 0) / 3)
    with pytest.raises(ValueError):
        mean_pass_at_k([], 1)
