"""Tensor trains: the container for per-site cores, its conversions, and the
product of trains in ket order (checked, for :func:`src` and :func:`exact_product`).

A train is an MPS or an MPO stored as a list of per-site arrays in quimb's
default layouts (docs/design.md §1)::

    MPS   first (r, p)      middle (l, r, p)      last (l, p)
    MPO   first (r, u, d)   middle (l, r, u, d)   last (l, u, d)

``u`` is the output (row) leg of an MPO and ``d`` its input (column) leg. The
cores may be NumPy, CuPy, Dask or Zarr arrays; a train never copies or modifies
them, so a train opened from disk stays lazy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from dask.utils import format_bytes

from . import _arraylike
from ._layout import RANKS, pad, pad_bonds, role, unpad
from ._transfer import to_host

#: The dtypes a run works in.
SUPPORTED_DTYPES = tuple(np.dtype(t) for t in ("float32", "float64", "complex64", "complex128"))

Kind = Literal["mps", "mpo"]


@dataclass(frozen=True)
class RunInfo:
    """What the run that made a train says about it, given once when the train is made
    (:func:`src_dask.src` makes its result with it): the sketch's ``seed`` (drawn when
    not given, so that the run can be repeated), the weight the rounding discarded
    at each bond (None without rounding), and the index and tag names of the quimb
    input whose naming the result keeps (``to_quimb``)."""

    seed: int | None = None
    discarded: tuple[float | None, ...] | None = None
    quimb_ids: dict[str, str] | None = None

    def __post_init__(self) -> None:
        if self.discarded is not None:  # a list from the graph or the store: kept as is
            object.__setattr__(self, "discarded", tuple(self.discarded))


def _is_array(x: Any) -> bool:
    """An array or a lazy array-like: shape, dtype, ndim, and a way to read it."""
    return (hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "ndim")
            and _arraylike.readable(x))


def _unknown_shape(core: Any) -> bool:
    """Whether some size of ``core`` is unknown: NaN (a Dask array after boolean
    indexing or built from delayed values) or None."""
    return any(s is None or s != s for s in core.shape)


def _unknown_shape_error(core: Any, name: str, site: int) -> ValueError:
    shape = "(" + ", ".join(str(s) for s in core.shape) + ("," if core.ndim == 1 else "") + ")"
    if type(core).__module__.startswith("dask"):
        return ValueError(f"{name}, site {site}: a Dask core of unknown shape {shape}; call "
                          ".compute_chunk_sizes() first")
    return ValueError(f"{name}, site {site}: a core of unknown shape {shape}; every size must "
                      "be known before the train is used")


def _left_bond(core: Any, site: int) -> int:
    return 1 if site == 0 else int(core.shape[0])


def _right_bond(core: Any, site: int, n: int) -> int:
    if site == n - 1:
        return 1
    return int(core.shape[0 if site == 0 else 1])


class TensorTrain(Sequence):
    """An MPS or MPO as a sequence of per-site arrays in quimb's layouts.

    ``len(tt)``, ``tt[j]`` and iteration give the site cores unchanged. The
    constructor checks ranks and bonds, naming the site that is wrong.

    Parameters
    ----------
    cores
        One array per site (at least two sites).
    kind
        ``"mps"`` or ``"mpo"``; inferred from the rank of the first core when
        omitted.
    name
        How error messages refer to this train (for example ``"trains[1]"``).
    run_info
        What the run that made it says (:class:`RunInfo`; a result of
        :func:`~src_dask.src` has one): read as ``seed`` and ``discarded``.
    """

    def __init__(self, cores: Any, kind: Kind | None = None, *, name: str = "train",
                 sources: Sequence[Any] | None = None, run_info: RunInfo | None = None):
        self.run_info = run_info
        # a quimb input's index and tag names (or those its run kept), for to_quimb
        self._quimb: dict[str, str] | None = None if run_info is None else run_info.quimb_ids
        if isinstance(cores, TensorTrain) or _is_quimb(cores):  # anything src accepts
            other = cores if isinstance(cores, TensorTrain) else _from_quimb(cores, name)
            if kind is not None and kind != other.kind:
                raise ValueError(f"{name}: kind {kind!r} given for an {other.kind.upper()}")
            cores, kind, self._quimb = list(other), other.kind, other._quimb
            sources = other._sources if sources is None else sources
        cores = list(cores)
        if len(cores) < 2:
            raise ValueError(f"{name}: a train needs at least 2 sites, got {len(cores)}")
        for j, core in enumerate(cores):
            if not _is_array(core):
                raise TypeError(
                    f"{name}, site {j}: expected an array (or an array-like with shape, "
                    f"dtype, ndim and __getitem__ or __array__), got {type(core).__name__}"
                )
        for j, core in enumerate(cores):  # before any size is used (nothing is computed)
            if _unknown_shape(core):
                raise _unknown_shape_error(core, name, j)
        if kind is None:
            kind = {2: "mps", 3: "mpo"}.get(cores[0].ndim)
            if kind is None:
                raise ValueError(
                    f"{name}, site 0: rank {cores[0].ndim}; a first site has rank 2 "
                    "(MPS (r, p)) or 3 (MPO (r, u, d))"
                )
        if kind not in RANKS:
            raise ValueError(f"{name}: kind must be 'mps' or 'mpo', got {kind!r}")
        n = len(cores)
        ranks = RANKS[kind]
        for j, core in enumerate(cores):
            want = ranks[role(j, n)]
            if core.ndim != want:
                raise ValueError(
                    f"{name}, site {j}: an {kind.upper()} core here has rank {want}, "
                    f"got rank {core.ndim} with shape {tuple(core.shape)}"
                )
            if min(core.shape, default=1) < 1:
                raise ValueError(f"{name}, site {j}: empty core of shape {tuple(core.shape)}")
        for j in range(n - 1):
            right, left = _right_bond(cores[j], j, n), _left_bond(cores[j + 1], j + 1)
            if right != left:
                raise ValueError(
                    f"{name}, site {j}: right bond {right} does not match the left bond {left} "
                    f"of site {j + 1}"
                )
        self._cores = cores
        self._kind: Kind = kind
        self._sources = list(sources) if sources is not None else None
        self.name = name

    # -- sequence protocol ------------------------------------------------
    def __len__(self) -> int:
        return len(self._cores)

    def __getitem__(self, j):  # type: ignore[override]
        return self._cores[j]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cores)

    def __repr__(self) -> str:
        bonds = self.bond_dims
        phys = sorted(set(self.phys_dims))
        legs = (",".join(str(p[0]) if len(p) == 1 else "x".join(map(str, p)) for p in phys)
                if len(phys) <= 3 else f"{len(phys)} kinds")
        return (f"TensorTrain({self.kind}, {len(self)} sites, max bond "
                f"{max(bonds)}, phys {legs}, {self.dtype}, {format_bytes(self.nbytes)}, "
                f"{self.device})")

    def _repr_html_(self) -> str:
        """Jupyter: a table of the train and a bar per bond (its height the bond's
        share of the largest)."""
        import html

        bonds = self.bond_dims
        top, width = max(bonds), max(2, 240 // len(bonds))
        bars = "".join(
            f'<div title="bond {j}: {b}" style="display:inline-block;width:{width}px;'
            f'height:{max(1, round(40 * b / top))}px;background:#4a78b5;margin-right:1px;'
            f'vertical-align:bottom"></div>' for j, b in enumerate(bonds))
        rows = [("kind", self.kind.upper()), ("sites", len(self)),
                ("bonds", f"max {top}, min {min(bonds)}"),
                ("physical legs", ", ".join(sorted({_legs_text(p) for p in self.phys_dims}))),
                ("dtype", self.dtype), ("device", self.device),
                ("bytes", format_bytes(self.nbytes))]
        if self.seed is not None:
            rows.append(("seed", self.seed))
        table = "".join(f"<tr><th style='text-align:left'>{html.escape(str(k))}</th>"
                        f"<td style='text-align:left'>{html.escape(str(v))}</td></tr>"
                        for k, v in rows)
        return (f"<div><b>src_dask.TensorTrain</b><table>{table}</table>"
                f"<div style='height:42px;line-height:0'>{bars}</div></div>")

    def source(self, site: int) -> Any:
        """Where site ``site`` is read from: the Zarr array behind a Dask core
        opened from disk (read directly, once per pass), else the core itself."""
        return self._sources[site] if self._sources is not None else self._cores[site]

    # -- properties -------------------------------------------------------
    @property
    def kind(self) -> Kind:
        """``"mps"`` or ``"mpo"``."""
        return self._kind

    @property
    def dtype(self) -> np.dtype:
        return np.result_type(*[np.dtype(c.dtype) for c in self._cores])

    @property
    def bond_dims(self) -> list[int]:
        """The ``n - 1`` bond dimensions between neighbouring sites."""
        n = len(self)
        return [_right_bond(c, j, n) for j, c in enumerate(self._cores[:-1])]

    @property
    def phys_dims(self) -> list[tuple[int, ...]]:
        """Per site ``(p,)`` for an MPS, ``(u, d)`` for an MPO."""
        k = 1 if self.kind == "mps" else 2
        return [tuple(int(s) for s in c.shape[-k:]) for c in self._cores]

    @property
    def nbytes(self) -> int:
        return sum(int(np.prod(c.shape)) * np.dtype(c.dtype).itemsize for c in self._cores)

    @property
    def max_bond(self) -> int:
        """The largest bond dimension."""
        return max(self.bond_dims)

    @property
    def device(self) -> str:
        """Where the cores are: ``"gpu"`` (CuPy), ``"cpu"`` (NumPy), ``"lazy"`` (Dask,
        Zarr or another array-like, read when used), or ``"mixed"``."""
        kinds = {"gpu" if type(c).__module__.startswith("cupy") else
                 "cpu" if isinstance(c, np.ndarray) and not isinstance(c, np.memmap) else
                 "lazy" for c in self._cores}
        return kinds.pop() if len(kinds) == 1 else "mixed"

    # -- arithmetic (a new train each time; the cores are never modified) ---
    def copy(self) -> TensorTrain:
        """A train with copies of the in-memory cores (lazy cores stay lazy and
        shared: they are never written to)."""
        cores = [c.copy() if _in_memory(c) else c for c in self._cores]
        return self._like(cores, sources=self._sources)

    def __mul__(self, a: Any) -> TensorTrain:
        """The train times a scalar ``a`` (site 0 scaled)."""
        if not _is_scalar(a):
            return NotImplemented
        return self._like([_scaled(self._cores[0], a), *self._cores[1:]])

    __rmul__ = __mul__

    def __truediv__(self, a: Any) -> TensorTrain:
        if not _is_scalar(a):
            return NotImplemented
        if a == 0:
            raise ZeroDivisionError("a train divided by zero")
        return self * (1 / a)

    def __neg__(self) -> TensorTrain:
        return self * -1

    def normalize(self) -> TensorTrain:
        """A new train with norm 1 (Frobenius norm for an MPO)."""
        norm = self.norm()
        if norm == 0:
            raise ZeroDivisionError(f"{self.name}: a train of norm 0 cannot be normalized")
        return self / norm

    @property
    def seed(self) -> int | None:
        """The sketch's seed, for a result of :func:`~src_dask.src` (else None)."""
        return None if self.run_info is None else self.run_info.seed

    @property
    def discarded(self) -> list[float | None] | None:
        """For a result of :func:`~src_dask.src` with rounding: the weight discarded at
        each bond (else None)."""
        info = self.run_info
        return None if info is None or info.discarded is None else list(info.discarded)

    def _like(self, cores: list[Any], sources: Sequence[Any] | None = None) -> TensorTrain:
        out = TensorTrain(cores, self.kind, name=self.name, sources=sources,
                          run_info=self.run_info)
        out._quimb = self._quimb
        return out

    # -- conversions ------------------------------------------------------
    def to_numpy(self) -> list[np.ndarray]:
        """The cores as NumPy arrays (computing Dask and reading Zarr cores)."""
        return [_to_numpy(c) for c in self._cores]

    def to_quimb(self):
        """The train as a quimb ``MatrixProductState`` or ``MatrixProductOperator``."""
        import quimb.tensor as qtn

        arrays = self.to_numpy()
        ids = dict(self._quimb or {})  # the index and tag names of quimb inputs
        if self.kind == "mps":
            ids.pop("upper_ind_id", None), ids.pop("lower_ind_id", None)
            return qtn.MatrixProductState(arrays, shape="lrp", **ids)
        ids.pop("site_ind_id", None)
        return qtn.MatrixProductOperator(arrays, shape="lrud", **ids)

    def vdot(self, other: Any) -> complex:
        """``<self|other>`` (self conjugated) of two MPS, or the Frobenius product of two MPOs.

        ``other`` is anything :func:`as_train` accepts (a TensorTrain, a quimb
        MPS/MPO, a sequence of per-site arrays). The two trains must have the same
        kind, length and physical legs at every site (their bonds may differ);
        this is checked from the shapes, before anything is computed.
        """
        other = as_train(other, name="vdot: other")
        if other.kind != self.kind:
            raise ValueError(f"vdot: this train ({self.name}) is an {self.kind.upper()} but the "
                             f"other is an {other.kind.upper()}; both must be MPS or both MPO")
        if len(other) != len(self):
            raise ValueError(f"vdot: this train ({self.name}) has {len(self)} sites but the "
                             f"other has {len(other)}; they need the same number of sites")
        legs = "physical leg (p)" if self.kind == "mps" else "physical legs (u, d)"
        for j, (mine, theirs) in enumerate(zip(self.phys_dims, other.phys_dims, strict=True)):
            if mine != theirs:
                raise ValueError(
                    f"vdot: site {j}: {legs} {_legs_text(mine)} in this train ({self.name}) but "
                    f"{_legs_text(theirs)} in the other; both trains need the same physical "
                    "legs at every site")
        n = len(self)
        env = np.ones((1, 1))
        for j in range(n):  # streamed: one site of each train in memory at a time
            a, b = _to_numpy(self._cores[j]), _to_numpy(other[j])
            shapes = a.shape, b.shape
            try:
                a, b = pad_bonds(a, j, n), pad_bonds(b, j, n)
                a, b = (a.reshape(a.shape[0], a.shape[1], -1),
                        b.reshape(b.shape[0], b.shape[1], -1))
                env = np.einsum("lL,lrp,LRp->rR", env, a.conj(), b, optimize=True)
            except ValueError as err:  # computed cores unlike their declared shapes
                raise ValueError(
                    f"vdot: site {j}: cannot contract this train's core of shape {shapes[0]} "
                    f"with the other's of shape {shapes[1]} (left bonds {env.shape[0]} and "
                    f"{env.shape[1]}): {err}") from err
        return complex(env[0, 0])

    def norm(self) -> float:
        """The 2-norm (Frobenius norm for an MPO)."""
        return float(np.sqrt(abs(self.vdot(self))))

    def expectation(self, mpo: Any) -> complex:
        """``<self|O|self> / <self|self>`` for an MPS and an operator ``mpo`` (anything
        :func:`as_train` accepts), contracted site by site (one site of each in
        memory at a time); its legs are checked before anything is computed."""
        op = as_train(mpo, name="expectation: mpo")
        if self.kind != "mps" or op.kind != "mpo":
            raise ValueError(f"expectation: needs an MPS and an MPO, got an "
                             f"{self.kind.upper()} and an {op.kind.upper()}")
        if len(op) != len(self):
            raise ValueError(f"expectation: the MPS has {len(self)} sites but the MPO has "
                             f"{len(op)}")
        for j, ((p,), (u, d)) in enumerate(zip(self.phys_dims, op.phys_dims, strict=True)):
            if (u, d) != (p, p):
                raise ValueError(f"expectation: site {j}: the MPO's legs (u, d) = {(u, d)} "
                                 f"do not act on the MPS's physical leg {p}")
        n = len(self)
        env = np.ones((1, 1, 1))
        for j in range(n):
            a = pad_bonds(_to_numpy(self._cores[j]), j, n)  # (l, r, p)
            o = pad_bonds(_to_numpy(op[j]), j, n)  # (l, r, u, d)
            env = np.einsum("xwy,xap,wbpq,ycq->abc", env, a.conj(), o, a, optimize=True)
        norm2 = self.vdot(self)
        if norm2 == 0:
            raise ZeroDivisionError(f"{self.name}: a train of norm 0 has no expectation values")
        return complex(env[0, 0, 0] / norm2)

    def to_dense(self) -> np.ndarray:
        """The full vector (MPS) or matrix (MPO, rows = up legs); for small trains only.

        Site 0 is the most significant index, as in quimb's ``to_dense``.
        """
        n = len(self)
        if self.kind == "mps":
            acc = np.ones((1, 1))
            for j, a in enumerate(self.to_numpy()):
                a = pad_bonds(a, j, n)  # (l, r, p)
                acc = np.einsum("lP,lrp->rPp", acc, a).reshape(a.shape[1], -1)
            return acc[0]
        acc = np.ones((1, 1, 1))
        for j, a in enumerate(self.to_numpy()):
            a = pad_bonds(a, j, n)  # (l, r, u, d)
            acc = np.einsum("lUD,lrud->rUuDd", acc, a)
            acc = acc.reshape(a.shape[1], acc.shape[1] * a.shape[2], -1)
        return acc[0]


