"""FLOP counts of SRC for any ket stack, and the rates derived from them.

The convention (docs/design.md §5): a complex multiply-add is 8 flop. Per site,
opt_einsum's ``optimal`` path on that site's real shapes, for pass 1's step
``C_j -> C_{j+1}``, for pass 2's sketch ``M = C·ΠT·S`` and its environment
update ``S' = conj(η)·ΠT·S`` (each counted as a network of its own), and for
the first site's core; ``opt_cost`` counts a multiply-add as 2, so flop =
opt_cost / 2 * 8. The sketch width is the method's own (wider for oversampled
runs). QRs, the rounding sweep of oversampled runs and zipup are not counted.

This count is above what the kernels execute: the kernels fuse the projection
(they form ``Z`` once, and clamp ranks; see docs/design.md §5: the count is
1.25-1.46x theirs), so a percentage "of GEMM" (this count over the wall time,
divided by the complex128 GEMM rate measured in the same run) is a rate in the
convention's units, not hardware efficiency.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

#: The convention in one line, stored in every record that holds FLOP rates.
CONVENTION = ("complex multiply-add = 8 flop; opt_einsum optimal path on the real shapes per "
              "site; QRs not counted (docs/design.md §5)")
#: The legend line of every table that prints a percentage of the GEMM rate.
LEGEND = (f"FLOPs: {CONVENTION}. The kernels execute fewer, so 'of GEMM' is a rate in "
          "these units, not hardware efficiency.")


def padded(shapes: Sequence[tuple[int, ...]], mps: bool) -> list[tuple[int, ...]]:
    """Per-site core shapes in quimb's layouts padded to (l, r, u, d): size-1 end bonds,
    and d = 1 for an MPS (docs/design.md §1)."""
    n = len(shapes)
    out = []
    for j, shape in enumerate(shapes):
        s = [int(x) for x in shape]
        if j == 0:
            s.insert(0, 1)
        if j == n - 1:
            s.insert(1, 1)
        if mps:
            s.append(1)
        out.append(tuple(s))
    return out


@functools.cache
def _equations(k: int) -> dict[str, str]:
    """The einsum equations of SRC for a ket stack of depth ``k`` (docs/design.md §1).

    Core ``T_i[a_i, b_i, x_{i-1}, x_i]``, sketch environment ``C[s, a..]``,
    Gaussian ``Omega[s, x_0, x_k]``, right environment ``S[r, b..]``, output core
    ``eta[l, r, x_0, x_k]``.
    """
    from opt_einsum import get_symbol

    sym = iter(get_symbol(i) for i in range(3 * k + 4))
    s, r, lft = next(sym), next(sym), next(sym)
    a = "".join(next(sym) for _ in range(k))
    b = "".join(next(sym) for _ in range(k))
    x = "".join(next(sym) for _ in range(k + 1))
    cores = ",".join(a[i] + b[i] + x[i] + x[i + 1] for i in range(k))
    x0k = x[0] + x[k]
    return {
        "pass1": f"{s}{a},{s}{x0k},{cores}->{s}{b}",
        "pass2_sketch_M": f"{s}{a},{cores},{r}{b}->{r}{x0k}{s}",
        "pass2_env_S": f"{lft}{r}{x0k},{cores},{r}{b}->{lft}{a}",
        "site0": f"{cores},{r}{b}->{r}{x0k}",
    }


@functools.cache
def _cost(eq: str, shapes: tuple[tuple[int, ...], ...]) -> int:
    """opt_einsum's optimal-path cost (a multiply-add counts 2)."""
    import opt_einsum as oe

    _, info = oe.contract_path(eq, *shapes, shapes=True, optimize="optimal")
    return int(info.opt_cost)


def einsum_flops(eq: str, *shapes: Sequence[int]) -> float:
    """FLOPs of one contraction in the convention: its optimal path, 8 per multiply-add."""
    return _cost(eq, tuple(tuple(int(d) for d in s) for s in shapes)) / 2 * 8


def src_flops(sites: Sequence[Sequence[tuple[int, int, int, int]]], sketch: int) -> dict[str, Any]:
    """FLOPs of SRC on a ket stack, in the module's convention.

    ``sites[j]`` holds the padded ``(a, b, up, down)`` shape of every factor at
    site ``j``, leftmost factor first. Pass 2's output bond is
    ``q = min(r * up * down, s)``.
    """
    n, k = len(sites), len(sites[0])
    eq = _equations(k)
    s = sketch
    up, down = (lambda j: sites[j][0][2]), (lambda j: sites[j][-1][3])
    cost = {key: 0 for key in eq}
    for j in range(n - 1):
        cost["pass1"] += _cost(eq["pass1"], ((s, *(t[0] for t in sites[j])),
                                             (s, up(j), down(j)), *sites[j]))
    r = 1
    for j in range(n - 1, 0, -1):
        env_s = (r, *(t[1] for t in sites[j]))
        cost["pass2_sketch_M"] += _cost(eq["pass2_sketch_M"],
                                        ((s, *(t[0] for t in sites[j])), *sites[j], env_s))
        q = min(r * up(j) * down(j), s)
        cost["pass2_env_S"] += _cost(eq["pass2_env_S"],
                                     ((q, r, up(j), down(j)), *sites[j], env_s))
        r = q
    cost["site0"] = _cost(eq["site0"], (*sites[0], (r, *(t[1] for t in sites[0]))))
    flops = {key: c / 2 * 8 for key, c in cost.items()}
    return {"convention": CONVENTION, "sketch_width": s, **flops, "total": sum(flops.values())}


def mpo_mps_flops(A, psi, sketch: int) -> dict[str, Any]:
    """:func:`src_flops` of quimb's ``A psi`` (MPO then MPS), with their real bonds."""
    t1 = padded([t.shape for t in A], mps=False)
    t2 = padded([t.shape for t in psi], mps=True)
    out = src_flops(list(zip(t1, t2, strict=True)), sketch)
    out["mps_bonds"] = sorted({t[1] for t in t2[:-1]})
    out["mpo_bonds"] = sorted({t[1] for t in t1[:-1]})
    return out


def rates(flops: float | None, seconds: float, gemm: dict[str, Any]) -> dict[str, Any]:
    """TFLOP/s in the convention's units and the fraction of the GEMM rate measured in
    the same run (None for a method whose FLOPs are not counted)."""
    if not flops:
        return {"tflops": None, "fraction_of_gemm": None}
    tflops = flops / seconds / 1e12
    return {"tflops": tflops, "fraction_of_gemm": tflops / gemm["tflops"]}
