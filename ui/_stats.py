"""Confidence intervals for the rates the pages compare."""

from __future__ import annotations

import math


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval of a proportion k/n (95% by default).

    Chosen over the normal approximation because the rates here are often
    near 0 or 1 on a few dozen runs, where k/n ± z·se leaves [0, 1] and
    claims certainty it does not have. With no runs the interval is [0, 1].
    """
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)
