"""Overlaps of trains: those of two trains (:func:`vdot`, :func:`norm`,
:func:`expectation`) and the dense contraction of a small one (:func:`dense`), in
NumPy on the client, one site of each train in memory at a time (the algorithms
behind the :class:`~src_dask.trains.TensorTrain` methods of those names); and how
far a result is from the exact product (:func:`distance`): overlaps of stacks of
trains, streamed site by site as a Dask graph (the dense product is never formed).

``‖y − P‖² = ⟨y|y⟩ − 2 Re⟨y|P⟩ + ⟨P|P⟩`` for ``P = T_1·…·T_k``: three chains of
environments, one task per site each, in one graph on the client (or Dask's
local scheduler), on the device a run of ``src`` on the same inputs would use (the
GPU for CuPy inputs, or where every worker has one; config ``src_dask.device``). The
environment of ``⟨P|P⟩`` carries every bond of the stack twice, so it is for
products whose squared bonds fit a worker: the check of a result, not a
production step.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import dask
import numpy as np

from . import _integrity
from . import _kernels as K
from ._cluster import choose_device
from ._layout import pad, pad_bonds
from ._stack import Stack, in_graph, make_stack
from ._transfer import to_host
from .trains import TensorTrain, _legs_text, _to_numpy, as_train


def vdot(a: TensorTrain, b: Any) -> complex:
    """``<a|b>`` (``a`` conjugated) of two MPS, or the Frobenius product of two MPOs
    (:meth:`TensorTrain.vdot <src_dask.trains.TensorTrain.vdot>`; ``b`` is anything
    :func:`~src_dask.trains.as_train` accepts). Kinds, lengths and physical legs are
    checked from the shapes before anything is computed; then contracted site by site,
    one site of each train in memory at a time."""
    other = as_train(b, name="vdot: other")
    if other.kind != a.kind:
        raise ValueError(f"vdot: this train ({a.name}) is an {a.kind.upper()} but the "
                         f"other is an {other.kind.upper()}; both must be MPS or both MPO")
    if len(other) != len(a):
        raise ValueError(f"vdot: this train ({a.name}) has {len(a)} sites but the "
                         f"other has {len(other)}; they need the same number of sites")
    legs = "physical leg (p)" if a.kind == "mps" else "physical legs (u, d)"
    for j, (mine, theirs) in enumerate(zip(a.phys_dims, other.phys_dims, strict=True)):
        if mine != theirs:
            raise ValueError(
                f"vdot: site {j}: {legs} {_legs_text(mine)} in this train ({a.name}) but "
                f"{_legs_text(theirs)} in the other; both trains need the same physical "
                "legs at every site")
    n = len(a)
    env = np.ones((1, 1))
    for j in range(n):  # streamed: one site of each train in memory at a time
        x, y = _to_numpy(a[j]), _to_numpy(other[j])
        shapes = x.shape, y.shape
        try:
            x, y = pad_bonds(x, j, n), pad_bonds(y, j, n)
            x, y = (x.reshape(x.shape[0], x.shape[1], -1),
                    y.reshape(y.shape[0], y.shape[1], -1))
            env = np.einsum("lL,lrp,LRp->rR", env, x.conj(), y, optimize=True)
        except ValueError as err:  # computed cores unlike their declared shapes
            raise ValueError(
                f"vdot: site {j}: cannot contract this train's core of shape {shapes[0]} "
                f"with the other's of shape {shapes[1]} (left bonds {env.shape[0]} and "
                f"{env.shape[1]}): {err}") from err
    return complex(env[0, 0])


def norm(train: TensorTrain) -> float:
    """The 2-norm of ``train`` (Frobenius norm for an MPO), from :func:`vdot`."""
    return float(np.sqrt(abs(vdot(train, train))))


def expectation(mps: TensorTrain, mpo: Any) -> complex:
    """``<mps|O|mps> / <mps|mps>`` for an operator ``mpo`` (anything
    :func:`~src_dask.trains.as_train` accepts), contracted site by site (one site of
    each in memory at a time); the legs are checked before anything is computed."""
    op = as_train(mpo, name="expectation: mpo")
    if mps.kind != "mps" or op.kind != "mpo":
        raise ValueError(f"expectation: needs an MPS and an MPO, got an "
                         f"{mps.kind.upper()} and an {op.kind.upper()}")
    if len(op) != len(mps):
        raise ValueError(f"expectation: the MPS has {len(mps)} sites but the MPO has "
                         f"{len(op)}")
    for j, ((p,), (u, d)) in enumerate(zip(mps.phys_dims, op.phys_dims, strict=True)):
        if (u, d) != (p, p):
            raise ValueError(f"expectation: site {j}: the MPO's legs (u, d) = {(u, d)} "
                             f"do not act on the MPS's physical leg {p}")
    n = len(mps)
    env = np.ones((1, 1, 1))
    for j in range(n):
        a = pad_bonds(_to_numpy(mps[j]), j, n)  # (l, r, p)
        o = pad_bonds(_to_numpy(op[j]), j, n)  # (l, r, u, d)
        env = np.einsum("xwy,xap,wbpq,ycq->abc", env, a.conj(), o, a, optimize=True)
    norm2 = vdot(mps, mps)
    if norm2 == 0:
        raise ZeroDivisionError(f"{mps.name}: a train of norm 0 has no expectation values")
    return complex(env[0, 0, 0] / norm2)


def dense(train: TensorTrain) -> np.ndarray:
    """The full vector (MPS) or matrix (MPO, rows = up legs) of a small ``train``;
    site 0 is the most significant index, as in quimb's ``to_dense``."""
    n = len(train)
    if train.kind == "mps":
        acc = np.ones((1, 1))
        for j, a in enumerate(train.to_numpy()):
            a = pad_bonds(a, j, n)  # (l, r, p)
            acc = np.einsum("lP,lrp->rPp", acc, a).reshape(a.shape[1], -1)
        return acc[0]
    acc = np.ones((1, 1, 1))
    for j, a in enumerate(train.to_numpy()):
        a = pad_bonds(a, j, n)  # (l, r, u, d)
        acc = np.einsum("lUD,lrud->rUuDd", acc, a)
        acc = acc.reshape(a.shape[1], acc.shape[1] * a.shape[2], -1)
    return acc[0]


