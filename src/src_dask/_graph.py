"""The SRC sweep as one Dask task graph.

Keys are named ``<step>_site<j>-<token>``, so Dask's dashboard groups the
tasks by step and site and shows where a run is (the prefixes stay within the
15 characters its progress panel prints whole, up to site 9999):

``load_site<j>``
    read, pad and cast the input cores of site ``j`` (one task per factor;
    lazy inputs once per pass, on several GPUs once per worker);
``pass1_site<j>``
    the sketch chain ``C_j → C_{j+1}``, one task per block of sketch columns —
    the blocks never talk to each other, so pass 1 is embarrassingly parallel;
``pass2_site<j>``
    a piece of the sketch per column block of ``C_j`` (and row block of ``Z_j``),
    then one task for the QR, the update of ``S`` and the projected core ``Z``
    of the next site. A projected core over ``Plan.z_block_bytes`` (the stack's
    physical legs multiply its size) is instead made by one task per block of
    its rows, so that it is computed, kept and spilled in pieces; the QR task
    sums the next ``S`` from the blocks, or, with the blocks spread over CPU
    workers, each block adds its share to a running sum where it is. Where
    pass 2 runs in one place (a GPU or a single cluster worker) and ``Z_j`` is
    whole, the pieces are made inside the QR task: one task per site. On
    several GPUs pass 2 runs on the first worker (``fetch`` tasks bring the
    other workers' blocks of ``C_j`` to it ahead of use);
``round_site<j>``
    the exact rounding sweep of oversampled runs;
``result_site<j>``
    the output core in quimb's layout.
"""

from __future__ import annotations

import math
import operator
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import dask
import dask.array as da
import dask.utils
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from . import _kernels as K
from . import _oom, _random, _transfer
from ._runstore import Progress, RunStore
from ._stack import Stack

#: Largest projected core ``Z`` made in one piece (bytes), unless the Dask config
#: key ``src_dask.projection-block-size`` says otherwise (e.g. ``"512 MiB"``).
Z_BLOCK_BYTES = 2 * 2**30


def _z_block_bytes() -> int:
    return dask.utils.parse_bytes(dask.config.get("src_dask.projection-block-size",
                                                  Z_BLOCK_BYTES))


@dataclass(frozen=True)
class Plan:
    """The numbers that shape the graph."""

    sketch: int  # sketch columns s = chi_out + oversample
    chunk: int  # sketch columns per block
    chi_out: int
    cutoff: float
    key: int  # key word of the sketch's counter-based generator, from the seed
    round: bool  # exact rounding to chi_out after an oversampled sketch
    device: str = "cpu"  # "cpu" (NumPy blocks) or "gpu" (CuPy blocks)
    to_host: bool = True  # results as NumPy arrays (else they stay on the run's device)
    # projected cores larger than this go in row blocks
    z_block_bytes: int = field(default_factory=lambda: _z_block_bytes())
    # lazy inputs read once and kept from pass 1 to pass 2 (else read in each pass)
    keep_inputs: bool = False

    @property
    def blocks(self) -> list[tuple[int, int]]:
        return [(c, min(c + self.chunk, self.sketch)) for c in range(0, self.sketch, self.chunk)]


def _is_zarr(x: Any) -> bool:
    """A stored array read whole by a task of its own: Zarr, or a verified one
    (:class:`_integrity.VerifiedArray`, the sources of a train opened from disk)."""
    from ._integrity import VerifiedArray

    return isinstance(x, VerifiedArray) or type(x).__module__.startswith("zarr")


