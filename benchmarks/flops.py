"""FLOP counts of the benchmarks' runs, and the rates derived from them.

A run's count is the library's own: :func:`plan_flops` asks ``src_dask.plan`` for the
FLOPs of each pass (``RunPlan.flops``: the kernels' contraction paths, a complex
multiply-add is 8 flop, QRs as Householder's ``O(m n^2)``), so the benchmarks do not
write SRC's equations a second time. A percentage "of GEMM" is that count over the
wall time, divided by the complex128 GEMM rate measured in the same run.

Records written before 2026-12-02 count in an earlier convention (opt_einsum's optimal
path on each contraction taken alone, QRs left out: 1.16x the plan's count on
MPO·MPS, 1.32x on the stack);
each record says which in its ``flop_convention``. :func:`einsum_flops` and
:data:`CONVENTION` are that per-contraction count, which ``tools/profile_kernels.py``
sets against single kernels.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

#: The count of :func:`einsum_flops`: one contraction on its optimal path.
CONVENTION = ("complex multiply-add = 8 flop; opt_einsum optimal path on the real shapes per "
              "contraction; QRs not counted")
#: The legend line of a table of :func:`einsum_flops` floors.
LEGEND = f"FLOPs: {CONVENTION}."
#: The count of :func:`plan_flops`, stored in every record that holds FLOP rates.
PLAN_CONVENTION = ("complex multiply-add = 8 flop; src_dask.plan's RunPlan.flops: the "
                   "kernels' own contraction paths, QRs as Householder O(m n^2)")
#: The legend line of every table that prints a percentage of the GEMM rate.
PLAN_LEGEND = f"FLOPs: {PLAN_CONVENTION}."


@functools.cache
def _cost(eq: str, shapes: tuple[tuple[int, ...], ...]) -> int:
    """opt_einsum's optimal-path cost (a multiply-add counts 2)."""
    import opt_einsum as oe

    _, info = oe.contract_path(eq, *shapes, shapes=True, optimize="optimal")
    return int(info.opt_cost)


def einsum_flops(eq: str, *shapes: Sequence[int]) -> float:
    """FLOPs of one contraction in :data:`CONVENTION`: its optimal path, 8 per
    complex multiply-add."""
    return _cost(eq, tuple(tuple(int(d) for d in s) for s in shapes)) / 2 * 8


def plan_flops(*trains: Any, chi_out: int, oversample: int | str = 0) -> dict[str, Any]:
    """FLOPs of SRC's step on ``trains``, per pass, as ``src_dask.plan`` counts them for
    ``src(*trains, chi_out=chi_out, oversample=oversample)`` (planned on the CPU with
    Dask's local scheduler: the count depends on the shapes alone). ``total`` is the
    step's (pass 1 and pass 2); an oversampled run's rounding sweep is listed apart."""
    import dask

    import src_dask

    with dask.config.set({"src_dask.device": "cpu"}):
        plan = src_dask.plan(*trains, chi_out=chi_out, oversample=oversample)
    return {"convention": PLAN_CONVENTION, "sketch_width": plan.sketch, **plan.flops,
            "total": plan.flops["pass 1"] + plan.flops["pass 2"],
            "input_bytes": plan.input_bytes, "env_bytes": plan.env_bytes}


def rates(flops: float | None, seconds: float, gemm: dict[str, Any]) -> dict[str, Any]:
    """TFLOP/s and the fraction of the GEMM rate measured in the same run (None for a
    method whose FLOPs are not counted)."""
    if not flops:
        return {"tflops": None, "fraction_of_gemm": None}
    tflops = flops / seconds / 1e12
    return {"tflops": tflops, "fraction_of_gemm": tflops / gemm["tflops"]}