def distance(y: Any, *trains: Any, client: Any = None, progress: Any = False) -> float:
    """The exact relative error ``‖y − T₁·…·T_k‖ / ‖T₁·…·T_k‖`` of a result ``y``.

    ``trains`` are the factors as given to :func:`src_dask.src` (a bra stack too);
    ``y`` and the trains may be anything ``src`` accepts (NumPy, CuPy, Dask or
    Zarr cores, quimb objects, TensorTrains, a run store's result). Computed by
    streamed overlaps, one task per site and overlap, on ``client`` (default:
    the current client, else Dask's local scheduler), with a progress bar if
    ``progress``. Being a difference of overlaps it resolves relative errors
    down to about ``1e-7`` (the square root of the double-precision epsilon).

    ``⟨P|P⟩``, whose environments carry every bond of the product twice, is the
    dearest of the three overlaps: it is computed once per product and reused by
    later calls with the same factors (NumPy cores by content, trains opened with
    :func:`src_dask.open` by their save; other lazy cores are not remembered).
    """
    from ._api import _client
    from ._progress import check_progress

    client = _client(client)
    progress = check_progress(progress)
    product = make_stack(trains)
    result = make_stack((y,))
    if result.n != product.n:
        raise ValueError(f"distance: y has {result.n} sites but the product has {product.n}")
    for j in range(product.n):
        mine = result.shapes(j)[0][2:]
        theirs = (product.up(j), product.down(j))
        if mine != theirs:
            raise ValueError(f"distance: site {j}: y's physical legs (up, down) {mine} are not "
                             f"the product's {theirs}")
    device = choose_device(client, [c for s in (result, product) for f in s.factors
                                    for c in f.train])
    key = _product_key(product)
    pairs = [(result, result), (result, product)]
    if key is None or key not in _NORMS:  # ⟨P|P⟩, the dearest of the three, once
        pairs.append((product, product))
    chains = [_chain(a, b, device) for a, b in pairs]
    with in_graph(result, product, copies=3):  # each core in up to three overlap steps
        yy, yp, *computed = _compute(chains, client, progress)
    if computed and key is not None:
        _remember(key, computed[0])
    pp = computed[0] if computed else _NORMS[key]  # type: ignore[index]
    if pp == 0:
        raise ZeroDivisionError("distance: the product is zero")
    err2 = max(0.0, yy.real - 2 * yp.real + pp.real)
    return math.sqrt(err2 / pp.real)


#: ``⟨P|P⟩`` of the products :func:`distance` has seen, by the content of their factors
#: (Dask's tokens: a NumPy core's bytes, a Dask or stored core's name, which a save over
#: it changes): comparing several results to one product pays for it once.
_NORMS: dict[str, complex] = {}
_NORMS_KEPT = 32


