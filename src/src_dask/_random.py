"""The Khatri–Rao sketch: Gaussian test vectors that do not depend on chunking.

Column ``s`` of the sketch at site ``j`` is drawn from its own counter-based
stream, a Philox generator keyed by ``(seed, j)`` whose counter holds ``s``.
The values of ``Ω_j[s]`` therefore depend on ``(seed, j, s)`` only, never on
how the columns are split into blocks or on which worker draws them, so a run
is reproducible across chunk sizes and cluster shapes (DESIGN.md §1).
"""

from __future__ import annotations

import numpy as np


def seed_key(seed: int | None) -> int:
    """A 64-bit Philox key word for ``seed`` (fresh entropy when None)."""
    return int(np.random.SeedSequence(seed).generate_state(1, np.uint64)[0])


def sketch_block(key: int, site: int, start: int, stop: int, legs: tuple[int, ...],
                 dtype: np.dtype) -> np.ndarray:
    """``Ω_site[start:stop]`` as a float64/complex128 host array of shape ``(stop-start, *legs)``.

    Real dtypes draw N(0, 1); complex ones (x + iy)/√2 with x, y ~ N(0, 1).
    """
    size = int(np.prod(legs))
    is_complex = np.dtype(dtype).kind == "c"
    draws = 2 * size if is_complex else size
    out = np.empty((stop - start, draws))
    key_words = np.array([key, site], dtype=np.uint64)  # (a list would go through float64)
    bits = np.random.Philox(key=key_words)
    gen = np.random.Generator(bits)
    state = bits.state
    for i, col in enumerate(range(start, stop)):
        # Column index in counter word 1: streams of neighbouring columns never
        # overlap (word 0 is the one Philox increments while drawing).
        state["state"] = {"counter": np.array([0, col, 0, 0], dtype=np.uint64), "key": key_words}
        state["buffer_pos"] = 4
        state["has_uint32"] = 0
        bits.state = state
        out[i] = gen.standard_normal(draws)
    if is_complex:
        out = (out[:, :size] + 1j * out[:, size:]) / np.sqrt(2.0)
    return out.reshape((stop - start, *legs))
