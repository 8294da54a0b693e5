"""A product of trains, validated and put in one canonical form.

Every product the package computes is brought to a *ket stack* ``T1·T2·…·Tk``
whose site cores are padded to rank 4 ``(a, b, x_up, x_down)`` (docs/design.md §1):
size-1 bonds at the ends of a train and a size-1 down leg for an MPS. A bra
stack ``φ·A1·…·Ak`` becomes ``Akᵀ·…·A1ᵀ·φ``. One set of equations then serves
every depth and both orientations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ._kernels import all_finite, is_in_memory
from .trains import Kind, TensorTrain, _unknown_shape, _unknown_shape_error, as_train

SUPPORTED_DTYPES = tuple(np.dtype(t) for t in ("float32", "float64", "complex64", "complex128"))


@dataclass(frozen=True)
class Factor:
    """One train of the ket stack; ``transpose`` swaps its up and down legs."""

    train: TensorTrain
    transpose: bool = False

    def padded_shape(self, site: int) -> tuple[int, int, int, int]:
        """The rank-4 shape ``(a, b, up, down)`` of this factor's core at ``site``."""
        n = len(self.train)
        shape = list(self.train[site].shape)
        if site == 0:
            shape.insert(0, 1)
        if site == n - 1:
            shape.insert(1, 1)
        if self.train.kind == "mps":
            shape.append(1)
        if self.transpose:
            shape[2], shape[3] = shape[3], shape[2]
        return tuple(int(s) for s in shape)


@dataclass(frozen=True)
class Stack:
    """A validated product in ket order; see the module docstring."""

    factors: tuple[Factor, ...]
    kind: Kind
    dtype: np.dtype
    bra: bool

    @property
    def n(self) -> int:
        return len(self.factors[0].train)

    @property
    def depth(self) -> int:
        return len(self.factors)

    @cached_property
    def _padded(self) -> tuple[tuple[tuple[int, int, int, int], ...], ...]:
        """Every factor's rank-4 core shape, per site (asked for many times a site)."""
        return tuple(tuple(f.padded_shape(j) for f in self.factors) for j in range(self.n))

    def shapes(self, site: int) -> list[tuple[int, int, int, int]]:
        return list(self._padded[site])

    def left_bonds(self, site: int) -> tuple[int, ...]:
        return tuple(s[0] for s in self.shapes(site))

    def max_rank(self, site: int) -> int:
        """An upper bound of the product's rank at the cut left of ``site``."""
        bonds = math.prod(self.left_bonds(site))
        phys = 1
        for j in range(site):  # stops once the physical legs exceed the bonds
            phys *= self.up(j) * self.down(j)
            if phys >= bonds:
                return bonds
        return phys

    def up(self, site: int) -> int:
        """Size of the output's up (row or physical) leg at ``site``."""
        return self._padded[site][0][2]

    def down(self, site: int) -> int:
        """Size of the output's down (column) leg; 1 for an MPS result."""
        return self._padded[site][-1][3]


def resolve_dtype(trains: list[TensorTrain], dtype: Any) -> np.dtype:
    """The working dtype: ``dtype`` if given, else promoted from the inputs."""
    for i, t in enumerate(trains):
        for j, c in enumerate(t):
            dt = np.dtype(c.dtype)
            if dt.kind not in "biufc" or dt.itemsize > 16 or dt in (np.float16, np.longdouble):
                raise TypeError(
                    f"trains[{i}], site {j}: unsupported dtype {dt}; use float32, float64, "
                    "complex64 or complex128"
                )
    promoted = np.result_type(*[np.dtype(c.dtype) for t in trains for c in t])
    if promoted.kind in "biu":
        promoted = np.dtype("float64")
    if dtype is None:
        return promoted
    try:
        want = np.dtype(dtype)
    except TypeError as err:
        raise TypeError(f"dtype: not a dtype: {dtype!r}") from err
    if want not in SUPPORTED_DTYPES:
        raise TypeError(
            f"dtype: unsupported {want}; use float32, float64, complex64 or complex128"
        )
    if promoted.kind == "c" and want.kind != "c":
        raise TypeError(
            f"dtype: the inputs are complex ({promoted}) but dtype={want} would drop "
            "their imaginary parts"
        )
    return want


def _legs(train: TensorTrain, site: int) -> tuple[int | None, int | None]:
    """(up, down) physical sizes at ``site``; an MPS has only its ``p`` leg."""
    shape = train[site].shape
    if train.kind == "mps":
        return int(shape[-1]), None
    return int(shape[-2]), int(shape[-1])


def _check_finite_now(trains: list[TensorTrain]) -> None:
    """NaN/inf check for in-memory cores; lazy (Dask, Zarr) ones are checked in the graph."""
    for i, t in enumerate(trains):
        for j, c in enumerate(t):
            if is_in_memory(c) and not all_finite(c):
                raise ValueError(f"trains[{i}], site {j}: the core contains NaN or inf")


def make_stack(trains: tuple[Any, ...], dtype: Any = None) -> Stack:
    """Validate ``trains`` as the product ``trains[0]·trains[1]·…`` (see module doc)."""
    if not trains:
        raise ValueError("src needs at least one train")
    tts = [as_train(t, name=f"trains[{i}]") for i, t in enumerate(trains)]
    for i, t in enumerate(tts):  # the constructor checks too; a subclass may not call it
        for j, c in enumerate(t):
            if _unknown_shape(c):
                raise _unknown_shape_error(c, f"trains[{i}]", j)
    n = len(tts[0])
    for i, t in enumerate(tts[1:], 1):
        if len(t) != n:
            raise ValueError(
                f"trains[{i}] has {len(t)} sites but trains[0] has {n}; all trains of a "
                "product need the same number of sites"
            )
    kinds = [t.kind for t in tts]
    mps_at = [i for i, k in enumerate(kinds) if k == "mps"]
    k = len(tts)
    if len(mps_at) > 1:
        raise ValueError(
            f"an MPS may stand only at one end of the product, but trains{mps_at} are MPS "
            "(an MPS at both ends would be a scalar)"
        )
    if mps_at and 0 < mps_at[0] < k - 1:
        raise ValueError(
            f"trains[{mps_at[0]}] is an MPS in the middle of the product; an MPS stands last "
            "(a ket) or first (a bra)"
        )
    bra = k > 1 and mps_at == [0]
    for j in range(n):
        for i in range(k - 1):
            down = _legs(tts[i], j)[1 if tts[i].kind == "mpo" else 0]
            up = _legs(tts[i + 1], j)[0]
            if down != up:
                raise ValueError(
                    f"site {j}: trains[{i}] has a down (input) leg of size {down} but "
                    f"trains[{i + 1}] has an up (output) leg of size {up}; they must match"
                )
    working = resolve_dtype(tts, dtype)
    _check_finite_now(tts)
    if bra:
        factors = tuple(Factor(t, transpose=t.kind == "mpo") for t in reversed(tts))
    else:
        factors = tuple(Factor(t) for t in tts)
    return Stack(factors, "mps" if mps_at else "mpo", working, bra)