def _read_whole(x: Any, after: Any = None, pinned: bool = False) -> Any:
    """A whole Zarr array, in host memory (a GPU run moves it in ``prepare_core``
    through pinned memory on a copy stream: faster than zarr's GPU buffers,
    which copy pageable memory on the kernels' stream). ``after``: see ``_Graph.array``.

    ``pinned`` (GPU runs): read straight into page-locked memory. Zarr copies every
    chunk into the output on its one event-loop thread, so a fresh output, whose
    pages are touched for the first time there, capped reads at ~0.8 GB/s for all
    the worker's threads together; a pooled pinned buffer also spares the copy
    into pinned memory before the transfer.

    A :class:`_integrity.VerifiedArray` is read through its checks (missing or
    damaged chunks, NaN/inf, a train saved over: ``DamagedDataError``/``StoreError``).
    """
    from ._integrity import VerifiedArray

    if isinstance(x, VerifiedArray):
        return x.read(out=_transfer.empty_pinned(x.shape, x.dtype)) if pinned else x.read()
    if not pinned or not hasattr(x, "get_basic_selection"):
        return x[...]
    from zarr.core.buffer.cpu import NDBuffer

    out = _transfer.empty_pinned(x.shape, x.dtype)
    x.get_basic_selection(Ellipsis, out=NDBuffer.from_numpy_array(out))
    return out


def _prepare(raw: Any, after: Any = None, **options: Any) -> Any:
    """:func:`_kernels.prepare_core`; ``after``: see ``_Graph.array``."""
    return K.prepare_core(raw, **options)


def _lazy(core: Any) -> Any:
    """Dask arrays stay; Zarr (and other array-likes) are wrapped without reading; a
    verified array keeps its checks (``_integrity.to_dask``)."""
    from . import _integrity

    if isinstance(core, da.Array) or K.is_in_memory(core):
        return core
    if isinstance(core, _integrity.VerifiedArray):
        return _integrity.to_dask(core)
    return da.from_array(core, chunks=getattr(core, "chunks", "auto"), asarray=False)


class _Graph:
    """A task graph under construction: keys, tasks and the input collections."""

    def __init__(self, workers: list[str], device: str) -> None:
        self.device = device
        self.tasks: dict[Any, Any] = {}
        self.inputs: list[da.Array] = []
        self.workers = workers
        self.placement: dict[Any, str] = {}
        self._shared: dict[int, tuple[Any, Any]] = {}  # id(array): (array, its data key)

    def add(self, key: Any, func, /, *deps: Any, **static: Any) -> Any:
        """Add ``func(*deps, **static)``; ``deps`` are keys (or lists of keys, or None),
        or in-memory arrays (from :meth:`array`)."""
        self.tasks[key] = (partial(func, **static) if static else func, *deps)
        return key

    def pin(self, key: Any, block: int) -> Any:
        """Prefer the worker that owns column block ``block`` for ``key``.

        Environments are the big state: a block's whole chain of ``C_j`` and
        its pieces of the sketch stay on one worker, and the (smaller) cores
        and projected cores travel to it. Loose: another worker may take over
        if that one is lost.
        """
        if self.workers:
            self.placement[key] = self.workers[block % len(self.workers)]
        return key

    def array(self, x: Any, after: Any = None) -> Any:
        """Array ``x`` whole, for a task's arguments: an in-memory array as it is (it
        travels inside the task that uses it: no task of its own for the scheduler to
        run) or, where several workers prepare their own copy (:meth:`groups`), as one
        data key they all use (the graph carries it once); a lazy one as a key whose
        task reads it.

        A Zarr array gets a new read task at every call: each pass reads its
        cores anew instead of keeping them in memory from pass 1 to pass 2.
        ``after`` (a key) holds the read back until that task has run: reads have
        no inputs, so idle threads would otherwise read every core at the start.
        """
        if _is_zarr(x):
            key = ("src_read-" + uuid.uuid4().hex,)
            self.tasks[key] = (partial(_read_whole, pinned=self.device == "gpu"), x, after)
            return key
        x = _lazy(x)
        if K.is_in_memory(x):
            if self.groups() == 1:
                return x
            if id(x) not in self._shared:  # the array is held, so its id stays its own
                key = ("src_input-" + uuid.uuid4().hex,)
                self.tasks[key] = x
                self._shared[id(x)] = (x, key)
            return self._shared[id(x)][1]
        x = x.rechunk(x.shape)
        self.inputs.append(x)
        return (x.name,) + (0,) * x.ndim

    def groups(self) -> int:
        """How many workers prepare their own copy of the inputs: every GPU worker
        (moving a core between GPUs costs more than reading it again), one otherwise
        (each lazy core is read once per pass)."""
        return len(self.workers) if self.device == "gpu" and len(self.workers) > 1 else 1

    def delayed(self, key: str) -> Delayed:
        """The graph as one Delayed computing ``key``."""
        placement = self.placement
        annotations = None
        if placement:
            annotations = {"workers": placement.get,
                           "allow_other_workers": lambda k: True if k in placement else None}
        layer = MaterializedLayer(self.tasks, annotations=annotations)
        return Delayed(key, HighLevelGraph.from_collections(key, layer, self.inputs))


