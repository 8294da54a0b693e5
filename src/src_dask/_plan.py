"""Every sizing, placement and fusion decision of a run, made in one place.

:class:`Plan` holds the numbers a run is asked for (sketch width, block of
columns, seed key, device, …); :class:`SweepPlan` adds what follows from them,
the stack and the cluster — how far ahead inputs are read, how each projected
core is cut, where pass 2 runs and how its tasks are fused — so the graph
builder only follows decisions and never makes one. Each function here is
small, pure and unit-tested.
"""

from __future__ import annotations

import enum
import logging
import math
from dataclasses import dataclass, field
from typing import Any

import dask.utils

from . import config
from ._stack import Stack

log = logging.getLogger("src_dask")


@dataclass(frozen=True)
class Plan:
    """The numbers that shape a run's graph."""

    sketch: int  # sketch columns s = chi_out + oversample (clamped: :func:`sketch_width`)
    chunk: int  # sketch columns per block
    chi_out: int
    cutoff: float
    key: int  # key word of the sketch's counter-based generator, from the seed
    round: bool  # exact rounding to chi_out after an oversampled sketch
    device: str = "cpu"  # "cpu" (NumPy blocks) or "gpu" (CuPy blocks)
    to_host: bool = True  # results as NumPy arrays (else they stay on the run's device)
    # projected cores larger than this go in row blocks (config projection-block-size)
    z_block_bytes: int = field(default_factory=lambda: config.get_bytes("projection-block-size"))
    # lazy inputs read once and kept from pass 1 to pass 2 (else read in each pass)
    keep_inputs: bool = False
    # memory one task may use (:func:`task_bytes`); None: not bounded
    task_bytes: int | None = None
    # tasks a worker runs at once, which share its memory: a task that runs alone (pass
    # 2's environment sum, which every other task of the sweep waits for) may use theirs
    threads: int = 1
    # on a GPU, the environments C_1 … C_h (h = host_envs) that the device does not keep:
    # pass 1 copies them to host memory as it makes them, pass 2 copies each back a site
    # ahead of its use (see :func:`host_envs`)
    host_envs: int = 0
    # of those, C_1 … C_d (d = disk_envs) that the worker's host memory does not keep
    # either: written to a file of its directory as they are made, read back a site
    # ahead of use by the tasks' threads (see :func:`host_envs`)
    disk_envs: int = 0
    # on a GPU whose data limit cannot hold a site's projected core ``Z_j`` beside the
    # rest of the run's data: ``Z_j`` is not kept between its sketch and the
    # environment update, each of those tasks projects its row block itself (see
    # :func:`reprojects`)
    reproject: bool = False
    # sites ahead of their use that inputs are read (None: :func:`lookahead` decides)
    read_ahead: int | None = None

    @property
    def blocks(self) -> list[tuple[int, int]]:
        """``[start, stop)`` of each block of sketch columns."""
        return [(c, min(c + self.chunk, self.sketch)) for c in range(0, self.sketch, self.chunk)]


@dataclass(frozen=True)
class SiteStep:
    """How pass 2's step at one site is cut into tasks."""

    fused: bool  # the sketch pieces are made inside the QR task (one task per site)
    chain: bool  # Z's row blocks add their share of S where each is (over CPU workers)
    whole: bool  # the next site's Z is projected whole by this step's task
    reproject: bool = False  # Z not kept: its sketch and its update each project it


