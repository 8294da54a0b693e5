"""How far two results of src_dask are apart, core by core (the sketch depends only on
the seed, so two runs of the same problem should agree to rounding). Errors against
an exact product are ``src_dask.distance``'s."""

from __future__ import annotations

import numpy as np


def core_difference(y1, y2) -> float:
    """max_j ||y1[j] - y2[j]|| / ||y1[j]|| over the cores of two TensorTrains."""
    worst = 0.0
    for a, b in zip(y1.to_numpy(), y2.to_numpy(), strict=True):
        if a.shape != b.shape:
            return float("inf")
        worst = max(worst, float(np.linalg.norm(a - b) / np.linalg.norm(a)))
    return worst