def _is_quimb(x: Any) -> bool:
    return type(x).__module__.startswith("quimb") and hasattr(x, "L")


def _in_memory(x: Any) -> bool:
    return (isinstance(x, np.ndarray) and not isinstance(x, np.memmap)) or \
        type(x).__module__.startswith("cupy")


def _is_scalar(a: Any) -> bool:
    import numbers

    return isinstance(a, numbers.Number) and not isinstance(a, bool) or \
        (isinstance(a, np.ndarray | np.generic) and np.ndim(a) == 0 and
         np.dtype(a.dtype).kind in "iufc")


def _scaled(core: Any, a: Any) -> Any:
    """``a * core``: lazily for a Dask core, in memory otherwise (other lazy cores read)."""
    if not (_in_memory(core) or hasattr(core, "dask")):
        core = _to_numpy(core)
    out = core * a
    if np.dtype(out.dtype).kind in "iub":  # an integer core scaled stays floating
        out = out.astype(np.float64)
    return out


def _legs_text(dims: tuple[int, ...]) -> str:
    """Physical legs for a message: ``2`` for an MPS, ``(2, 3)`` for an MPO."""
    return str(dims[0]) if len(dims) == 1 else str(dims)


def _to_numpy(x: Any) -> np.ndarray:
    """``x`` as a NumPy array: a Dask array computed, a CuPy array copied to the host,
    an array-like read."""
    if hasattr(x, "compute") and not isinstance(x, np.ndarray):
        x = x.compute()
    if not (isinstance(x, np.ndarray) or type(x).__module__.startswith("cupy")):
        x = _arraylike.source(x)[...]
    return np.array(to_host(x)) if isinstance(x, np.memmap) else to_host(x)


