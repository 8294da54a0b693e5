"""Errors against the exact product ``A psi`` without forming a dense vector, and the
difference between two results core by core."""

from __future__ import annotations

import numpy as np


def _overlap(*tns, L: int) -> complex:
    """Full contraction of a ladder of 1D networks, site by site (tags I0, I1, ...)."""
    import quimb.tensor as qtn

    tn = qtn.TensorNetwork([t.copy() for t in tns], virtual=False)  # mangles inner inds
    tags = [f"I{j}" for j in range(L)]
    out = tn.contract_cumulative(tags, optimize="auto")
    if isinstance(out, qtn.Tensor):
        out = out.data
    return complex(out.item() if hasattr(out, "item") else out)


class ExactProduct:
    """``x = A psi`` kept as the pair (A, psi); norms and overlaps contracted per site."""

    def __init__(self, A, psi):
        self.L = psi.L
        self.A = A  # upper 'k{}', lower 'b{}'
        self.psi_b = psi.reindex_sites("b{}")  # joins A's lower legs
        # <x|x> = <psi|A^H A|psi>: the bra layer's lower legs renamed 'c{}'
        Ah = A.H.reindex({f"b{j}": f"c{j}" for j in range(self.L)})
        psi_c = psi.H.reindex_sites("c{}")
        self.norm2 = _overlap(psi_c, Ah, self.A, self.psi_b, L=self.L).real

    def rel_error(self, y) -> dict[str, float]:
        """``||y - x|| / ||x||`` via ``||y||^2 + ||x||^2 - 2 Re <y|x>``."""
        yx = _overlap(y.H, self.A, self.psi_b, L=self.L)
        yy = _overlap(y.H, y, L=self.L).real
        err2 = yy + self.norm2 - 2 * yx.real
        return {
            "rel_error": float(np.sqrt(max(err2, 0.0) / self.norm2)),
            "norm_ratio": float(np.sqrt(yy / self.norm2)),
        }


def core_difference(y1, y2) -> float:
    """max_j ||y1[j] - y2[j]|| / ||y1[j]|| over the cores of two TensorTrains."""
    worst = 0.0
    for a, b in zip(y1.to_numpy(), y2.to_numpy(), strict=True):
        if a.shape != b.shape:
            return float("inf")
        worst = max(worst, float(np.linalg.norm(a - b) / np.linalg.norm(a)))
    return worst


def _bulk(core, j: int, n: int):
    """A quimb-layout core with both bonds: a first site gets a left bond of 1, a last
    site a right bond of 1 (MPS and MPO alike)."""
    if j == 0:
        core = core[None]
    if j == n - 1:
        core = core[:, None]
    return core


def train_distance(a, b, xp=np) -> dict[str, float]:
    """How far train ``b`` is from train ``a``, whatever their bonds and gauges:
    ``||b|| / ||a||`` and ``||a - b|| / ||a||`` (Frobenius norms of the MPS/MPO), from
    ``<a|a>``, ``<b|b>`` and ``<a|b>`` contracted site by site.

    ``a`` and ``b`` are lists of cores in quimb's layout with the same physical legs;
    ``xp`` is the array module to contract with (CuPy moves the cores to the GPU one
    site at a time). Each site's pair of cores is divided by ``||a_j||``, which changes
    no ratio and keeps the products of 50 sites in range.
    """
    n = len(a)
    if len(b) != n:
        raise ValueError(f"train_distance: {n} sites against {len(b)}")
    env = {key: xp.ones((1, 1), dtype=complex) for key in ("aa", "bb", "ab")}
    for j in range(n):
        x, y = xp.asarray(_bulk(a[j], j, n)), xp.asarray(_bulk(b[j], j, n))
        scale = float(xp.linalg.norm(x))
        x, y = x / scale, y / scale
        for key, (left, right) in {"aa": (x, x), "bb": (y, y), "ab": (x, y)}.items():
            phys = list(range(2, right.ndim))
            half = xp.tensordot(env[key], right, axes=(1, 0))  # (l_left, r_right, phys)
            env[key] = xp.tensordot(left.conj(), half, axes=([0, *phys], [0, *phys]))
    aa, bb, ab = (complex(env[k].reshape(-1)[0]) for k in ("aa", "bb", "ab"))
    dist2 = aa.real + bb.real - 2 * ab.real
    return {"norm_ratio": float(np.sqrt(bb.real / aa.real)),
            "rel_distance": float(np.sqrt(max(dist2, 0.0) / aa.real))}