class Pass2(enum.Enum):
    """Where pass 2 runs, for the whole sweep: one of seven exclusive modes, decided
    from the device, the workers and config ``pass2-split`` (:meth:`decide`; ``FIRST``
    from ``SPREAD`` by :meth:`SweepPlan.decide`, which knows the sites' ``Z``). The
    properties below are the decisions each mode implies at every site.

    ``LOCAL``: Dask's local scheduler on a CPU. The sketch pieces stay separate
    tasks, which its threads run side by side, each where its block of ``C_j`` is.
    ``ONE_WORKER``: one CPU cluster worker; ``ONE_GPU``: one GPU (with or without a
    cluster). Pass 2 runs in one place, so a site whose ``Z`` is whole is one task:
    on a distributed cluster each dependent task costs a scheduler round trip, more
    than a small site's GEMMs.
    ``HOME``: several GPUs without the split: all of pass 2 on the first worker,
    which fetches the others' blocks of ``C_j`` ahead of use.
    ``SPREAD``: several CPU workers share ``Z``'s row blocks, summing ``S_{j-1}``
    along them.
    ``FIRST``: several single-threaded CPU workers, ``Z`` whole at every site (where
    ``SPREAD`` has nothing to share but the sketch pieces): pass 1 over all of them,
    all of pass 2 on the first, a site one task, the others' blocks of ``C_j`` fetched
    to it ahead of use (as ``HOME`` on GPUs). Spread, each site moved ``Z_j`` to the
    workers of ``C_j``'s blocks and paid two scheduler round trips on the critical
    path for a sketch piece a few milliseconds long (docs/design.md §3.3, "Pass 2 on
    the first of several single-threaded CPU workers", has the measurements).
    ``SPLIT``: several workers share every site of pass 2 by rows of ``Z``
    (docs/design.md §8): each projects its rows, sketches them against the whole
    ``C_j`` (the blocks it did not make in pass 1 are copied to it ahead of use),
    the sketch pieces meet in one QR, and each worker forms its share of
    ``S_{j-1}``, sent by rows to the worker that projects them next. The default
    on several GPU workers (config ``pass2-split``: ``auto``).
    """

    LOCAL = "local"
    ONE_WORKER = "one worker"
    ONE_GPU = "one gpu"
    HOME = "home"
    SPREAD = "spread"
    SPLIT = "split"
    FIRST = "first worker"

    @property
    def home(self) -> bool:
        """All of pass 2 is pinned to the first worker, which fetches the other
        workers' blocks of ``C_j`` ahead of use (several GPUs, no split; or ``FIRST``)."""
        return self in (Pass2.HOME, Pass2.FIRST)

    @property
    def together(self) -> bool:
        """Pass 2 runs in one place on a cluster or a GPU: a site whose ``Z`` is whole
        is one task, and a chain through ``Z``'s row blocks is one task too."""
        return self in (Pass2.ONE_WORKER, Pass2.ONE_GPU, Pass2.HOME, Pass2.FIRST)

    @property
    def spread(self) -> bool:
        """``Z``'s row blocks stay on the CPU workers that made them, ``S_{j-1}`` summed
        along them (a chain of updates)."""
        return self is Pass2.SPREAD

    @property
    def pieces_at_env(self) -> bool:
        """A sketch piece is one task per pair of blocks, where the block of ``C_j``
        lives (a CPU); else one task per row block of ``Z`` against all of ``C_j``
        (a GPU multiplies so fast that moving data dominates, so ``C_j`` goes to
        ``Z``, smaller by the physical legs)."""
        return self in (Pass2.LOCAL, Pass2.ONE_WORKER, Pass2.SPREAD, Pass2.FIRST)

    @property
    def split(self) -> bool:
        """Several workers share every site by rows of ``Z`` (see the class)."""
        return self is Pass2.SPLIT

    @classmethod
    def decide(cls, device: str, n_workers: int, groups: int, split: Any = "auto") -> Pass2:
        """For a run on ``device`` with ``n_workers`` workers, ``groups`` of which
        prepare their own inputs (:func:`input_groups`: several on several GPUs);
        ``split`` (config ``pass2-split``): ``True``, ``False`` or ``"auto"`` (on
        several GPUs). Workers with their own inputs and no split: ``HOME``."""
        gpu = device == "gpu"
        if n_workers > 1 and (split is True or (split == "auto" and gpu)):
            return cls.SPLIT
        if groups > 1:
            return cls.HOME
        if gpu:
            return cls.ONE_GPU
        if n_workers > 1:
            return cls.SPREAD
        return cls.ONE_WORKER if n_workers == 1 else cls.LOCAL

    @classmethod
    def of_run(cls, device: str, n_workers: int) -> Pass2:
        """Where pass 2 runs for a run on ``device`` with ``n_workers`` workers, as the
        config (``pass2-split``) and the inputs' groups (:func:`input_groups`) say."""
        split = config.get_choice("pass2-split", ("auto", True, False))
        return cls.decide(device, n_workers, input_groups(device, n_workers), split)

    def step(self, z_here: int, z_left: int, fits: bool = True,
             bounded: bool = False, cut_env: bool = False,
             reproject: bool = False) -> SiteStep:
        """The step at a site whose ``Z`` has ``z_here`` row blocks, the next site's
        ``z_left`` (not split pass 2). ``fits``: the site's whole step fits one task
        (:func:`one_task`); ``bounded``: memory, not only size, cut ``Z`` in blocks,
        so no task may hold them all (their shares of ``S`` are summed one by one);
        ``cut_env``: no task may hold ``S_{j-1}`` whole either, so it is summed in row
        blocks, one running sum each (:func:`env_blocks`);
        ``reproject``: ``Z`` is not kept (:func:`reprojects`), its shares of ``S`` are
        summed one by one, each block projected again."""
        if reproject:
            return SiteStep(fused=False, chain=True, whole=False, reproject=True)
        chain = (z_here > 1 and (self.spread or bounded)) or cut_env
        return SiteStep(fused=self.together and z_here == 1 and fits, chain=chain,
                        whole=not chain and z_left == 1 and fits)