def build(stack: Stack, plan: Plan, workers: list[str] | None = None,
          store: RunStore | None = None, progress: Progress | None = None) -> Delayed:
    """The list of output cores of SRC on ``stack`` as one Delayed (one graph).

    ``workers`` (addresses of a distributed cluster) places the column blocks. With a run
    ``store`` the environments and outputs go to disk, the result is a list of
    the output shapes, and ``progress`` says what an earlier run already did.
    """
    token = uuid.uuid4().hex
    n, blocks = stack.n, plan.blocks
    g = _Graph(workers or [], plan.device)

    def name(step: str, j: int) -> str:
        return f"{step}_site{j}-{token}"

    loaded: dict[tuple[int, int, int], Any] = {}
    groups = g.groups()
    ahead = _lookahead(stack, plan)

    def load(j: int, sweep: int, after: Any = None, group: int = 0) -> list[Any]:
        """Site j's cores for one pass, read and moved once ``after`` has run (a few sites
        ahead of their use: memory holds a few sites' inputs, not all of them). Lazy
        inputs are read anew for each pass, so no core waits in memory from pass 1 to
        pass 2. In-memory inputs, and lazy ones with ``plan.keep_inputs``, are prepared
        once for both passes. On several GPUs each worker that uses a core (``group``)
        prepares its own: reading it again beats moving it between GPUs."""
        keys = []
        for i, f in enumerate(stack.factors):
            raw = f.train[j]
            lazy = not K.is_in_memory(raw)
            once = not lazy or plan.keep_inputs
            slot = (j, i, group)
            if not (once and slot in loaded):
                key = (name("load", j), 0 if once else sweep, i) + ((group,) if group else ())
                # the data of lazy inputs is checked once: in pass 1, or in pass 2 for
                # the last site (pass 1 stops before it) and when an earlier run did pass 1
                check = lazy and (sweep == 1 or j == n - 1 or not todo)
                loaded[slot] = g.add(key, _prepare, g.array(f.train.source(j), after), after,
                                     kind=f.train.kind, site=j, n=n, transpose=f.transpose,
                                     dtype=stack.dtype, check=check,
                                     name=f.train.name, device=plan.device)
                if groups > 1:
                    g.pin(loaded[slot], group)
            keys.append(loaded[slot])
        return keys

    # Pass 1: C_1 … C_{n-1}, one independent chain per block of columns.
    todo = [c for c in range(len(blocks)) if not (progress and progress.pass1_done[c])]
    lead = {}  # the first block each group runs: its chain paces the group's reads
    for c in todo:
        lead.setdefault(c % groups, c)
    cores1 = {(j, grp): load(j, 1, (name("pass1", j - ahead), c) if j >= ahead else None, grp)
              for grp, c in lead.items() for j in range(n - 1)}
    envs: list[list[Any]] = [[None] * len(blocks) for _ in range(n)]
    for c in todo:
        start, stop = blocks[c]
        env = None
        for j in range(n - 1):
            env = g.add((name("pass1", j), c), _pass1_task, env, cores1[j, c % groups], site=j,
                        start=start, stop=stop, run=token, store=store, block=c,
                        last=j == n - 2, seed_key=plan.key, legs=(stack.up(j), stack.down(j)))
            envs[j + 1][c] = g.pin(env, c)

    # Pass 2: right to left. Site j turns S_j into Z_j (in row blocks when it is large),
    # sketches it against C_j, and the QR step makes η_j and S_{j-1}. On several GPUs
    # it all runs on the first worker (``home``), which fetches the other workers' blocks
    # of C_j a few sites ahead: each step would otherwise move S (the size of C_j times
    # chi_out / s) and Z between GPUs, at the rate of the link, in the critical path.
    home = groups > 1

    def place(key: Any, b: int) -> Any:
        return g.pin(key, 0 if home else b)

    def ahead_of(j: int) -> Any:
        """The step whose end lets site j's inputs of pass 2 be read (or fetched)."""
        return (name("pass2", j + ahead), "core") if j + ahead < n else None

    out: list[Any] = [None] * n
    first = progress.pass2_next if progress else n - 1
    cores2 = {j: load(j, 2, ahead_of(j)) for j in range(first + 1)}
    env = None  # S = 1 right of the last site
    if first < n - 1:
        env = g.add((name("pass2", first), "resume"), _stored, store=store,
                    what="right_env", site=first, device=plan.device)
    for j in range(n - 1, first, -1):
        out[j] = g.add((name("pass2", j), "core"), _stored, store=store, what="eta", site=j,
                       device=plan.device)
    z_blocks = [_z_blocks(stack, plan, j) for j in range(n)]
    # Pass 2 in one place (a GPU, or a single worker of a cluster) with Z_j whole: the
    # site's sketch pieces are made inside its QR task, which takes Z_j straight from
    # the previous step's result. One task per site is then on the critical path; on
    # a distributed cluster each dependent task costs a round trip through the
    # scheduler (its batched sends wait up to 2 + 5 ms), more than a small site's GEMMs.
    # Dask's local schedulers on a CPU keep the pieces as tasks: a task costs little
    # there, and the threads run the pieces side by side (MPO·MPS χ=200 on 2 cores ran
    # ~7 % slower fused).
    together = plan.device == "gpu" or len(g.workers) == 1
    zs = None  # Z_j's row blocks, when the step of site j+1 projected it whole
    z_in_state = False  # zs is [the step of site j+1], whose third item is Z_j
    for j in range(first, -1, -1):
        if zs is None:
            m, z_in_state = z_blocks[j], False
            zs = [g.add((name("pass2", j), "project", b),
                        _oom.naming_the_site(K.project_core, site=j, step="pass 2"),
                        cores2[j], env, rows=(b, m))
                  for b in range(m)]
            # row blocks spread over CPU workers (the sketch and update of a block follow
            # it); all of pass 2 on the first of several GPUs
            if m > 1 or home:
                zs = [place(z, b) for b, z in enumerate(zs)]
        if j == 0:
            break
        fused = together and len(zs) == 1
        block_envs, pieces = [], []
        for c, (start, stop) in enumerate(blocks):
            # with a store: C_j is read from disk, after block c's chain (if this run
            # does it) has written it
            block_env = envs[j][c] if store is None else envs[n - 1][c]
            if home and store is None and c % groups:
                block_env = g.pin(g.add((name("pass2", j), "fetch", c), _first, block_env,
                                        ahead_of(j)), 0)
            block_envs.append(block_env)
            if fused:
                continue
            row = [g.add((name("pass2", j), "sketch", b, c), _piece_task, block_env, z, site=j,
                         start=start, stop=stop, run=token, store=store)
                   for b, z in enumerate(zs)]
            # A CPU multiplies its block where the block lives. A GPU multiplies so fast
            # that moving data dominates: there C_j goes to Z (smaller by a factor of the
            # physical dimensions up·down), not Z to C_j.
            pieces.append([g.pin(k, c) for k in row] if plan.device == "cpu" else
                          [place(k, 0) for k in row])
        # Z in blocks over several CPU workers: each block adds its share of S_{j-1}
        # where the block is (moving the S-sized running sum, not Z). Z in one place: the
        # QR task does it all (a task hop per block less on the critical path).
        chain = len(zs) > 1 and plan.device == "cpu" and len(g.workers) > 1
        whole = not chain and z_blocks[j - 1] == 1
        checkpoint = partial(store.write_pass2, j) if store else None
        options = dict(up=stack.up(j), down=stack.down(j), cutoff=plan.cutoff,
                       max_rank=stack.max_rank(j), site=j,
                       checkpoint=None if chain else checkpoint)
        if fused:
            state = g.add((name("pass2", j), "qr"), _fused_pass2_task, block_envs, zs,
                          cores2[j - 1] if whole else None, z_in_state=z_in_state,
                          blocks=blocks, run=token, store=store, **options)
        else:
            state = g.add((name("pass2", j), "qr"), _pass2_step, pieces,
                          None if chain else zs, cores2[j - 1] if whole else None, **options)
        if home:
            g.pin(state, 0)
        out[j] = g.add((name("pass2", j), "core"), operator.getitem, state, 0)
        if chain:
            # a chain, so that one running sum (not one partial per block) is in memory
            env = None
            for b, z in enumerate(zs):
                env = place(g.add((name("pass2", j), "update", b),
                                  _oom.naming_the_site(K.partial_update, site=j, step="pass 2"),
                                  out[j], z, env, rows=(b, len(zs))), b)
            if checkpoint is not None:
                env = g.add((name("pass2", j), "env"), _checkpointed, env, out[j],
                            checkpoint=checkpoint)
            zs = None
        elif whole and together and j > 1:  # the next site's task picks Z out itself
            zs, z_in_state = [state], True
        elif whole:
            zs, z_in_state = [g.add((name("pass2", j - 1), "project", 0), operator.getitem,
                                    state, 2)], False
        else:
            zs = None
            env = g.add((name("pass2", j), "env"), operator.getitem, state, 1)
    out[0] = g.add((name("pass2", 0), "core"), K.first_core, zs)

    if plan.round:
        carry = None
        for j in range(n):
            step = g.add((name("round", j), "svd"), K.round_step, carry, out[j],
                         chi=plan.chi_out, cutoff=plan.cutoff, last=j == n - 1)
            out[j] = g.add((name("round", j), "core"), operator.getitem, step, 0)
            carry = g.add((name("round", j), "carry"), operator.getitem, step, 1)

    results = [g.add(name("result", j), _finish, o, kind=stack.kind, site=j, n=n, store=store,
                     to_host=plan.to_host)
               for j, o in enumerate(out)]
    return g.delayed(g.add(f"src_result-{token}", list, results))