def _from_quimb(tn: Any, name: str) -> TensorTrain:
    """Cores of a quimb MPS or MPO, transposed into this package's layouts."""
    cls = type(tn).__name__
    if getattr(tn, "cyclic", False):
        raise ValueError(f"{name}: cyclic (periodic) {cls} is not supported")
    n = tn.L
    if n < 2:
        raise ValueError(f"{name}: a train needs at least 2 sites, got {n}")
    is_mpo = hasattr(tn, "upper_ind") and hasattr(tn, "lower_ind")
    tensors = [tn[j] for j in range(n)]  # a lookup by tag each: found once per site
    bonds = []
    for j in range(n - 1):
        shared = _shared(tensors[j], tensors[j + 1])
        bonds.append(tn.bond(j, j + 1) if shared is None else shared)
    cores = []
    for j, t in enumerate(tensors):
        legs = ([bonds[j - 1]] if j > 0 else []) + ([bonds[j]] if j < n - 1 else [])
        phys = [tn.upper_ind(j), tn.lower_ind(j)] if is_mpo else [tn.site_ind(j)]
        cores.append(t.transpose(*legs, *phys).data)
    out = TensorTrain(cores, "mpo" if is_mpo else "mps", name=name)
    ids = ("upper_ind_id", "lower_ind_id") if is_mpo else ("site_ind_id",)
    out._quimb = {k: v for k in (*ids, "site_tag_id")
                  if isinstance(v := getattr(tn, k, None), str)}
    return out


def _shared(a: Any, b: Any) -> str | None:
    """The one index two neighbouring quimb tensors share (None: not exactly one,
    which ``tn.bond`` then reports in quimb's words)."""
    common = set(a.inds).intersection(b.inds)
    return common.pop() if len(common) == 1 else None


def as_train(x: Any, *, name: str = "train") -> TensorTrain:
    """Whatever a user passes as a train, as a :class:`TensorTrain`.

    Accepts a TensorTrain, a quimb ``MatrixProductState`` or
    ``MatrixProductOperator``, or a sequence of per-site arrays (NumPy, CuPy,
    Dask or Zarr).
    """
    if isinstance(x, TensorTrain):
        return x
    module = type(x).__module__
    if module.startswith("quimb") and hasattr(x, "L"):
        return _from_quimb(x, name)
    if _is_array(x) or isinstance(x, (str, bytes, dict)) or not isinstance(x, Sequence):
        raise TypeError(
            f"{name}: expected a train (a sequence of per-site arrays, a quimb MPS/MPO or a "
            f"TensorTrain), got {type(x).__name__}"
        )
    return TensorTrain(x, name=name)


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
