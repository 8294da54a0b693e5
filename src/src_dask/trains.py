"""Tensor trains: the container for per-site cores, its checks and its conversions.

The algorithms live apart and the methods delegate to them: the overlaps and the
dense contraction in ``_overlap.py``, the product of trains (checked and put in ket
order, for :func:`src` and :func:`exact_product`) in ``_stack.py``.

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
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from dask.utils import format_bytes

from . import _arraylike
from ._layout import RANKS, role
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
    input whose naming the result keeps (``to_quimb``). A train converted from a quimb
    object gets one too, holding only that object's names: a train keeps its quimb
    names here and nowhere else."""

    seed: int | None = None
    discarded: tuple[float | None, ...] | None = None
    quimb_ids: dict[str, str] | None = None
    #: Bytes of in-memory inputs the call sent to a worker ahead of the run, and the
    #: seconds that took (0 and None where none went ahead: a run in this process, or
    #: inputs that travelled inside the graph); facts of the call, not of the train.
    sent_bytes: int = field(default=0, compare=False)
    sent_s: float | None = field(default=None, compare=False)

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
        :func:`~src_dask.src` has one): read as ``seed`` and ``discarded``; its
        ``quimb_ids`` are the names ``to_quimb`` gives. Made from another train or a
        quimb object, the train takes that one's quimb names instead.
    """

    def __init__(self, cores: Any, kind: Kind | None = None, *, name: str = "train",
                 sources: Sequence[Any] | None = None, run_info: RunInfo | None = None):
        if isinstance(cores, TensorTrain) or _is_quimb(cores):  # anything src accepts
            other = cores if isinstance(cores, TensorTrain) else _from_quimb(cores, name)
            if kind is not None and kind != other.kind:
                raise ValueError(f"{name}: kind {kind!r} given for an {other.kind.upper()}")
            cores, kind = list(other), other.kind
            sources = other._sources if sources is None else sources
            run_info = _named(run_info, other._quimb)
        self.run_info = run_info
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
    def _quimb(self) -> dict[str, str] | None:
        """The index and tag names of a quimb input (or those its run kept), for
        ``to_quimb``: ``run_info.quimb_ids``, their one home."""
        return None if self.run_info is None else self.run_info.quimb_ids

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
        return TensorTrain(cores, self.kind, name=self.name, sources=sources,
                           run_info=self.run_info)

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
        from ._overlap import vdot

        return vdot(self, other)

    def norm(self) -> float:
        """The 2-norm (Frobenius norm for an MPO)."""
        from ._overlap import norm

        return norm(self)

    def expectation(self, mpo: Any) -> complex:
        """``<self|O|self> / <self|self>`` for an MPS and an operator ``mpo`` (anything
        :func:`as_train` accepts), contracted site by site (one site of each in
        memory at a time); its legs are checked before anything is computed."""
        from ._overlap import expectation

        return expectation(self, mpo)

    def to_dense(self) -> np.ndarray:
        """The full vector (MPS) or matrix (MPO, rows = up legs); for small trains only.

        Site 0 is the most significant index, as in quimb's ``to_dense``.
        """
        from ._overlap import dense

        return dense(self)


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
    ids = ("upper_ind_id", "lower_ind_id") if is_mpo else ("site_ind_id",)
    names = {k: v for k in (*ids, "site_tag_id") if isinstance(v := getattr(tn, k, None), str)}
    return TensorTrain(cores, "mpo" if is_mpo else "mps", name=name,
                       run_info=RunInfo(quimb_ids=names))


def _named(info: RunInfo | None, quimb_ids: dict[str, str] | None) -> RunInfo | None:
    """``info`` holding the quimb names ``quimb_ids`` (those of the train or quimb object
    a train is made from, which replace ``info``'s own)."""
    if (None if info is None else info.quimb_ids) == quimb_ids:
        return info
    return replace(info or RunInfo(), quimb_ids=quimb_ids)


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


def exact_product(*trains: Any) -> TensorTrain:
    """The exact product ``trains[0]·trains[1]·…`` as one train, for checks.

    Bonds multiply, so this is only for products small enough to hold; it is
    the reference SRC approximates. Same conventions as :func:`src_dask.src`
    (an MPS first is a bra, an MPS last a ket).
    """
    from ._stack import exact_product

    return exact_product(*trains)