def outputs(graph: Delayed) -> list[Delayed]:
    """One Delayed per output core of ``graph`` (a :func:`build` result), over the same
    graph: a client can fetch each core as soon as it is final."""
    _, keys = graph.dask[graph.key]
    return [Delayed(k, graph.dask, layer=graph.key) for k in keys]


def _pass1_task(env: Any, cores: list[Any], *, site: int, start: int, stop: int, run: str,
                store: RunStore | None, block: int, last: bool, seed_key: int,
                legs: tuple[int, int]) -> Any:
    """One step of a block's pass-1 chain, in halves if it does not fit in memory.

    With a run store ``C_{j+1}`` also goes to disk (pass 2 reads it there) and
    the last site marks the block done.
    """
    omega = _random.sketch_block(seed_key, site, start, stop, legs, cores[0].dtype)

    def compute(a: int, b: int) -> Any:
        part = None if env is None else env[a:b]
        return K.sketch_step(part, cores, omega=omega[a:b], site=site)

    out = _oom.halving(compute, stop - start, xp=K.xp_of(cores[0]), run=run, step="pass 1",
                       site=site, bytes_per_column=K.sketch_step_bytes(cores))
    if store is None:
        return out
    store.write_env(site + 1, start, out)
    if last:
        store.mark_block_done(block)
        return None
    return out


