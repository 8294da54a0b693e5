"""A product of trains, validated and put in one canonical form.

Every product the package computes is brought to a *ket stack* ``T1·T2·…·Tk``
whose site cores are padded to rank 4 ``(a, b, x_up, x_down)`` (docs/design.md §1):
size-1 bonds at the ends of a train and a size-1 down leg for an MPS. A bra
stack ``φ·A1·…·Ak`` becomes ``Akᵀ·…·A1ᵀ·φ``. One set of equations then serves
every depth and both orientations.

:func:`order_product` checks a product (sites, MPS placement, legs, dtypes) and puts
it in ket order (a :class:`Product`); :func:`make_stack` adds the NaN/inf check of
in-memory cores and gives the :class:`Stack` a run works on; :func:`exact_product`
multiplies a small product out (the reference SRC approximates).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import dask
import dask.system
import dask.utils
import numpy as np

from ._kernels import all_finite, all_finite_each, is_in_memory
from ._kernels import nbytes as nbytes_of
from ._layout import pad, padded_shape, unpad
from .trains import (
    SUPPORTED_DTYPES,
    Kind,
    TensorTrain,
    _to_numpy,
    _unknown_shape,
    _unknown_shape_error,
    as_train,
)


@dataclass(frozen=True)
class Product:
    """A validated product ``trains[0]·trains[1]·…`` in ket order: ``factors`` are
    ``(train, transposed)``; a bra ``φ·A1·…·Ak`` becomes ``Akᵀ·…·A1ᵀ·φ``."""

    trains: list[TensorTrain]  # as given, converted
    factors: tuple[tuple[TensorTrain, bool], ...]
    kind: Kind
    dtype: np.dtype
    bra: bool


def order_product(trains: tuple[Any, ...], dtype: Any = None) -> Product:
    """Check ``trains`` as a product (same length, MPS only at an end, legs that
    join, supported dtypes) and put it in ket order; errors name site and train."""
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
    mps_at = [i for i, t in enumerate(tts) if t.kind == "mps"]
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
    _check_legs(tts)
    bra = k > 1 and mps_at == [0]
    factors = tuple((t, t.kind == "mpo") for t in reversed(tts)) if bra else \
        tuple((t, False) for t in tts)
    return Product(tts, factors, "mps" if mps_at else "mpo", resolve_dtype(tts, dtype), bra)


def _check_legs(tts: list[TensorTrain]) -> None:
    """Each train's down (input) legs match the next one's up (output) legs."""
    for j in range(len(tts[0])):
        for i in range(len(tts) - 1):
            down = _legs(tts[i], j)[1 if tts[i].kind == "mpo" else 0]
            up = _legs(tts[i + 1], j)[0]
            if down != up:
                raise ValueError(
                    f"site {j}: trains[{i}] has a down (input) leg of size {down} but "
                    f"trains[{i + 1}] has an up (output) leg of size {up}; they must match"
                )


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


def exact_product(*trains: Any) -> TensorTrain:
    """The exact product ``trains[0]·trains[1]·…`` as one train, for checks.

    Bonds multiply, so this is only for products small enough to hold; it is
    the reference SRC approximates. Same conventions as :func:`src_dask.src`
    (an MPS first is a bra, an MPS last a ket).
    """
    product = order_product(trains)
    n = len(product.trains[0])
    merged = []
    for j in range(n):
        acc = None
        for t, transpose in product.factors:  # ket order, padded to (a, b, up, down)
            c = pad(_to_numpy(t[j]), t.kind, j, n, transpose).astype(product.dtype)
            if acc is None:
                acc = c
                continue
            acc = np.einsum("abux,ABxd->aAbBud", acc, c)
            s = acc.shape
            acc = acc.reshape(s[0] * s[1], s[2] * s[3], s[4], s[5])
        merged.append(unpad(acc, product.kind, j, n))
    return TensorTrain(merged, product.kind, name="exact product")


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

    def describe(self) -> str:
        """The product as the plan and the run log name it, in the order it was given:
        ``MPO·MPS (ket), 50 sites, bonds 4·1000, complex128`` (each factor's largest
        bond)."""
        factors = self.factors[::-1] if self.bra else self.factors
        kinds = "·".join(f.train.kind.upper() for f in factors)
        bonds = "·".join(str(max(f.padded_shape(j)[0] for j in range(self.n))) for f in factors)
        return (f"{kinds} ({'bra' if self.bra else 'ket'}), {self.n} sites, bonds {bonds}, "
                f"{self.dtype}")

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
        return self._max_ranks[site]

    @cached_property
    def _max_ranks(self) -> tuple[int, ...]:
        """:meth:`max_rank` of every site (the plan asks thousands of times a call):
        the lesser of the bonds' product and the physical legs' left of the cut."""
        ranks, phys = [], 1
        for j in range(self.n):
            ranks.append(min(math.prod(self.left_bonds(j)), phys))
            phys *= self.up(j) * self.down(j)
        return tuple(ranks)

    def up(self, site: int) -> int:
        """Size of the output's up (row or physical) leg at ``site``."""
        return self._padded[site][0][2]

    def down(self, site: int) -> int:
        """Size of the output's down (column) leg; 1 for an MPS result."""
        return self._padded[site][-1][3]

    def result_bytes(self, chi_out: int) -> int:
        """Bytes of the result's cores at most (bonds of at most ``chi_out``)."""
        bonds = [min(chi_out, r) for r in self._max_ranks[1:]]
        return self.dtype.itemsize * sum(
            a * b * self.up(j) * self.down(j)
            for j, (a, b) in enumerate(zip([1, *bonds], [*bonds, 1], strict=True)))

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


#: In-memory cores of more bytes than this are checked for NaN/inf by several threads.
_THREADED_CHECK_BYTES = 64 << 20


def _check_finite_now(trains: list[TensorTrain]) -> None:
    """NaN/inf check for in-memory cores; lazy (Dask, Zarr) ones are checked in the graph.
    Large NumPy inputs are read by a thread per core of the host (NumPy's sums let go
    of the GIL): one thread reads at a fraction of the memory's rate, and the inputs of
    a χ=1000 MPO·MPS are 1.6 GB, read before every call."""
    cores = [(i, j, c) for i, t in enumerate(trains) for j, c in enumerate(t)
             if is_in_memory(c)]
    host = [n for n, (*_, c) in enumerate(cores) if isinstance(c, np.ndarray)]
    device = [n for n, (*_, c) in enumerate(cores) if not isinstance(c, np.ndarray)]
    finite = [True] * len(cores)
    if device:  # CuPy cores: their sums queued on this thread's stream, one wait
        for n, ok in zip(device, all_finite_each([cores[n][2] for n in device]), strict=True):
            finite[n] = ok
    threads = min(8, dask.system.CPU_COUNT)  # the process's CPUs (affinity, cgroup)
    if sum(nbytes_of(cores[n][2]) for n in host) < _THREADED_CHECK_BYTES or threads < 2:
        for n in host:
            finite[n] = all_finite(cores[n][2])
    else:
        with ThreadPoolExecutor(threads) as pool:
            for n, ok in zip(host, pool.map(lambda n: all_finite(cores[n][2]), host),
                             strict=True):
                finite[n] = ok
    for (i, j, _), ok in zip(cores, finite, strict=True):
        if not ok:
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
