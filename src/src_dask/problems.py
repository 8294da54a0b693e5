"""Reference problems: random trains, the src-method stack, spin-chain Hamiltonians.

Every function returns a :class:`~src_dask.TensorTrain` in quimb's layouts
(MPS ``(l, r, p)``, MPO ``(l, r, u, d)``; end sites drop the missing bond), so
the problems of docs/design.md §5 and the benchmarks can be made, saved with
:func:`src_dask.save` and checked against quimb without quimb being installed.

- :func:`random_mps`, :func:`random_mpo`: complex (or real) Gaussian cores,
  bonds capped at what the chain can carry at each cut, scaled so that an MPS
  has norm 1 and an MPO keeps the norm of what it acts on, both on average.
- :func:`random_train`: the general form — any bonds (uneven, not capped),
  physical legs per site (an MPO's up and down legs may differ), and an
  optional decaying spectrum (a compressible product).
- :func:`stack`: the src-method stack ``N·V·M·U`` (four random MPOs, legs 4×4,
  bonds 4, 4, ``D_M``, 4, entries ``(N(0,1) + i N(0,1)) / sqrt(bond·4)``).
- :func:`heisenberg`, :func:`ising`: the exact MPOs of quimb's
  ``MPO_ham_heis`` and ``MPO_ham_ising`` (spin-1/2 operators, not Pauli
  matrices; positive ``j`` is antiferromagnetic).

The random trains are **lazy**: their cores are Dask arrays drawn chunk by
chunk from ``dask.array.random.default_rng(seed)``, so a 50 GB stack streams
through :func:`src_dask.save` without ever being held in memory, and the
same arguments always give the same numbers. The chunking of the draw is
fixed by the shapes (not by the dtype or the machine).
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import storage
from .trains import SUPPORTED_DTYPES, TensorTrain

__all__ = ["SPEC_DEFAULTS", "STACK_FACTORS", "build", "heisenberg", "ising", "random_mpo",
           "random_mps", "random_train", "spec", "spec_bytes", "stack", "stack_mpo", "write"]

#: The src-method stack: the factors' names, leftmost first, and their bonds (None: ``dm``).
STACK_FACTORS: tuple[tuple[str, int | None], ...] = (("N", 4), ("V", 4), ("M", None), ("U", 4))

#: Random cores are drawn in chunks of at most this many bytes (of complex128), so
#: that all threads share the work on one large core.
_DRAW_CHUNK_BYTES = 32 * 2**20

_DTYPES = tuple(t.name for t in SUPPORTED_DTYPES)


def _dtype(dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.name not in _DTYPES:
        raise ValueError(f"dtype: expected one of {', '.join(_DTYPES)}, got {dt.name}")
    return dt


def _positive(x: int, what: str, least: int = 1) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < least:
        raise ValueError(f"{what}: expected an int >= {least}, got {x!r}")
    return int(x)


def _core_shape(j: int, bonds: Sequence[int], legs: tuple[int, ...]) -> tuple[int, ...]:
    """quimb's layout of site ``j`` given the ``n - 1`` bonds: ``(l, r, *legs)``
    without the missing bond at the ends."""
    n = len(bonds) + 1
    left = (bonds[j - 1],) if j > 0 else ()
    right = (bonds[j],) if j < n - 1 else ()
    return (*left, *right, *legs)


def _capped_bonds(sites: int, bond: int, phys: int) -> list[int]:
    """``bond`` at every cut, capped by ``phys**k`` where ``k`` counts the sites on
    the smaller side of the cut: larger bonds would only add redundant directions."""
    out = []
    for cut in range(1, sites):
        k, cap = min(cut, sites - cut), 1
        while k and cap < bond:  # phys**k without building huge ints
            cap, k = cap * phys, k - 1
        out.append(min(bond, cap))
    return out


def _gaussian_train(kind: str, bonds: Sequence[int], legs: Sequence[tuple[int, ...]],
                    scales: Sequence[float], dtype: np.dtype, seed: int | None,
                    decay: float | None = None) -> TensorTrain:
    """Lazy Gaussian cores: site ``j`` is ``scales[j] * (re + 1j*im)`` (``re`` alone for a
    real dtype), ``re`` and ``im`` standard normal, drawn in float64 and cast; legs
    ``legs[j]``; with ``decay``, index ``i`` of each right bond weighted by ``decay**i``.

    The numbers are those of ``dask.array.random.default_rng(seed)``'s
    ``standard_normal`` for ``re``, then ``im``, site by site (each block from its own
    spawned seed, as dask draws it); each block is one task named
    ``src_random_<kind>``, so the dashboard tells the inputs' draws from Dask's own
    arithmetic, and no ``standard_normal``/``mul``/``add`` chain runs per block."""
    import dask.array as da
    from dask.base import tokenize

    seeds = np.random.SeedSequence(seed)  # what dask's default_rng(seed) spawns from
    cores = []
    for j, scale in enumerate(scales):
        shape = _core_shape(j, bonds, legs[j])
        chunks = da.core.normalize_chunks(storage.chunks_for(shape, 16, _DRAW_CHUNK_BYTES),
                                          shape)
        blocks = list(itertools.product(*(range(len(c)) for c in chunks)))
        re = seeds.spawn(len(blocks))
        im = seeds.spawn(len(blocks)) if dtype.kind == "c" else [None] * len(blocks)
        axis = 0 if j == 0 else 1  # the right bond
        weights = decay ** np.arange(bonds[j], dtype=float) \
            if decay is not None and j < len(bonds) else None
        name = f"src_random_{kind}-" + tokenize(seeds.entropy, re[0].spawn_key, shape, chunks,
                                                scale, weights, dtype.str)
        starts = [np.cumsum((0, *c)) for c in chunks]
        dsk = {}
        for block, r, i in zip(blocks, re, im, strict=True):
            size = tuple(c[b] for c, b in zip(chunks, block, strict=True))
            w = None if weights is None else \
                weights[starts[axis][block[axis]]:starts[axis][block[axis] + 1]]
            dsk[(name, *block)] = (_draw_block, r, i, size, scale, w, axis, dtype.str)
        cores.append(da.Array(dsk, name, chunks, meta=np.empty((0,) * len(shape), dtype)))
    return TensorTrain(cores, kind, name=f"random {kind}")  # type: ignore[arg-type]


def _draw_block(re: np.random.SeedSequence, im: np.random.SeedSequence | None,
                size: tuple[int, ...], scale: float, weights: np.ndarray | None, axis: int,
                dtype: str) -> np.ndarray:
    """One block of a core of :func:`_gaussian_train`, in the order of operations of
    its former chain of Dask array operations (the same numbers, bit for bit)."""
    block = np.random.default_rng(np.random.PCG64(re)).standard_normal(size)
    if im is not None:
        block = block + 1j * np.random.default_rng(np.random.PCG64(im)).standard_normal(size)
    block = block * scale
    if weights is not None:
        block = block * weights.reshape((-1,) + (1,) * (block.ndim - axis - 1))
    return block.astype(dtype, copy=False)


def random_train(kind: str, bonds: Sequence[int], phys: int | Sequence[int] = 2, *,
                 down: int | Sequence[int] | None = None, dtype: Any = "complex128",
                 seed: int | None = None, decay: float | None = None) -> TensorTrain:
    """A random MPS or MPO with exactly the ``n - 1`` bonds ``bonds``, lazily drawn.

    ``phys`` (an int, or one per site) is the MPS's physical leg or the MPO's up
    leg, ``down`` the MPO's down leg (default: ``phys``). Entries are standard
    Gaussian (complex ``x + iy``), unscaled; with ``decay`` in (0, 1) index ``i``
    of every right bond is weighted by ``decay**i``, so the product of such trains
    has a decaying spectrum and compresses well. Odd shapes for tests and
    examples: uneven bonds, physical dimension 3, different up and down legs.
    """
    if kind not in ("mps", "mpo"):
        raise ValueError(f"kind: expected 'mps' or 'mpo', got {kind!r}")
    bonds = [_positive(b, "bond") for b in bonds]
    n = len(bonds) + 1
    _positive(n, "sites", 2)
    ups = _per_site(phys, n, "phys")
    legs = [(u,) for u in ups] if kind == "mps" else \
        list(zip(ups, _per_site(ups if down is None else down, n, "down"), strict=True))
    return _gaussian_train(kind, bonds, legs, [1.0] * n, _dtype(dtype), seed, _decay(decay))


def _decay(decay: float | None) -> float | None:
    if decay is not None and (isinstance(decay, bool) or not 0 < decay <= 1):
        raise ValueError(f"decay: expected a number in (0, 1], got {decay!r}")
    return decay


def _per_site(x: int | Sequence[int], n: int, what: str) -> list[int]:
    values = [x] * n if isinstance(x, (int, np.integer)) else list(x)
    if len(values) != n:
        raise ValueError(f"{what}: expected an int or {n} values (one per site), got "
                         f"{len(values)}")
    return [_positive(v, what) for v in values]


def random_mps(sites: int, bond: int, phys: int = 2, *, dtype: Any = "complex128",
               seed: int | None = None, decay: float | None = None) -> TensorTrain:
    """A random MPS of ``sites`` sites with physical dimension ``phys``, lazily drawn.

    The bond at each cut is ``min(bond, phys**k)`` (``k`` sites on the smaller
    side). Entries are Gaussian with variance ``1 / (r * phys)`` (``r`` the
    site's right bond; complex entries ``(x + iy)/sqrt(2)`` of that scale), which
    makes ``E <psi|psi> = 1``: products of many such trains stay of order one.
    ``decay`` in (0, 1] weights index ``i`` of every right bond by ``decay**i`` (a
    decaying spectrum: the state, and its products, compress well), the scale
    corrected so that the norm stays of order one.
    """
    sites, bond, phys = _positive(sites, "sites", 2), _positive(bond, "bond"), \
        _positive(phys, "phys")
    dt = _dtype(dtype)
    bonds = _capped_bonds(sites, bond, phys)
    scales = _scales(bonds, phys, dt, _decay(decay))
    return _gaussian_train("mps", bonds, [(phys,)] * sites, scales, dt, seed, decay)


def random_mpo(sites: int, bond: int, phys: int = 2, *, dtype: Any = "complex128",
               seed: int | None = None, decay: float | None = None) -> TensorTrain:
    """A random MPO of ``sites`` sites, legs ``phys × phys``, lazily drawn.

    The bond at each cut is ``min(bond, (phys**2)**k)``. Entries are Gaussian with
    variance ``1 / (r * phys)``, so that ``E |A x|^2 = |x|^2`` for any ``x``:
    the MPO neither shrinks nor blows up the states it is applied to. ``decay``:
    as for :func:`random_mps`.
    """
    sites, bond, phys = _positive(sites, "sites", 2), _positive(bond, "bond"), \
        _positive(phys, "phys")
    dt = _dtype(dtype)
    bonds = _capped_bonds(sites, bond, phys * phys)
    scales = _scales(bonds, phys, dt, _decay(decay))
    return _gaussian_train("mpo", bonds, [(phys, phys)] * sites, scales, dt, seed, decay)


def _scales(bonds: Sequence[int], phys: int, dtype: np.dtype,
            decay: float | None) -> list[float]:
    """Per site, the scale that keeps a norm of order one: variance ``1 / (w * phys)``
    with ``w`` the right bond's summed squared weights (its size without decay)."""
    re_im = 2 if dtype.kind == "c" else 1
    weights = [r if decay is None else float(np.sum(decay ** (2 * np.arange(r))))
               for r in [*bonds, 1]]
    return [1 / np.sqrt(re_im * w * phys) for w in weights]


def stack_mpo(sites: int, bond: int, phys: int = 4, *, dtype: Any = "complex128",
              seed: int | None = None) -> TensorTrain:
    """One factor of the src-method stack: every bond ``bond`` (not capped), legs
    ``phys × phys``, entries ``(N(0,1) + i N(0,1)) / sqrt(bond * phys)`` (the real
    part alone for a real dtype), lazily drawn."""
    sites, bond, phys = _positive(sites, "sites", 2), _positive(bond, "bond"), \
        _positive(phys, "phys")
    scale = 1 / np.sqrt(bond * phys)
    return _gaussian_train("mpo", [bond] * (sites - 1), [(phys, phys)] * sites,
                           [scale] * sites, _dtype(dtype), seed)


def stack(sites: int = 50, dm: int = 1000, *, phys: int = 4, bond: int = 4,
          dtype: Any = "complex128", seed: int = 0) -> dict[str, TensorTrain]:
    """The src-method stack ``N·V·M·U`` of docs/design.md §5, as lazy trains.

    Four random MPOs (:func:`stack_mpo`) with bonds ``bond, bond, dm, bond``,
    factor ``i`` drawn with seed ``seed + i``. Returns ``{"N": …, "V": …,
    "M": …, "U": …}`` in product order: ``src_dask.src(*stack(...).values(),
    chi_out=...)`` compresses ``N·V·M·U``. Nothing is drawn until a core is
    computed or saved, so even the stack of ``dm=2000`` (tens of GB: docs/design.md
    §5) costs no memory here.
    """
    seed = _positive(seed, "seed", 0)
    _positive(dm, "dm"), _positive(bond, "bond")
    return {name: stack_mpo(sites, dm if b is None else bond, phys, dtype=dtype, seed=seed + i)
            for i, (name, b) in enumerate(STACK_FACTORS)}


# -- spin-1/2 Hamiltonians ---------------------------------------------------------
_SX = np.array([[0.0, 0.5], [0.5, 0.0]])
_ISY = np.array([[0.0, 0.5], [-0.5, 0.0]])  # i·S^y: real, and (iS^y)⊗(iS^y) = -S^y⊗S^y
_SZ = np.array([[0.5, 0.0], [0.0, -0.5]])
_ID = np.eye(2)


def _nearest_neighbour_mpo(sites: int, couplings: Sequence[tuple[float, np.ndarray]],
                           field: np.ndarray, dtype: Any, name: str) -> TensorTrain:
    """The exact MPO of ``sum_i sum_k c_k A_k(i) A_k(i+1) + sum_i field(i)``.

    Bond states: 0 = nothing placed yet, ``k`` = ``A_k`` placed on the left
    and waiting for its partner, ``m + 1`` = the term is complete. The bulk
    tensor ``W[l, r]`` is lower-triangular in these states; the first site is
    row 0 and the last site column ``m + 1``. Bond ``m + 2``.
    """
    sites = _positive(sites, "sites", 2)
    dt = _dtype(dtype)
    m = len(couplings)
    done = m + 1
    w = np.zeros((m + 2, m + 2, 2, 2))
    w[0, 0] = w[done, done] = _ID
    w[0, done] = field
    for k, (c, op) in enumerate(couplings, start=1):
        w[0, k] = c * op
        w[k, done] = op
    w = w.astype(dt)
    cores = [w[0].copy()] + [w.copy() for _ in range(sites - 2)] + [w[:, done].copy()]
    return TensorTrain(cores, "mpo", name=name)


def heisenberg(sites: int, j: float | tuple[float, float, float] = 1.0, bz: float = 0.0, *,
               dtype: Any = "float64") -> TensorTrain:
    """The spin-1/2 Heisenberg (XXZ / XYZ) chain with open ends, as an exact MPO of bond 5.

    ``H = sum_i (jx Sx_i Sx_{i+1} + jy Sy_i Sy_{i+1} + jz Sz_i Sz_{i+1}) - bz sum_i Sz_i``

    with spin operators (``S = sigma / 2``), exactly as quimb's
    ``MPO_ham_heis(sites, j, bz)``: ``j`` is one number (isotropic) or
    ``(jx, jy, jz)``, e.g. ``(1, 1, delta)`` for XXZ; positive is
    antiferromagnetic. The cores are real (``Sy⊗Sy`` is written as
    ``-(iSy)⊗(iSy)``), so any of the four dtypes works.
    """
    jx, jy, jz = (j, j, j) if np.isscalar(j) else tuple(j)  # type: ignore[misc]
    couplings = [(float(jx), _SX), (-float(jy), _ISY), (float(jz), _SZ)]
    return _nearest_neighbour_mpo(sites, couplings, -float(bz) * _SZ, dtype, "heisenberg")


def ising(sites: int, j: float = 1.0, bx: float = 0.0, *, dtype: Any = "float64") -> TensorTrain:
    """The spin-1/2 transverse-field Ising chain with open ends, as an exact MPO of bond 3.

    ``H = j sum_i Sz_i Sz_{i+1} - bx sum_i Sx_i``

    with spin operators (``S = sigma / 2``), exactly as quimb's
    ``MPO_ham_ising(sites, j, bx)``; positive ``j`` is antiferromagnetic.
    ``bx = 0`` by default, as in quimb; the critical point is ``bx = j / 2``.
    """
    return _nearest_neighbour_mpo(sites, [(float(j), _SZ)], -float(bx) * _SX, dtype, "ising")


# -- problems by spec (the command line's ``generate``) ----------------------------------
#: Per kind: the options that apply and their defaults (``jz`` None: ``j``).
SPEC_DEFAULTS: dict[str, dict[str, Any]] = {
    "mps": {"sites": 50, "bond": 64, "phys": 2, "dtype": "complex128", "seed": 0},
    "mpo": {"sites": 50, "bond": 4, "phys": 2, "dtype": "complex128", "seed": 0},
    "stack": {"sites": 50, "bond": 4, "phys": 4, "dm": 1000, "dtype": "complex128", "seed": 0},
    "heisenberg": {"sites": 50, "dtype": "float64", "j": 1.0, "jz": None, "field": 0.0},
    "ising": {"sites": 50, "dtype": "float64", "j": 1.0, "field": 0.0},
}
SPEC_OPTIONS = ("sites", "bond", "phys", "dm", "dtype", "seed", "j", "jz", "field")


def spec(kind: str, **given: Any) -> dict[str, Any]:
    """A reference problem as a JSON-able spec: ``kind`` (a key of
    :data:`SPEC_DEFAULTS`) and its options, defaults filled in; an option that does not
    apply to the kind, or fewer than 2 sites, is a ValueError (naming the command line's
    option). :func:`build` makes it, :func:`spec_bytes` sizes it without making it,
    :func:`write` saves it; saved trains record it (attribute ``generated``)."""
    if kind not in SPEC_DEFAULTS:
        raise ValueError(f"kind: expected one of {', '.join(SPEC_DEFAULTS)}, got {kind!r}")
    defaults = SPEC_DEFAULTS[kind]
    for name in given:
        if name not in defaults:
            raise ValueError(f"--{name} does not apply to {kind!r}")
    problem = {"kind": kind, **defaults, **given}
    if problem["sites"] < 2:
        raise ValueError(f"--sites: a train needs at least 2 sites, got {problem['sites']}")
    return problem


def spec_bytes(problem: dict[str, Any]) -> int:
    """Bytes of the trains of ``problem`` (:func:`spec`), from their shapes alone."""
    kind, n = problem["kind"], problem["sites"]
    item = np.dtype(problem["dtype"]).itemsize
    if kind in ("heisenberg", "ising"):
        return n * 5 * 5 * 4 * item
    phys = problem["phys"]
    if kind == "stack":
        factors = [[problem["bond"]] * (n - 1)] * 3 + [[problem["dm"]] * (n - 1)]
        legs: tuple[int, ...] = (phys, phys)
    else:
        factors = [_capped_bonds(n, problem["bond"], phys if kind == "mps" else phys * phys)]
        legs = (phys,) if kind == "mps" else (phys, phys)
    return sum(math.prod(_core_shape(j, bonds, legs)) for bonds in factors
               for j in range(n)) * item


def build(problem: dict[str, Any]) -> dict[str, TensorTrain]:
    """The trains of ``problem`` (:func:`spec`): ``{"": train}``, or a stack's factors
    by name."""
    kind, n, dtype = problem["kind"], problem["sites"], problem["dtype"]
    if kind == "mps":
        return {"": random_mps(n, problem["bond"], problem["phys"], dtype=dtype,
                               seed=problem["seed"])}
    if kind == "mpo":
        return {"": random_mpo(n, problem["bond"], problem["phys"], dtype=dtype,
                               seed=problem["seed"])}
    if kind == "stack":
        return stack(n, problem["dm"], phys=problem["phys"], bond=problem["bond"],
                     dtype=dtype, seed=problem["seed"])
    if kind == "heisenberg":
        jz = problem["j"] if problem["jz"] is None else problem["jz"]
        return {"": heisenberg(n, (problem["j"], problem["j"], jz), problem["field"],
                               dtype=dtype)}
    return {"": ising(n, problem["j"], problem["field"], dtype=dtype)}


def write(problem: dict[str, Any], path: str | os.PathLike, *,
          overwrite: bool = False) -> dict[str, TensorTrain]:
    """Save the trains of ``problem`` (:func:`spec`) at ``path``, recording the spec as
    their attribute ``generated``: one train (:func:`src_dask.save`), or a stack's
    factors (:func:`src_dask.save_stack`). What is at ``path`` and the free space are
    checked (:func:`src_dask.storage.check_writable`) before anything is drawn, so an
    absurd size is refused at once; the random cores are then drawn as they are
    written, never all held in memory. Returns the trains (lazy, as :func:`build`)."""
    storage.check_writable(path, overwrite, nbytes=spec_bytes(problem))
    trains = build(problem)
    attrs = {"generated": problem}
    if problem["kind"] == "stack":
        storage.save_stack(trains, path, overwrite=overwrite, attrs=attrs)
    else:
        storage.save(trains[""], path, overwrite=overwrite, attrs=attrs)
    return trains