def _piece_task(env: Any, z: Any, *, site: int, start: int, stop: int, run: str,
                store: RunStore | None) -> Any:
    """A block of pass 2's sketch, in halves if it does not fit in memory."""
    if z is None:
        return None
    xp = K.xp_of(z)
    if store is not None:
        env = xp.asarray(store.read_env(site, start, stop))
    return _oom.halving(lambda a, b: K.sketch_piece(env[a:b], z), stop - start, xp=xp,
                        run=run, step="pass 2", site=site,
                        bytes_per_column=K.sketch_piece_bytes(env, z))


def _pass2_step(*args: Any, site: int, **kwargs: Any) -> Any:
    return _oom.naming_the_site(K.pass2_step, site=site, step="pass 2")(*args, site=site,
                                                                        **kwargs)


def _fused_pass2_task(block_envs: list[Any], zs: list[Any], cores_left: list[Any] | None, *,
                      z_in_state: bool, blocks: list[tuple[int, int]], run: str,
                      store: RunStore | None, site: int, **options: Any) -> Any:
    """A site of pass 2 in one task: the sketch pieces of each column block of ``C_j``
    (``block_envs``) against the whole ``Z_j``, then :func:`_pass2_step`. ``z_in_state``:
    ``zs`` is ``[the previous step's result]``, whose third item is ``Z_j``."""
    if z_in_state:
        zs = [zs[0][2]]
    pieces = [[_piece_task(env, zs[0], site=site, start=start, stop=stop, run=run,
                           store=store)] for env, (start, stop) in zip(block_envs, blocks,
                                                                      strict=True)]
    return _pass2_step(pieces, zs, cores_left, site=site, **options)