def _product_key(product: Stack) -> str | None:
    """The key of ``⟨P|P⟩`` in :data:`_NORMS`, or None where the factors' content
    cannot be told cheaply and surely: only NumPy cores (hashed) and trains src_dask
    opened from disk (named by their save, which a save over them changes) qualify;
    a Zarr or HDF5 array given directly may change in place under the same name."""
    for f in product.factors:
        for j, core in enumerate(f.train):
            if not (isinstance(core, np.ndarray)
                    or isinstance(f.train.source(j), _integrity.VerifiedArray)):
                return None
    return dask.base.tokenize([(f.train.kind, f.transpose, list(f.train))
                               for f in product.factors])


def _remember(key: str, value: complex) -> None:
    _NORMS[key] = value
    while len(_NORMS) > _NORMS_KEPT:  # the oldest first
        del _NORMS[next(iter(_NORMS))]


def _compute(chains: list[Any], client: Any, progress: Any) -> list[complex]:
    """The overlaps of ``chains``, with a progress report on ``progress`` (True: stderr):
    Dask's bar by task on the local scheduler, a line per overlap on a cluster."""
    import sys

    stream = sys.stderr if progress is True else progress or None
    if client is None:
        if stream is None:
            return list(dask.compute(*chains))
        from dask.diagnostics import ProgressBar

        with ProgressBar(out=stream):
            return list(dask.compute(*chains))
    from distributed import as_completed

    futures = client.compute(chains)
    where = {f.key: i for i, f in enumerate(futures)}
    out: list[Any] = [None] * len(futures)
    names = ("<y|y>", "<y|P>", "<P|P>")
    for done, (future, value) in enumerate(as_completed(futures, with_results=True), 1):
        out[where[future.key]] = value
        if stream is not None:
            stream.write(f"src_dask.distance: {names[where[future.key]]} done "
                         f"({done} of {len(futures)} overlaps)\n")
            stream.flush()
    return out


def _chain(bra: Stack, ket: Stack, device: str = "cpu") -> Any:
    """``⟨bra|ket⟩`` as a Delayed: one task per site carrying the environment, on
    ``device``."""
    n, token = bra.n, uuid.uuid4().hex
    env = None
    for j in range(n):
        cores = [f.train[j] for f in bra.factors] + [f.train[j] for f in ket.factors]
        env = dask.delayed(_step, pure=True)(
            env, cores, kinds=[f.train.kind for f in (*bra.factors, *ket.factors)],
            transposes=[f.transpose for f in (*bra.factors, *ket.factors)],
            k=len(bra.factors), site=j, n=n, device=device,
            dask_key_name=(f"overlap_site{j}-{token}"))
    return dask.delayed(_scalar)(env, dask_key_name=f"overlap-{token}")


def _scalar(env: Any) -> complex:
    return complex(to_host(env).reshape(-1)[0])


def _step(env: Any, cores: list[Any], *, kinds: list[str], transposes: list[bool], k: int,
          site: int, n: int, device: str = "cpu") -> Any:
    """The environment right of ``site``: ``E'[b'.., b..] = Σ E[a'.., a..] ·
    conj(Π bra cores) · Π ket cores`` (each side a stack in ket order), in NumPy or
    (``device="gpu"``) CuPy arrays."""
    here = [K.on_device(_read(c), "gpu") if device == "gpu" else to_host(_read(c))
            for c in cores]
    xp = K.xp_of(here[0])
    padded = [pad(c, kind, site, n, tr).astype(xp.complex128)
              for c, kind, tr in zip(here, kinds, transposes, strict=True)]
    bra, ket = [c.conj() for c in padded[:k]], padded[k:]
    m = len(ket)
    if env is None:
        env = xp.ones((1,) * (k + m), dtype=xp.complex128)
    eq = _equation(k, m)
    return K.contract(eq, env, *bra, *ket)


def _read(core: Any) -> Any:
    if hasattr(core, "compute") and not isinstance(core, np.ndarray):
        return core.compute()
    if K.is_in_memory(core) or isinstance(core, np.memmap):
        return core
    from ._arraylike import source

    return source(core)[...]


def _equation(k: int, m: int) -> str:
    """The einsum of one overlap step for a bra stack of ``k`` and a ket stack of ``m``
    cores: both share the outer legs (up of the first, down of the last)."""
    from opt_einsum import get_symbol

    sym = (get_symbol(i) for i in range(4 * (k + m) + 4))
    a = [next(sym) for _ in range(k + m)]
    b = [next(sym) for _ in range(k + m)]
    up, down = next(sym), next(sym)
    xb = [up] + [next(sym) for _ in range(k - 1)] + [down]
    xk = [up] + [next(sym) for _ in range(m - 1)] + [down]
    terms = ["".join(a)]
    terms += [a[i] + b[i] + xb[i] + xb[i + 1] for i in range(k)]
    terms += [a[k + i] + b[k + i] + xk[i] + xk[i + 1] for i in range(m)]
    return ",".join(terms) + "->" + "".join(b)