@dataclass(frozen=True)
class SweepPlan:
    """A :class:`Plan` with everything that follows from it for one stack and one
    set of workers (see :meth:`decide`)."""

    plan: Plan
    addresses: tuple[str, ...]  # the cluster's workers (none: Dask's local scheduler)
    groups: int  # workers that prepare their own copy of the inputs
    copy_inputs: bool  # each site read by one of them, copied to the others (a fast link)
    own_streams: bool  # each task's kernels on a stream of its own, waited for (own_streams)
    lookahead: int  # sites ahead of their use that inputs are read
    z_blocks: tuple[int, ...]  # row blocks of each site's projected core
    pass2: Pass2
    fits: tuple[bool, ...] = ()  # per site: its whole step fits one task (one_task)
    bounded: tuple[bool, ...] = ()  # per site: memory cut Z in blocks (no task holds all)
    # per site j: the running sums S_{j-1} is made in (1: whole; no task may hold it
    # whole else), each over a group of Z_{j-1}'s row blocks (``K.block_rows``'s groups)
    env_sums: tuple[int, ...] = ()
    # per site j >= 1: how pass 2's step there is cut into tasks (not split pass 2)
    steps: tuple[SiteStep | None, ...] = ()
    # each task with glibc's default reuse of freed blocks while it runs (own_heap)
    own_heap: bool = False

    @property
    def cut_env(self) -> tuple[bool, ...]:
        """Per site j: whether ``S_{j-1}`` is summed in blocks (``env_sums``)."""
        return tuple(e > 1 for e in self.env_sums)

    def z_groups(self, j: int) -> int:
        """The groups ``Z_j``'s row blocks are shared out in: the sums ``S_j`` was made
        in (``env_sums[j + 1]``), each block projected from the rows of its group's."""
        return self.env_sums[j + 1] if j + 1 < len(self.env_sums) else 1

    @classmethod
    def decide(cls, stack: Stack, plan: Plan, addresses: list[str] | None) -> SweepPlan:
        addresses = tuple(addresses or ())
        groups = input_groups(plan.device, len(addresses))
        pass2 = Pass2.of_run(plan.device, len(addresses))
        blocks = [z_blocks(stack, plan, j) for j in range(stack.n)]
        if pass2.split:  # at least one row block of Z per worker
            blocks = [max(b, min(z_rows(stack, plan, j), len(addresses)))
                      for j, b in enumerate(blocks)]
        # split pass 2 cuts S_{j-1} by its workers' rows already
        env = [1 if pass2.split else env_blocks(stack, plan, j) for j in range(stack.n)]
        cut = [e > 1 for e in env]
        for j in range(1, stack.n):  # S_{j-1}'s sums each over a group of Z_{j-1}'s blocks
            blocks[j - 1] = max(blocks[j - 1], env[j])
        fits = tuple(one_task(stack, plan, j) and not cut[j] for j in range(stack.n))
        bounded = tuple(not z_whole_fits(stack, plan, j) for j in range(stack.n))
        if pass2.spread and on_first_worker(plan, blocks, fits, bounded):
            pass2 = Pass2.FIRST
        steps = (None,) + tuple(pass2.step(blocks[j], blocks[j - 1], fits=fits[j],
                                           bounded=bounded[j], cut_env=cut[j],
                                           reproject=not pass2.split
                                           and reprojects(stack, plan, j))
                                for j in range(1, stack.n))
        return cls(plan=plan, addresses=addresses, groups=groups,
                   copy_inputs=copy_inputs(plan.device, addresses),
                   own_streams=own_streams(plan.device, addresses),
                   own_heap=own_heap(plan.device, bool(addresses)),
                   lookahead=lookahead(stack, plan), z_blocks=tuple(blocks), pass2=pass2,
                   fits=fits, bounded=bounded, env_sums=tuple(env), steps=steps)


def on_first_worker(plan: Plan, blocks: list[int], fits: tuple[bool, ...],
                    bounded: tuple[bool, ...]) -> bool:
    """Whether pass 2 over several CPU workers runs on the first (``Pass2.FIRST``), not
    spread: where each worker runs one task at a time (``plan.threads``: more threads
    would run a site's sketch pieces side by side) and every site's ``Z`` is whole and
    its step fits one task, so spreading it would share only the sketch pieces, at the
    price of ``Z_j`` crossing to every block's worker and two scheduler round trips a
    site on the critical path. Not for reprojected cores (GPU plans), nor with a
    cutoff: the output's bonds, which size a site's step, are known only as the run
    goes (:func:`one_task` then says every step fits), and one worker would hold what
    the workers' memory was meant to share."""
    return (plan.device == "cpu" and plan.threads == 1 and not plan.reproject
            and plan.cutoff == 0 and all(b == 1 for b in blocks) and all(fits)
            and not any(bounded))


# -- the sketch ------------------------------------------------------------------------
def reachable_rank(stack: Stack) -> int:
    """The largest rank the product can have at any cut: the product of the bonds
    there, capped by the physical dimensions on either side."""
    right = [1] * (stack.n + 1)
    for j in range(stack.n - 1, -1, -1):
        right[j] = min(right[j + 1] * stack.up(j) * stack.down(j), 2**62)
    return max(min(stack.max_rank(j), right[j]) for j in range(1, stack.n))


def sketch_width(stack: Stack, chi_out: int, oversample: int) -> int:
    """Sketch columns: ``chi_out + oversample``, but no more than the product can
    use (more would add nothing but memory), decided before anything is allocated."""
    want = chi_out + oversample
    width = min(want, reachable_rank(stack))
    if width < want:
        log.info("src: the product's bonds reach at most %d; sketching %d columns instead "
                 "of chi_out + oversample = %d", width, width, want)
    return width


def default_chunk(stack: Stack, sketch: int, slots: int, task: int | None = None,
                  device: str = "cpu") -> int:
    """Columns per block: one block per worker thread (``slots``; per GPU on a GPU
    run: a GPU runs one block's GEMMs at a time, the larger the better), none over
    the config's ``block-size``, and none whose tasks need more than ``task`` bytes
    (:func:`column_bytes`)."""
    per_column = stack.widest_cut * stack.dtype.itemsize
    blocks = max(slots, math.ceil(sketch * per_column / config.get_bytes("block-size")))
    if task is not None:
        blocks = max(blocks, math.ceil(sketch / columns_that_fit(stack, task, device)))
    return math.ceil(sketch / blocks)