def _checkpointed(env: Any, eta: Any, *, checkpoint: Callable[[Any, Any], None]) -> Any:
    """``env`` (``S_{j-1}``), once ``checkpoint(η_j, S_{j-1})`` has saved it."""
    checkpoint(eta, env)
    return env


def _stored(*, store: RunStore, what: str, site: int, device: str) -> Any:
    """η or the right environment of a site an earlier run finished, on this run's device."""
    read = store.read_eta if what == "eta" else store.read_right_env
    return K.on_device(read(site), device)


def _first(x: Any, after: Any = None) -> Any:
    """``x``, where this task runs, once ``after`` has run (a fetch ahead of use)."""
    return x


def _lookahead(stack: Stack, plan: Plan) -> int:
    """How many sites ahead of their use inputs are read: enough that reads overlap
    each other and the contractions, within ``2 * plan.z_block_bytes`` of inputs
    in flight (2 to 8 sites)."""
    site_bytes = max(sum(math.prod(s) for s in stack.shapes(j)) for j in range(stack.n))
    return max(2, min(8, 2 * plan.z_block_bytes // max(1, site_bytes * stack.dtype.itemsize)))


def _z_blocks(stack: Stack, plan: Plan, site: int) -> int:
    """Row blocks of the projected core ``Z`` at ``site``: enough to keep each within
    ``plan.z_block_bytes``. (Its rows, the bond right of the site, may come out
    fewer than this bound with a cutoff; blocks then come out smaller or empty.)"""
    rows = 1 if site == stack.n - 1 else min(plan.sketch, stack.max_rank(site + 1))
    nbytes = (math.prod(stack.left_bonds(site)) * rows * stack.up(site) * stack.down(site)
              * stack.dtype.itemsize)
    return max(1, min(rows, math.ceil(nbytes / plan.z_block_bytes)))


def _finish(core: Any, *, kind: str, site: int, n: int, store: RunStore | None,
            to_host: bool) -> Any:
    """The output core in quimb's layout: to the client, or into the store (its shape
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
    if to_host or store is not None:
        core = _transfer.to_host(core)
    return core if store is None else store.write_result(site, core)
