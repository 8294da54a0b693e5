"""The Khatri–Rao sketch: Gaussian test vectors that do not depend on chunking.

Every number of ``Ω_j[s]`` comes from a counter-based generator: the
SplitMix64 output function applied to a Weyl sequence keyed by ``(seed, j)``,
at the position given by the column ``s`` (high 32 bits) and the draw within
the column (low 32 bits); pairs of uniforms become normals by Box–Muller.
The values of ``Ω_j[s]`` therefore depend on ``(seed, j, s)`` only — never on
how columns are split into blocks or on which worker draws them — so a run is
reproducible across chunk sizes and cluster shapes (docs/design.md §2.1), and a whole
block is drawn with a few vectorised NumPy operations (no per-column Python).
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def seed_key(seed: int | None) -> int:
    """A 64-bit key word for ``seed`` (fresh entropy when None)."""
    return int(np.random.SeedSequence(seed).generate_state(1, np.uint64)[0])


def _splitmix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function (Stafford's mix 13), elementwise on uint64."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _stream(key: int, site: int) -> np.uint64:
    """The Weyl-sequence origin of site ``site``'s columns."""
    return np.random.SeedSequence([key, site]).generate_state(1, np.uint64)[0]


def sketch_block(key: int, site: int, start: int, stop: int, legs: tuple[int, ...],
                 dtype: np.dtype) -> np.ndarray:
    """``Ω_site[start:stop]`` as a float64/complex128 host array of shape ``(stop-start, *legs)``.

    Real dtypes draw N(0, 1); complex ones (x + iy)/√2 with x, y ~ N(0, 1).
    """
    size = int(np.prod(legs))
    is_complex = np.dtype(dtype).kind == "c"
    draws = 2 * size if is_complex else size
    pairs = (draws + 1) // 2
    columns = np.arange(start, stop, dtype=np.uint64)[:, None] << np.uint64(32)
    counter = columns + np.arange(2 * pairs, dtype=np.uint64)[None, :] + np.uint64(1)
    with np.errstate(over="ignore"):
        bits = _splitmix(_stream(key, site) + counter * _GOLDEN)
    uniform = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53  # in (0, 1)
    radius = np.sqrt(-2.0 * np.log(uniform[:, 0::2]))
    angle = 2.0 * np.pi * uniform[:, 1::2]
    normal = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)], axis=1)[:, :draws]
    if is_complex:
        normal = (normal[:, :size] + 1j * normal[:, size:]) / np.sqrt(2.0)
    return normal.reshape((stop - start, *legs))


def draw_seed() -> int:
    """A fresh seed for a run given none (non-negative, fits an int64; recorded with
    the run so that it can be repeated)."""
    return int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> 1)