def keep_inputs(lazy_bytes: int, memory: int | None) -> bool:
    """Whether lazy inputs are read once and kept for pass 2 (config ``keep-inputs``).

    ``auto`` keeps them when they take at most ``keep-inputs-fraction`` of a
    worker's memory (``memory``; of the device on a GPU run, where they then stay
    between the passes): reading a core costs more than keeping it wherever it
    fits beside the environments, and a larger share would push environments
    out to host memory instead.
    """
    want = config.get_choice("keep-inputs", ("auto", True, False))
    if want != "auto" or not lazy_bytes:
        return bool(want)
    keep = memory is not None and lazy_bytes <= config.get("keep-inputs-fraction") * memory
    log.info("src: lazy inputs of %.3g GB %s (worker memory %s)", lazy_bytes / 1e9,
             "kept for pass 2" if keep else "read in each pass",
             "unknown" if memory is None else f"{memory / 1e9:.3g} GB")
    return keep


# -- memory ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Workers:
    """What the smallest (or busiest) worker of a run has now
    (:func:`src_dask._cluster.worker_facts`): every budget below follows from it.
    Private modules call such an object ``facts``; ``n_workers`` is a count of
    workers, ``addresses`` their addresses, ``w`` the index of one of them and
    ``info`` the scheduler's record of each worker, by address
    (``_cluster.workers_info``)."""

    count: int  # workers (1: Dask's local scheduler in this process)
    threads: int  # tasks one worker runs at once
    rss: int  # resident bytes its process holds already (the interpreter, libraries)
    host_limit: int | None  # its memory limit (None: not limited)
    keep: int | None  # bytes of data Dask keeps in its memory before spilling
    device_limit: int | None = None  # a GPU worker's device memory limit (dask-cuda's)
    device_memory: int | None = None  # its GPU's memory (or what its RMM pool may grow to)
    device_pool: int | None = None  # where its RMM pool starts, if it has one that grows
    room: int | None = None  # what its tasks may use at once below its pause threshold
    available: int | None = None  # memory the machine has available (no limit)
    memory: int | None = None  # its memory for arrays: the GPU's, else its limit or total
    in_client: bool = False  # it runs in the client's process (its limit is all it has)
    disk_free: int | None = None  # free bytes where the workers spill to disk (None: unknown)
    disk_sharing: int = 1  # workers that spill to that file system
    spill_dir: str | None = None  # where (one of them)


# Every task's working set is sized against ``task_bytes``: the memory the tasks that
# run at once on the smallest worker may each use. Dask's workers spill stored data
# (environments) from 70 % of their limit and restart at 95 %, so the tasks get a
# share (config ``memory-fraction``) of what a worker has free before the run. A GPU
# is also bounded by what it keeps: dask-cuda spills stored data only beyond its
# device limit, so the tasks get what the run's data leave of the device
# (:func:`device_task_bytes`).
def task_bytes(facts: Workers, device: str) -> int | None:
    """The memory one task may use (None: not known, so not bounded):
    ``memory-fraction`` of what the smallest worker has free — on a GPU its memory;
    else its memory limit less what its process holds (the interpreter and libraries
    count against the limit; a worker in the client's process has its limit), or
    without a limit the memory available; config ``memory-limit`` overrides it — and
    no more than fits below its pause threshold, shared by its ``threads``."""
    given = config.get("memory-limit")
    room = None
    if given not in (None, "auto"):
        free = int(dask.utils.parse_bytes(given)) if isinstance(given, str) else int(given)
    elif device == "gpu":
        free = facts.device_memory
    elif facts.host_limit:
        free = facts.host_limit if facts.in_client else facts.host_limit - facts.rss
        room = None if facts.in_client else facts.room
    else:
        free = facts.available
    if free is None:
        return None
    share = config.get("memory-fraction") * max(0, free)
    if room is not None:
        share = min(share, room)
    return int(share / max(1, facts.threads))


def device_task_bytes(memory: int, keep: int | None, data: float, threads: int,
                      ahead: int = 0) -> int:
    """The device memory one task may use on a GPU of ``memory`` bytes (or whose RMM
    pool may grow to that) that keeps up to ``keep`` bytes of stored data before
    spilling (dask-cuda's device limit; None: nothing spills) while the run stores
    ``data`` bytes at most and ``ahead`` bytes of inputs read ahead of their use (data
    too, which dask-cuda spills with the rest): what the kept data leave of the
    device, less ``device-headroom`` (the CUDA context, cuBLAS's workspaces, the
    allocator's fragmentation), shared by ``threads`` tasks. At least the headroom's
    worth: a run whose data crowd the device out still runs, its data spilled to host
    memory as its tasks need room (``_oom``) and its tasks halved on out-of-memory
    errors."""
    headroom = config.get("device-headroom") * memory
    kept = data + ahead if keep is None else min(data + ahead, keep)
    return int(max(memory - headroom - kept, headroom) / max(1, threads))


def host_envs(envs: list[float], budget: float) -> int:
    """How many of the first sites' environments go to host memory so that the rest
    (``envs[j]``: bytes of ``C_j``; ``envs[0]`` is 0) fit in ``budget`` bytes of the
    device. Pass 2 uses them from right to left, so the device keeps the last ones,
    used first, and the host those it has time to copy back ahead of use — the order
    in which dask-cuda would spill them (least recently used first), but copied by
    the tasks' threads through pinned memory, not on the worker's event loop, and
    before the device is full, not after. The same one level down: how many of the
    environments in host memory (``envs[:host_envs + 1]``) go on to disk so that the
    rest fit ``budget`` bytes of host memory (``Plan.disk_envs``)."""
    kept = 0.0
    for j in range(len(envs) - 1, 0, -1):
        kept += envs[j]
        if kept > budget:
            return j
    return 0


