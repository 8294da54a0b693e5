"""The functions the sweep graph's tasks run (one per kind of task).

They are small wrappers around the kernels that add what a task needs and a
kernel should not know: reading stored cores, the run store, out-of-memory
halving, and naming the site in errors.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np

from .. import _integrity, _oom, _random, _shared, _transfer
from .. import _kernels as K
from .._runstore import RunStore


def on_own_stream(func: Callable[..., Any], *args: Any) -> Any:
    """``func(*args)`` with its GPU kernels on this thread's own non-blocking stream,
    waited for before the task ends (``SweepPlan.own_streams``)."""
    stream = _transfer.task_stream()
    with stream:
        out = func(*args)
    _transfer.wait_for(stream)
    return out


class _Heap:
    """The worker process's malloc settings while its tasks run (:func:`with_heap`)."""

    lock = threading.Lock()
    running = 0  # tasks of this process inside with_heap
    libc: Any = None


#: glibc's ``mallopt`` parameters, and the mmap threshold its dynamic rule reaches (64 bits)
_M_MMAP_THRESHOLD, _MMAP_MAX = -3, 32 << 20
_MMAP_DEFAULT = 128 << 10


def _env_bytes(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def with_heap(func: Callable[..., Any], *args: Any) -> Any:
    """``func(*args)`` with glibc's malloc serving blocks of up to 32 MiB from its heap,
    as it does by default (``SweepPlan.own_heap``: CPU tasks on a cluster).

    Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``
    (``distributed.nanny.pre-spawn-environ``), which also fixes glibc's mmap threshold
    at 128 KiB: every temporary of a contraction is then a fresh mmap whose pages
    fault in on first touch (docs/design.md §3.3, "CPU tasks keep glibc's heap", has
    the cost).
    The mmap threshold is raised while any task of the process runs, so freed
    temporaries are reused; the trim threshold stays the worker's, so the heap's free
    top goes back to the system as it grows. When no task runs, the worker's mmap
    threshold is put back and ``malloc_trim(0)`` returns the free pages inside the
    heap too. What the heap keeps is the worker's unmanaged memory, which Dask cannot
    spill: raising the trim threshold as well (glibc's dynamic default, 64 MiB) kept
    up to that much a thread's arena (a small worker paused at its threshold for
    good) and was no faster. A process started without the setting (or without
    glibc) is left as it is."""
    if _env_bytes("MALLOC_TRIM_THRESHOLD_") is None or not _heap_enter():
        return func(*args)
    try:
        return func(*args)
    finally:
        _heap_leave()


def _heap_enter() -> bool:
    with _Heap.lock:
        if _Heap.libc is None:
            try:
                _Heap.libc = ctypes.CDLL("libc.so.6")
                _Heap.libc.mallopt, _Heap.libc.malloc_trim  # noqa: B018 - glibc's?
            except (OSError, AttributeError):
                _Heap.libc = False
        if not _Heap.libc:
            return False
        if _Heap.running == 0:
            _Heap.libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_MAX)
        _Heap.running += 1
        return True


def _heap_leave() -> None:
    with _Heap.lock:
        _Heap.running -= 1
        if _Heap.running == 0:
            mmap = _env_bytes("MALLOC_MMAP_THRESHOLD_")
            _Heap.libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_DEFAULT if mmap is None else mmap)
            _Heap.libc.malloc_trim(0)


