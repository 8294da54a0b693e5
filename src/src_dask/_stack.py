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

import dask
import dask.utils
import numpy as np

from ._kernels import all_finite, is_in_memory
from ._kernels import nbytes as nbytes_of
from ._layout import padded_shape
from .trains import Kind, TensorTrain, order_product


@dataclass(frozen=True)
class Factor:
    """One train of the ket stack; ``transpose`` swaps its up and down legs."""

    train: TensorTrain
    transpose: bool = False

    def padded_shape(self, site: int) -> tuple[int, int, int, int]:
        """The rank-4 shape ``(a, b, up, down)`` of this factor's core at ``site``."""
        return padded_shape(tuple(self.train[site].shape), self.train.kind, site,
                            len(self.train), self.transpose)


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

    @cached_property
    def widest_cut(self) -> int:
        """The most numbers a row of an environment has: the product of the left bonds
        at the cut where it is largest (an environment there is ``sketch`` rows of it)."""
        return max(math.prod(self.left_bonds(j)) for j in range(self.n))

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

    def input_bytes(self, lazy: bool) -> int:
        """Bytes of the input cores that are lazy (Dask, Zarr: read by the tasks), or
        (``lazy=False``) in memory (they travel inside the graph)."""
        return sum(nbytes_of(c) for f in self.factors for c in f.train
                   if is_in_memory(c) != lazy)


def make_stack(trains: tuple[Any, ...], dtype: Any = None) -> Stack:
    """Validate ``trains`` as the product ``trains[0]·trains[1]·…`` (see module doc)."""
    product = order_product(trains, dtype)
    _check_finite_now(product.trains)
    factors = tuple(Factor(t, transpose) for t, transpose in product.factors)
    return Stack(factors, product.kind, product.dtype, product.bra)


def _check_finite_now(trains: list[TensorTrain]) -> None:
    """NaN/inf check for in-memory cores; lazy (Dask, Zarr) ones are checked in the graph."""
    for i, t in enumerate(trains):
        for j, c in enumerate(t):
            if is_in_memory(c) and not all_finite(c):
                raise ValueError(f"trains[{i}], site {j}: the core contains NaN or inf")


def in_graph(*stacks: Stack, copies: int = 1) -> Any:
    """Dask's large-graph warning raised above the in-memory inputs of ``stacks``,
    which travel inside the graph by design (not scattered: a lost worker would lose
    them for good), ``copies`` times each, so that a graph no larger than twice that
    is not warned about."""
    nbytes = sum(stack.input_bytes(lazy=False) for stack in stacks)
    threshold = max(dask.utils.parse_bytes(
        dask.config.get("distributed.admin.large-graph-warning-threshold", "10MB")),
        2 * copies * nbytes)
    return dask.config.set({"distributed.admin.large-graph-warning-threshold": threshold})