def _shapes(stack: Stack, site: int, device: str = "cpu") -> list[Any]:
    """Stand-ins (shape, dtype and device) for the padded cores of ``site``, for the
    kernels' planners."""
    from types import SimpleNamespace

    return [SimpleNamespace(shape=s, dtype=stack.dtype, ndim=4, device=device)
            for s in stack.shapes(site)]


def column_bytes(stack: Stack, device: str = "cpu") -> int:
    """What one sketch column costs a task at most, over the sites: pass 1's step
    (its environment row in and out and the contraction's intermediates) and pass 2's
    sketch piece (a row of ``C_j`` and of the sketch)."""
    piece = stack.widest_cut * stack.dtype.itemsize
    return max(sketch_column_bytes(stack, device), piece)


def sketch_column_bytes(stack: Stack, device: str = "cpu") -> int:
    """What one sketch column costs pass 1's step at its largest site
    (``_kernels.sketch_step_bytes``: its environment row in and out and the
    contraction's largest intermediates); the plan sizes blocks and the estimate
    counts pass 1 by it."""
    from . import _kernels as K

    return max(K.sketch_step_bytes(_shapes(stack, j, device)) for j in range(stack.n))


def columns_that_fit(stack: Stack, task: int, device: str = "cpu") -> int:
    """Sketch columns a block may have within ``task`` bytes; a
    :class:`~src_dask.errors.PlanError` when not even one fits."""
    per = column_bytes(stack, device)
    if per > task:
        from .errors import PlanError

        raise PlanError(f"one sketch column needs about {per / 2**20:.1f} MiB in a task, but "
                        f"a task may use {task / 2**20:.1f} MiB ({_remedy()})")
    return max(1, task // per)


def row_bytes(stack: Stack, site: int, rows: int, chunk: int,
              left_rows: int | None = None, device: str = "cpu") -> dict[str, tuple[int, int]]:
    """``(fixed, per row)`` of each kind of pass-2 task at ``site``: the bytes it needs
    besides, and for each of, the rows of ``Z`` it holds. ``project``: projecting them
    (a row of ``Z`` and of ``S``, the contraction's intermediates); ``sketch``:
    sketching them against a block of ``chunk`` columns of ``C_j``; ``update``:
    adding their share to ``S_{j-1}`` (η, ``left_rows × rows × U·D``, and the running
    sum, ``left_rows`` rows; ``rows`` and ``left_rows`` bound the output's bonds right
    and left of the site). Complex products made as three real ones from planes
    (``_kernels.planes``) hold both operands' planes and half their result more."""
    from . import _kernels as K

    q = rows if left_rows is None else left_rows
    item = stack.dtype.itemsize
    ud = stack.up(site) * stack.down(site)
    left = math.prod(stack.left_bonds(site))
    z_row = left * ud * item
    kinds = {"project": (0, K.project_row_bytes(_shapes(stack, site, device))),
             "sketch": (chunk * left * item, z_row + chunk * ud * item),
             "update": (2 * q * left * item + q * rows * ud * item, z_row)}
    if K.planes(stack.dtype, device, chunk):
        kinds["sketch"] = (2 * chunk * left * item, 2 * z_row + (3 * chunk * ud * item) // 2)
    if K.planes(stack.dtype, device, q):
        kinds["update"] = (kinds["update"][0] + (q * left * item) // 2, 2 * z_row)
    return kinds


def kind_bytes(plan: Plan, kind: str, cut: bool = False) -> int | None:
    """The memory one pass-2 task of ``kind`` (see :func:`row_bytes`) may use: the
    tasks' share of a worker, but for the environment sum, which runs alone (the
    next site's tasks need its result), the share of all the worker's threads.
    ``cut``: the sum is made in row blocks (:func:`env_blocks`), one running sum per
    block, and those run side by side, a thread each: one task's share again."""
    if plan.task_bytes is None:
        return None
    return plan.task_bytes * (plan.threads if kind == "update" and not cut else 1)


def z_rows_that_fit(stack: Stack, plan: Plan, site: int) -> int | None:
    """Rows of ``Z`` one task may hold at ``site`` within ``plan.task_bytes`` (None:
    not bounded); a :class:`~src_dask.errors.PlanError` when not even one fits.

    With a cutoff the output's bonds, which size ``Z``, ``S`` and η, are known only
    as the run goes (a rank-2 product written with bonds of 4096 stays rank 2), so
    the bound would cut a small ``Z`` into thousands of empty blocks: not bounded
    (the sketch columns still are)."""
    if plan.task_bytes is None or plan.cutoff > 0:
        return None
    rows = z_rows(stack, plan, site)
    sums = env_blocks(stack, plan, site)
    left_rows = math.ceil((z_rows(stack, plan, site - 1) if site > 0 else 1) / sums)
    kinds = row_bytes(stack, site, rows, plan.chunk, left_rows, plan.device)
    if reprojects(stack, plan, site):  # the sketch and the update project their rows
        _, project = kinds.pop("project")
        kinds = {k: (fixed, per + project) for k, (fixed, per) in kinds.items()}
    fits = {k: (kind_bytes(plan, k, sums > 1) - fixed) // per
            for k, (fixed, per) in kinds.items()}
    worst = min(fits, key=fits.__getitem__)
    if fits[worst] < 1:
        from .errors import PlanError

        fixed, per = kinds[worst]
        budget = kind_bytes(plan, worst, sums > 1)
        what = (f"one row of the projected core needs about {(fixed + per) / 2**20:.1f} MiB"
                if fixed < budget else
                f"pass 2 needs about {fixed / 2**20:.1f} MiB for a block of C_j "
                f"({plan.chunk} sketch columns)")
        raise PlanError(f"site {site}: {what} in a task, but a task may use "
                        f"{budget / 2**20:.1f} MiB ({_remedy()})")
    return int(fits[worst])


def env_blocks(stack: Stack, plan: Plan, site: int) -> int:
    """Row blocks the environment ``S_{site-1}`` is summed in: one where a task may
    hold it whole beside a row of ``Z_site`` (the running sum, its new part and the
    rows of η that make them); else enough that each block takes at most half of one
    task's share (the blocks' sums run side by side, a thread each), the rest left to
    the rows of ``Z`` it adds. Each block then holds the rows of a group of
    ``Z_{site-1}``'s row blocks (``_kernels.block_rows``), each projected from its
    group's alone, so no task ever holds the whole environment, and where ``Z`` is
    projected again, each of its blocks is projected once per sum, not once per
    row block of ``Z_{site-1}``. A :class:`~src_dask.errors.PlanError` when not
    even one row fits. With a cutoff the bonds are known only as the run goes (see
    :func:`z_rows_that_fit`): one."""
    if plan.task_bytes is None or plan.cutoff > 0 or site == 0:
        return 1
    item = stack.dtype.itemsize
    rows, q = z_rows(stack, plan, site), z_rows(stack, plan, site - 1)
    left = math.prod(stack.left_bonds(site))
    ud = stack.up(site) * stack.down(site)
    per_row = (2 * left + rows * ud) * item  # of S_{site-1}: its sum and part, η's row
    if q * per_row + left * ud * item <= kind_bytes(plan, "update"):
        return 1
    budget = kind_bytes(plan, "update", cut=True)  # the blocks' sums run side by side
    fit = budget // 2 // per_row
    if fit < 1:
        from .errors import PlanError

        raise PlanError(f"site {site}: one row of the environment pass 2 sums needs about "
                        f"{2 * per_row / 2**20:.1f} MiB with a row of the projected core "
                        f"({left} + {rows} x {ud} numbers, twice), but a task may use "
                        f"{budget / 2**20:.1f} MiB ({_remedy()})")
    return math.ceil(q / fit)


def reprojects(stack: Stack, plan: Plan, site: int) -> bool:
    """Whether pass 2 projects ``Z_site`` twice instead of keeping it (``Plan.reproject``):
    once in each row block's sketch, once in its share of ``S_{site-1}``. A projection
    costs about as much as the sketch and the update together (half of pass 2's FLOPs
    on the reference stacks), but a ``Z`` that the device cannot keep beside the rest
    would be spilled to host memory and read back at every site, by dask-cuda on the
    worker's event loop, during which no task starts. Where ``S_{site-1}`` is summed in
    blocks (:func:`env_blocks`) each block's sum projects the rows again. Not at site 0
    (``Z_0`` is the output's first core)."""
    return plan.reproject and site > 0


def z_whole_fits(stack: Stack, plan: Plan, site: int) -> bool:
    """Whether one task may hold all of ``Z_j`` with the environment it sums into (else
    the environment is summed block by block); with a cutoff: not known before the
    run (see :func:`z_rows_that_fit`)."""
    if plan.task_bytes is None or plan.cutoff > 0:
        return True
    rows = z_rows(stack, plan, site)
    left_rows = z_rows(stack, plan, site - 1) if site > 0 else 1
    item = stack.dtype.itemsize
    left = math.prod(stack.left_bonds(site))
    z = rows * left * stack.up(site) * stack.down(site) * item
    fixed, _ = row_bytes(stack, site, rows, plan.chunk, left_rows, plan.device)["update"]
    return z + fixed <= kind_bytes(plan, "update")


def check_fits(stack: Stack, plan: Plan) -> None:
    """A :class:`~src_dask.errors.PlanError` now, before any work, where some site's
    pass-2 task cannot fit ``plan.task_bytes`` (see :func:`z_rows_that_fit`)."""
    for site in range(stack.n):
        z_rows_that_fit(stack, plan, site)


def one_task(stack: Stack, plan: Plan, site: int) -> bool:
    """Whether the whole step of ``site`` fits one task: ``C_j``, ``Z_j`` and the next
    site's ``Z`` whole, with the environments and the projection's intermediates
    (with a cutoff: not known before the run, see :func:`z_rows_that_fit`)."""
    if plan.task_bytes is None or plan.cutoff > 0:
        return True
    from . import _kernels as K

    item = stack.dtype.itemsize
    rows = z_rows(stack, plan, site)
    left = math.prod(stack.left_bonds(site))
    ud = stack.up(site) * stack.down(site)
    z = rows * left * ud * item
    z_next = (z_rows(stack, plan, site - 1) * math.prod(stack.left_bonds(site - 1))
              * stack.up(site - 1) * stack.down(site - 1) * item) if site > 0 else 0
    need = (plan.sketch * left * item + z + z_next + 3 * rows * left * item
            + rows * K.project_row_bytes(_shapes(stack, site, plan.device)))
    return need <= plan.task_bytes


def _remedy() -> str:
    return ("give the workers more memory, run fewer threads per worker, or sketch fewer "
            "columns (chi_out + oversample)")


# -- the graph's shape ---------------------------------------------------------------------
def is_ucx(protocol: str | None) -> bool:
    """Whether ``protocol`` (``"ucx"``, or an address such as ``"ucx://host:port"``)
    is Dask's UCX comm."""
    if protocol is None:
        return False
    return _scheme(protocol) in ("ucx", "ucxx")


def _scheme(protocol: str) -> str:
    """The scheme of an address (distributed's ``parse_address``), or ``protocol``
    itself where it is one."""
    from distributed.comm.addressing import parse_address

    return parse_address(protocol)[0] if "://" in protocol else protocol


def input_groups(device: str, n_workers: int) -> int:
    """How many workers prepare their own copy of the inputs: every GPU worker
    (moving a core between GPUs costs more than reading it again), one otherwise
    (each lazy core is read once per pass)."""
    return n_workers if device == "gpu" and n_workers > 1 else 1


def copy_inputs(device: str, addresses: tuple[str, ...]) -> bool:
    """Whether each site's cores are read by one GPU worker and copied to the others
    over the link, rather than read again by each (config ``copy-inputs``; ``auto``:
    where Dask's comm between the workers is UCX — CUDA IPC over NVLink, docs/design.md
    §6.2 — a copy costs milliseconds and halves the reading; over TCP reading again is
    faster)."""
    want = config.get_choice("copy-inputs", ("auto", True, False))
    if device != "gpu" or len(addresses) < 2:
        return False
    return _over_ucx(addresses) if want == "auto" else want


def _over_ucx(addresses: tuple[str, ...]) -> bool:
    """Whether Dask's comm between the workers at ``addresses`` is UCX."""
    return bool(addresses) and all(is_ucx(str(address)) for address in addresses)


def slow_gpu_link(stack: Stack, plan: Plan,
                  addresses: list[str] | tuple[str, ...] | None) -> str | None:
    """A WARNING's text where several GPU workers talk over a slow link (not UCX: TCP
    or TLS, about a hundred times slower between GPUs than UCX with an RMM pool:
    docs/design.md §6.2): pass 2 moves about one environment a site between
    them (docs/design.md §8), so they may run no faster than one GPU. The text gives
    the link's rough rate so the user can weigh the remedy. None otherwise."""
    addresses = tuple(addresses or ())
    if plan.device != "gpu" or len(addresses) < 2 or _over_ucx(addresses):
        return None
    env = plan.sketch * stack.widest_cut * stack.dtype.itemsize
    moved = (len(addresses) - 1) * 2 * env // len(addresses)
    scheme = _scheme(str(addresses[0]))
    return (f"src: {len(addresses)} GPU workers talk {scheme}, about 1 GB/s between GPUs: "
            f"pass 2 moves up to {dask.utils.format_bytes(moved)} a site to each, so they "
            "may run no faster than one GPU. Start them with protocol='ucx' and an RMM "
            "pool (src_dask.cluster() does, with the 'gpu' extra installed)")


def stream_sync(device: str, addresses: list[str] | tuple[str, ...] | None) -> bool:
    """Whether the run has Dask's UCX comm wait for the default stream rather than the
    whole device (config ``ucx-sync``: ``stream``, the default, or ``device``): on
    several GPU workers talking UCX, where every task waits for its own kernels
    (:func:`own_streams`), so nothing Dask sends is still being computed
    (``src_dask.ucx`` says why it matters)."""
    want = config.get_choice("ucx-sync", ("stream", "device"))
    addresses = tuple(addresses or ())
    return want == "stream" and own_streams(device, addresses) and _over_ucx(addresses)


def own_streams(device: str, addresses: tuple[str, ...]) -> bool:
    """Whether each task runs its kernels on a non-blocking stream of its thread and
    waits for them before it ends: on several GPU workers. Dask's UCX comm waits
    before it sends GPU data and after it receives them, on the worker's event loop;
    where that wait is for the default stream (:func:`stream_sync`), kernels on
    non-blocking streams are not waited for, and a task's result is complete when
    it ends, so nothing is sent half made. One GPU keeps tasks that only queue
    kernels (nothing is sent)."""
    return device == "gpu" and len(addresses) > 1


#: What :func:`one_task_beats_graph` assumes of a CPU cluster (the library's policy, not a
#: reading of the machine at hand): the FLOP/s one core makes of the sweep's contractions
#: (single-threaded BLAS, as Dask's nanny starts workers), and how long each dependent
#: task of a graph waits for the scheduler. docs/design.md §3.3 ("A small run is one
#: task") records the measurements they were set from.
CORE_FLOPS = 4e10
ROUND_TRIP_S = 7e-3


def one_task_beats_graph(pass1_flops: float, sites: int, n_workers: int,
                         pass2: Pass2, threads: int, device: str) -> bool:
    """Whether a run is faster as one task than as a graph. On one GPU worker, always:
    the task's own threaded scheduler queues kernels side by side as the graph's
    tasks would, without a scheduler round trip per task (the caller checks that the
    run fits the worker's task budget, as it must without dask-cuda's spilling). A CPU
    run on single-threaded workers whose pass 2 would run on one of them anyway
    (``Pass2.together``: ``FIRST``, ``ONE_WORKER``): where the graph, running pass 1's
    block chains side by side, saves at most ``1 - 1/W`` of pass 1 (at
    :data:`CORE_FLOPS`) less than it pays in scheduler round trips
    (:data:`ROUND_TRIP_S`), one per dependent task of both passes' chains, one a site
    each. Config ``one-task-flops`` decides first, below its bound; at 0 no run is one
    task."""
    if device == "gpu":
        return n_workers == 1
    if threads != 1 or not pass2.together:
        return False
    saved = pass1_flops * (1 - 1 / max(1, n_workers)) / CORE_FLOPS
    return saved < 2 * sites * ROUND_TRIP_S


def one_task_worker(info: dict[str, dict[str, Any]]) -> tuple[str, int]:
    """Where a run that is one task on a cluster runs, and with how many BLAS threads:
    the first worker (``Pass2.FIRST``'s), and the threads of all the workers on its
    host (``info``: ``_cluster.workers_info``), which have nothing else of
    the run to do meanwhile."""
    first = min(info)
    host = info[first].get("host")
    return first, sum(int(worker.get("nthreads") or 1) for worker in info.values()
                      if worker.get("host") == host)


def own_heap(device: str, on_cluster: bool) -> bool:
    """Whether each task keeps glibc's default reuse of freed blocks while it runs
    (``_graph.tasks.with_heap``): CPU tasks on a cluster, whose worker processes Dask's
    nanny starts with ``MALLOC_TRIM_THRESHOLD_`` set, which makes every temporary of a
    contraction a fresh mmap. Not GPU tasks: their large arrays are on the device."""
    return device == "cpu" and on_cluster


def row_owner(block: int, blocks: int, n_workers: int) -> int:
    """The worker (index) that owns row block ``block`` of ``blocks`` in split pass 2:
    consecutive blocks per worker, so each owns one contiguous range of rows."""
    return block * n_workers // blocks


def lookahead(stack: Stack, plan: Plan) -> int:
    """How many sites ahead of their use inputs are read: ``plan.read_ahead`` where the
    plan bounds it (:func:`read_ahead`), else enough that reads overlap each other and
    the contractions, within ``2 * plan.z_block_bytes`` of inputs in flight (2 to 8
    sites)."""
    if plan.read_ahead is not None:
        return plan.read_ahead
    site_bytes = max(sum(math.prod(s) for s in stack.shapes(j)) for j in range(stack.n))
    return max(2, min(8, 2 * plan.z_block_bytes // max(1, site_bytes * stack.dtype.itemsize)))


def read_ahead(stack: Stack, plan: Plan, facts: Workers) -> int | None:
    """Sites a GPU worker with limited host memory reads lazy inputs ahead of their use
    (None: :func:`lookahead`'s default): the reads land in pinned host memory, which
    the pinned pool (``_pinned``) keeps (twice the reads in flight); they may take half of what the
    worker keeps before Dask spills on its event loop (the other half is for the
    environments the plan sends to host memory: ``Plan.disk_envs``): no more sites
    than fit that, at least one (the next)."""
    if plan.device != "gpu" or not facts.host_limit or not stack.input_bytes(lazy=True):
        return None
    site = max(sum(math.prod(s) for s in stack.shapes(j)) for j in range(stack.n))
    keep = facts.keep if facts.keep is not None else facts.host_limit - facts.rss
    room = keep // 2
    fits = room // (2 * site * stack.dtype.itemsize) - 1
    default = lookahead(stack, plan)
    return None if fits >= default else max(1, fits)


def z_blocks(stack: Stack, plan: Plan, site: int) -> int:
    """Row blocks of the projected core ``Z`` at ``site``: enough to keep each within
    ``plan.z_block_bytes`` and each task that holds one within ``plan.task_bytes``
    (:func:`z_rows_that_fit`). (Its rows, the bond right of the site, may come out
    fewer than this bound with a cutoff; blocks then come out smaller or empty.)"""
    rows = z_rows(stack, plan, site)
    nbytes = (math.prod(stack.left_bonds(site)) * rows * stack.up(site) * stack.down(site)
              * stack.dtype.itemsize)
    blocks = max(1, min(rows, math.ceil(nbytes / plan.z_block_bytes)))
    fit = z_rows_that_fit(stack, plan, site)
    return blocks if fit is None else max(blocks, math.ceil(rows / fit))


def z_rows(stack: Stack, plan: Plan, site: int) -> int:
    """An upper bound of the rows of ``Z`` at ``site`` (the output's bond right of it)."""
    return 1 if site == stack.n - 1 else min(plan.sketch, stack.max_rank(site + 1))


def slots(client: Any, device: str) -> int:
    """Blocks that run at once: worker threads on a CPU cluster, GPUs on a GPU
    run, one without a client."""
    if client is None:
        return 1
    if device == "gpu":
        return len(client.nthreads())
    return max(1, sum(client.nthreads().values()))