def with_threads(threads: int, func: Callable[..., Any], *args: Any) -> Any:
    """``func(*args)`` with the process's BLAS and OpenMP pools at ``threads`` threads
    (threadpoolctl), put back after: a whole run as one task on a worker of a cluster
    (``_api._run_in_one_task``) uses the cores of its host's workers, idle meanwhile,
    where Dask's nanny starts each worker with one (``OMP_NUM_THREADS=1`` and the
    like). Without threadpoolctl, as the worker is."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return func(*args)
    with threadpool_limits(limits=threads):
        return func(*args)


def is_stored(x: Any) -> bool:
    """An array read whole by a task of its own: Zarr, a verified one
    (:class:`_integrity.VerifiedArray`, the sources of a train opened from disk) or
    any other lazy array-like (``_arraylike``); not a Dask array, not one in memory."""
    return not (isinstance(x, da.Array) or K.is_in_memory(x))


def read_shared(d: _shared.Shared, after: Any = None) -> Any:
    """An in-memory input the client put in this host's shared memory, mapped (read
    once ``after`` has run: see ``GraphBuilder.array``)."""
    return _shared.read(d)


def read_whole(x: Any, after: Any = None, pinned: bool = False) -> Any:
    """A whole Zarr array, in host memory (a GPU run moves it in ``prepare_core``
    through pinned memory on a copy stream: faster than zarr's GPU buffers,
    which copy pageable memory on the kernels' stream). ``after``: see ``GraphBuilder.array``.

    ``pinned`` (GPU runs): read straight into page-locked memory. Zarr copies every
    chunk into the output on its one event-loop thread, so a fresh output, whose
    pages are touched for the first time there, capped the reads of all the
    worker's threads together well below the disk's rate (docs/design.md §6.1 and
    §7, "Reads"); a pooled pinned buffer also spares the copy into pinned memory
    before the transfer.

    A :class:`_integrity.VerifiedArray` is read through its checks (missing or
    damaged chunks, NaN/inf, a train saved over: ``DamagedDataError``/``StoreError``).
    """
    if isinstance(x, _integrity.VerifiedArray):
        return x.read(out=_transfer.empty_pinned(x.shape, x.dtype)) if pinned else x.read()
    if not type(x).__module__.startswith("zarr"):  # an array-like (``_arraylike.source``)
        return np.asarray(x[...])
    if not pinned:
        return x[...]
    from zarr.core.buffer.cpu import NDBuffer

    out = _transfer.empty_pinned(x.shape, x.dtype)
    x.get_basic_selection(Ellipsis, out=NDBuffer.from_numpy_array(out))
    return out


def prepare(raw: Any, after: Any = None, **options: Any) -> Any:
    """:func:`_kernels.prepare_core`; ``after``: see ``GraphBuilder.array``. On a GPU
    the copy to the device waits for memory where the pool is full for a moment
    (:func:`_oom.waiting`)."""
    if options.get("device") != "gpu":
        return K.prepare_core(raw, **options)
    import cupy

    return _oom.waiting(lambda: K.prepare_core(raw, **options), xp=cupy, nbytes=K.nbytes(raw),
                        site=options["site"], what=f"{options['name']}'s core to the device")


def lazy(core: Any) -> Any:
    """Dask arrays stay; Zarr arrays are wrapped without reading; a verified array
    keeps its checks (``_integrity.to_dask``)."""
    if isinstance(core, da.Array) or K.is_in_memory(core):
        return core
    if isinstance(core, _integrity.VerifiedArray):
        return _integrity.to_dask(core)
    return da.from_array(core, chunks=core.chunks, asarray=False)


def pass1_block(env: Any, cores: list[Any], after: Any = None, *, site: int, start: int,
                stop: int, run: str, store: RunStore | None, block: int, last: bool,
                seed_key: int, legs: tuple[int, int]) -> Any:
    """One step of a block's pass-1 chain (once ``after``, a barrier, has run), in
    halves if it does not fit in memory.

    With a run store ``C_{j+1}`` also goes to disk (pass 2 reads it there) and
    the last site marks the block done.
    """
    omega = _random.sketch_block(seed_key, site, start, stop, legs, cores[0].dtype)

    def compute(a: int, b: int) -> Any:
        part = None if env is None else env[a:b]
        return K.sketch_step(part, cores, omega=omega[a:b], site=site)

    out = _oom.halving(compute, stop - start, xp=K.xp_of(cores[0]), run=run, step="pass 1",
                       site=site, bytes_per_row=K.sketch_step_bytes(cores))
    if store is None:
        return out
    store.write_env(site + 1, start, out)
    if last:
        store.mark_block_done(block)
        return None
    return out


def sketch_piece(env: Any, z: Any, *, site: int, start: int, stop: int, run: str,
                 store: RunStore | None) -> Any:
    """A block of pass 2's sketch, in halves if it does not fit in memory."""
    if z is None:
        return None
    xp = K.xp_of(z)
    if store is not None:
        env = xp.asarray(store.read_env(site, start, stop))
    elif K.xp_of(env) is not xp:  # in host memory (``Plan.host_envs``), not fetched ahead
        env = _transfer.to_device(env)
    return _oom.halving(lambda a, b: K.sketch_piece(env[a:b], z), stop - start, xp=xp,
                        run=run, step="sketch", site=site,
                        bytes_per_row=K.sketch_piece_bytes(env, z))


def project(cores: list[Any], env: Any | None, *, rows: tuple[int, ...] | None, site: int,
            run: str) -> Any:
    """:func:`_kernels.project_core` (row block ``rows`` of ``S_j``, or all of it), in
    pieces of rows if it does not fit in memory; None for an empty block. Cut into
    pieces, it reads its cores laid out for the rows (:class:`_LaidOut`)."""
    if env is not None and rows is not None:
        env = env[slice(*K.block_rows(env.shape[0], *rows))]
    if env is not None and env.shape[0] == 0:
        return None
    n = 1 if env is None else env.shape[0]  # S = 1: one row
    laid = _LaidOut(cores, env)

    def rows_of(a: int, b: int) -> Any:
        if env is None or b - a == n:
            return K.project_core(cores, env)
        return K.project_core(laid.cores(), env[a:b])

    try:
        return _oom.halving(rows_of, n, xp=K.xp_of(env), run=run, step="projection",
                            site=site, bytes_per_row=K.project_row_bytes(cores),
                            axis=len(cores))
    finally:
        laid.release()


class _LaidOut:
    """A projection's cores laid out for its rows (``_kernels.laid_out_for_rows``), made
    when its first piece asks and shared with the worker's other projections of the
    same cores meanwhile: each copy is as large as a core (244 MiB for a D_M=1000 core
    of physical dimension 4), and the tasks of a site that run at once on a worker are
    given the same core. Kept while one of them runs, by the cores' identities (the
    entry holds the cores, so those stay theirs)."""

    _shared: dict[tuple[Any, ...], list[Any]] = {}  # key -> [laid-out cores, users, cores]
    _lock = threading.Lock()

    def __init__(self, cores: list[Any], env: Any | None):
        self._cores, self._env = cores, env
        self._key: tuple[Any, ...] | None = None
        self._laid: list[Any] | None = None

    def cores(self) -> list[Any]:
        if self._laid is None:
            key = (*map(id, self._cores), tuple(self._env.shape[1:]))
            with self._lock:
                entry = self._shared.get(key)
                if entry is not None:
                    entry[1] += 1
            if entry is None:  # made outside the lock: an allocation may wait for memory
                laid = K.laid_out_for_rows(self._cores, self._env)
                with self._lock:
                    entry = self._shared.setdefault(key, [laid, 0, self._cores])
                    entry[1] += 1
            self._key, self._laid = key, entry[0]
        return self._laid

    def release(self) -> None:
        if self._key is None:
            return
        with self._lock:
            entry = self._shared[self._key]
            entry[1] -= 1
            if not entry[1]:
                del self._shared[self._key]
        self._key = self._laid = None


def update(eta: Any, zs: list[Any], *, site: int, run: str) -> Any:
    """:func:`_kernels.update_env`, in pieces of the rows of ``S_{j-1}`` if it does
    not fit in memory."""
    z = next(z for z in zs if z is not None)
    return _oom.halving(lambda a, b: K.update_env(eta[a:b], zs), eta.shape[0],
                        xp=K.xp_of(eta), run=run, step="update", site=site,
                        bytes_per_row=K.update_row_bytes(eta, z))


def partial_update(eta: Any, z: Any | None, env: Any | None, *, rows: tuple[int, ...],
                   out: tuple[int, int] | None = None, site: int, run: str,
                   in_place: bool = False) -> Any | None:
    """:func:`_kernels.partial_update`, in pieces of the rows of ``S_{j-1}`` if it does
    not fit in memory. ``in_place``: ``env`` is a running sum of the caller's own (not a
    task's input), and the block's share is added into it rather than into a new
    array: the product and one running sum are held, as the memory plan counts, not a
    new sum beside them."""
    if z is None:
        return env
    if out is not None:
        eta = eta[slice(*K.block_rows(eta.shape[0], *out))]
    if eta.shape[0] == 0:  # an empty block (the product's rank is below the bound)
        return K.xp_of(z).empty((0,) + tuple(z.shape[:z.ndim - 3]), dtype=z.dtype)
    into, base = (env, None) if in_place else (None, env)  # the sum added to, or made
    return _oom.halving(
        lambda a, b: K.partial_update(eta[a:b], z, None if base is None else base[a:b], rows),
        eta.shape[0], xp=K.xp_of(eta), run=run, step="update", site=site,
        bytes_per_row=K.update_row_bytes(eta, z), add_to=into)


def pass2_step(pieces: list[list[Any]], *args: Any, site: int, run: str, by_rows: bool = False,
               **kwargs: Any) -> Any:
    """:func:`_kernels.pass2_step` with the environment update and the projection in
    pieces of rows if they do not fit; the QR, one piece, names the site in an
    out-of-memory error. ``by_rows``: ``pieces`` is one list per row block of ``Z_j``
    (as :func:`sketch_rows` makes them), not one per block of columns."""
    if by_rows:
        pieces = [list(column) for column in zip(*pieces, strict=True)]
    def project_left(cores: list[Any], env: Any) -> Any:
        return project(cores, env, rows=None, site=site - 1, run=run)

    def update_here(eta: Any, zs: list[Any]) -> Any:
        return update(eta, zs, site=site, run=run)

    step = _oom.naming_the_site(K.pass2_step, site=site, step="pass 2's QR")
    return step(pieces, *args, site=site, update=update_here, project=project_left,
                ahead=_ahead(run), **kwargs)


#: Whether each run's next site of pass 2 in this process is made on a guess of its
#: basis (``_kernels.Ahead``), for the last few runs (by their token).
_AHEAD: dict[str, K.Ahead] = {}
_AHEAD_LOCK = threading.Lock()


def _ahead(run: str) -> K.Ahead:
    with _AHEAD_LOCK:
        ahead = _AHEAD.get(run)
        if ahead is None:
            if len(_AHEAD) >= 16:
                del _AHEAD[next(iter(_AHEAD))]
            ahead = _AHEAD[run] = K.Ahead()
        return ahead


def fused_pass2(block_envs: list[Any], zs: list[Any], cores_left: list[Any] | None, *,
                z_in_state: bool, blocks: list[tuple[int, int]], run: str,
                store: RunStore | None, site: int, **options: Any) -> Any:
    """A site of pass 2 in one task: the sketch pieces of each column block of ``C_j``
    (``block_envs``) against the whole ``Z_j``, then :func:`pass2_step`. ``z_in_state``:
    ``zs`` is ``[the previous step's result]``, whose third item is ``Z_j``."""
    if z_in_state:
        zs = [zs[0][2]]
    pieces = [[sketch_piece(env, zs[0], site=site, start=start, stop=stop, run=run,
                            store=store)]
              for env, (start, stop) in zip(block_envs, blocks, strict=True)]
    return pass2_step(pieces, zs, cores_left, site=site, run=run, **options)


def project_rows(cores: list[Any], parts: list[Any] | None, *, pick: int | None,
                 rows: tuple[int, int] | None, site: int, run: str) -> Any:
    """A row block of ``Z_j`` (split pass 2) from ``S_j`` given as ``parts`` to add up:
    ``[S_j]`` whole, cut to ``rows=(b, m)``; or (``pick``) each worker's share of
    ``S_j``, of which item ``pick`` is this block. None: ``S_j = 1``; an empty block."""
    env = None
    if parts is not None:
        chosen = [p for p in (parts if pick is None else [q[pick] for q in parts])
                  if p is not None]
        if not chosen:
            return None
        env = chosen[0]
        for p in chosen[1:]:
            env = env + p
    return project(cores, env, rows=rows, site=site, run=run)


def sketch_rows(block_envs: list[Any], z: Any, *, blocks: list[tuple[int, int]], site: int,
                run: str, store: RunStore | None) -> list[Any]:
    """The sketch of one row block of ``Z_j`` against every column block of ``C_j``."""
    return [sketch_piece(env, z, site=site, start=start, stop=stop, run=run, store=store)
            for env, (start, stop) in zip(block_envs, blocks, strict=True)]


def project_sketch(cores: list[Any], env: Any | None, rows: tuple[int, int] | None,
                   block_envs: list[Any], *, blocks: list[tuple[int, int]], site: int,
                   run: str, store: RunStore | None) -> list[Any]:
    """A row block of ``Z_j`` projected (:func:`project`: ``rows`` of ``S_j``, or all of
    ``env``) and sketched against every column block of ``C_j``; the block is not kept
    (``Plan.reproject``)."""
    z = project(cores, env, rows=rows, site=site, run=run)
    return sketch_rows(block_envs, z, blocks=blocks, site=site, run=run, store=store)


def project_update(eta: Any, cores: list[Any], s: Any | None, s_rows: tuple[int, int] | None,
                   env: Any | None, *, rows: tuple[int, ...],
                   out: tuple[int, int] | None = None, site: int, run: str,
                   in_place: bool = False) -> Any | None:
    """:func:`partial_update` with row block ``rows`` of ``Z_j`` projected again
    (from ``s_rows`` of ``S_j``, or all of ``s``) instead of kept (``Plan.reproject``)."""
    z = project(cores, s, rows=s_rows, site=site, run=run)
    return partial_update(eta, z, env, rows=rows, out=out, site=site, run=run,
                          in_place=in_place)


def project_update_all(eta: Any, cores: list[Any], sources: list[Any], *,
                       s_rows: list[tuple[int, int] | None], groups: int = 1,
                       out: tuple[int, int] | None = None, site: int, run: str) -> Any | None:
    """:func:`project_update` through every row block of ``Z_j`` in turn, in one task
    (block ``b`` projected from ``s_rows[b]`` of ``sources[b]``; the blocks shared out
    in ``groups``, ``_kernels.block_rows``); the running sum and one block are held at
    a time."""
    env = None
    for b, (s, rows) in enumerate(zip(sources, s_rows, strict=True)):
        env = project_update(eta, cores, s, rows, env, rows=(b, len(sources), groups),
                             out=out, site=site, run=run, in_place=True)
    return env


def split_qr(sketches: list[list[Any]], *, site: int, run: str, **options: Any) -> Any:
    """``(η_j, None, None)`` from the sketches of ``Z_j``'s row blocks (one list of
    column-block pieces per row block, as :func:`sketch_rows` makes them)."""
    return pass2_step(sketches, None, None, site=site, run=run, by_rows=True, **options)


def share(state: Any, zs: list[Any], *, first: int, blocks: int, dest: tuple[int, int, int],
          site: int, run: str) -> tuple[Any, ...]:
    """One worker's share ``conj(η_j)·Z_j`` of ``S_{j-1}`` from its row blocks ``zs``
    of ``Z_j`` (blocks ``first``… of ``blocks``), cut into the next site's row blocks
    ``dest = (b0, b1, m)``, ``b0 ≤ b < b1`` of ``m``: one array per block (None where
    a block is empty), for the worker that projects them."""
    eta = state[0]
    b0, b1, m = dest
    lo, hi = K.block_rows(eta.shape[0], b0, m)[0], K.block_rows(eta.shape[0], b1 - 1, m)[1]
    cut = [K.block_rows(eta.shape[0], b, m) for b in range(b0, b1)]
    if lo == hi or all(z is None for z in zs):
        return tuple(None for _ in cut)
    start = K.block_rows(eta.shape[1], first, blocks)[0]
    part = update(eta[lo:hi, start:], zs, site=site, run=run)
    return tuple(part[a - lo:b - lo] if b > a else None for a, b in cut)


def split_checkpoint(state: Any, shares: list[list[Any]], after: Any = None, *,
                     checkpoint: Callable[[Any, Any], None]) -> None:
    """Save ``η_j`` and ``S_{j-1}`` summed from the workers' ``shares`` (one list of
    shares per receiving worker, in row order), once ``after`` (the checkpoint of
    the site before) is saved: a resumed run starts from it."""
    rows = []
    for received in shares:
        for pieces in zip(*received, strict=True):
            pieces = [p for p in pieces if p is not None]
            if pieces:
                total = pieces[0]
                for p in pieces[1:]:
                    total = total + p
                rows.append(total)
    checkpoint(state[0], K.xp_of(rows[0]).concatenate(rows, axis=0))


def eta_of(state: Any, after: Any = None) -> Any:
    """``η_j`` from a QR task's state, once ``after`` (its checkpoint) has run."""
    return state[0]


def checkpointed(env: Any, eta: Any, *, checkpoint: Callable[[Any, Any], None]) -> Any:
    """``env`` (``S_{j-1}``), once ``checkpoint(η_j, S_{j-1})`` has saved it."""
    checkpoint(eta, env)
    return env


def checkpoint_begin(eta: Any, *, store: RunStore, site: int, left: tuple[int, ...],
                     blocks: int) -> int:
    """A checkpoint of ``S_{j-1}`` in ``blocks`` row blocks begun (η_j written): the rows
    of ``S_{j-1}``, for the blocks' tasks to place theirs. Its chunks of rows divide
    every block's first row, so no two blocks' tasks write the same chunk."""
    rows = int(eta.shape[0])
    starts = (K.block_rows(rows, b, blocks)[0] for b in range(blocks))
    store.begin_pass2(site, eta, left, rows=max(1, math.gcd(rows, *starts)))
    return rows


def checkpoint_rows(env: Any, rows: int, *, store: RunStore, site: int,
                    block: tuple[int, int]) -> None:
    """Row block ``block = (b, m)`` of ``S_{j-1}`` (of ``rows`` rows) into the begun
    checkpoint: no task holds ``S_{j-1}`` whole."""
    store.write_pass2_rows(site, K.block_rows(rows, *block)[0], env)


def checkpoint_end(*written: Any, store: RunStore, site: int) -> None:
    """The checkpoint complete, once every block is ``written``."""
    store.end_pass2(site)


def stored(*, store: RunStore, what: str, site: int, device: str) -> Any:
    """η or the right environment of a site an earlier run finished, on this run's device."""
    read = store.read_eta if what == "eta" else store.read_right_env
    return K.on_device(read(site), device)


def signal(x: Any) -> None:
    """None, once the task whose result is ``x`` has run (``GraphBuilder.signal``)."""
    return None


def signal_all(*xs: Any) -> None:
    """None, once the tasks whose results are ``xs`` have run (a barrier)."""
    return None


def to_host(x: Any) -> Any:
    """``x`` in host memory (an environment the device does not keep: ``Plan.host_envs``)."""
    return _transfer.to_host(x)


def to_disk(x: Any, *, run: str, name: str) -> _transfer.OnDisk:
    """``x`` written to the worker's disk (an environment neither the device nor host
    memory keeps: ``Plan.disk_envs``), as ``name`` of run ``run``."""
    return _transfer.to_disk(x, run, name)


def fetch(x: Any, after: Any = None, *, device: str) -> Any:
    """``x`` where the run's tasks use it (on the device of a GPU run, in host memory
    on a CPU), once ``after`` has run: an environment fetched back from host memory,
    or read back from disk, ahead of its use."""
    if isinstance(x, _transfer.OnDisk):
        return _transfer.from_disk(x, device=device == "gpu")
    return _transfer.to_device(x) if device == "gpu" else x


def first(x: Any, after: Any = None) -> Any:
    """``x``, where this task runs, once ``after`` has run (a fetch ahead of use)."""
    return x


def finish(core: Any, *, kind: str, site: int, n: int, store: RunStore | None,
           to_host: bool, outbox: _shared.Outbox | None = None) -> Any:
    """The output core in quimb's layout: to the client, into the store (its shape
    returned), or into shared memory for a client on this host (``outbox``: its file
    returned).

    Only site 0 (and, after rounding, the last site) carries the norm; the
    other cores have orthonormal rows, finite whenever their QR succeeded. The
    check is a device synchronisation, so it is made where it can fail.
    """
    if site in (0, n - 1) and not K.all_finite(core):
        raise FloatingPointError(
            f"site {site}: the result contains NaN or inf (overflow? rescale the inputs)"
        )
    core = K.xp_of(core).ascontiguousarray(K.unpad(core, kind, site, n))
    if store is not None:
        return store.write_result(site, _transfer.to_host(core), kind, n)
    if outbox is not None:  # copied from the device once, through pinned memory
        return outbox.put(core, site)
    return _transfer.to_host(core) if to_host else core

