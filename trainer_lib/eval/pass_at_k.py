"""The unbiased pass@k estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code").

With n samples of which c are correct, the chance that at least one of k samples drawn without
replacement is correct is (eq. 1)

    pass@k = 1 - C(n - c, k) / C(n, k)

The binomials overflow floats for realistic n, so we use the equivalent product
C(n - c, k) / C(n, k) = prod_{i = n-c+1}^{n} (1 - k / i), as the paper's numpy snippet does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k of the n samples (c correct) passes; needs 0 <= c <= n, 1 <= k <= n."""
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"pass_at_k: {name} must be an int, got {type(value).__name__}")
    if n < 1:
        raise ValueError(f"pass_at_k: need n >= 1 samples, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:  # every draw of k samples contains a correct one
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """Mean of pass_at_k over problems, given (n, c) per problem (the benchmark's pass@k)."""
    values = [pass_at_k(n, c, k) for n, c in counts]
    if not values:
        raise ValueError("mean_pass_at_k: no problems")
    return sum(values) / len(values)
