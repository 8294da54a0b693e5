"""What a planned run needs — memory per worker, disk, FLOPs, tasks — worked out
from the plan's decisions (:mod:`._plan`) before anything is computed.

:func:`estimate` turns a :class:`~src_dask._plan.SweepPlan` and what the workers
hold now (:class:`Workers`) into a :class:`RunPlan`, the object
:func:`src_dask.plan` returns and :func:`src_dask.src` logs. The memory model
follows the sweep (docs/design.md §9): a worker's peak comes at the turn from
pass 1 to pass 2, when it holds the environments of its blocks of sketch
columns (up to the share Dask keeps before spilling, the rest spilled to disk)
beside the tasks it runs at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import _kernels as K
from . import config
from ._plan import (
    Pass2,
    Plan,
    SweepPlan,
    Workers,
    input_groups,
    reprojects,
    sketch_column_bytes,
    z_rows,
)
from ._stack import Stack


@dataclass(frozen=True)
class RunPlan:
    """What a run of :func:`src_dask.src` will need, decided before any work.

    Bytes are per worker unless named otherwise; ``peak_host`` is the resident
    memory its process is expected to reach (with what it holds already),
    ``peak_device`` the device memory it takes on a GPU run (None on a CPU): what its
    arrays reach, or, in an RMM pool that grows, the pool's size then
    (:func:`pool_size`); ``peak_arrays`` what its arrays reach.
    ``str()`` gives a readable summary.
    """

    product: str  # e.g. "MPO·MPS (ket), 40 sites, bonds 8·16, complex128"
    device: str
    workers: int  # how many (a count: n_workers in the private modules)
    threads: int  # per worker
    chi_out: int
    sketch: int  # sketch columns (chi_out + oversample, capped by the product's rank)
    chunk: int  # sketch columns per block
    blocks: int  # blocks of sketch columns (pass 1's independent chains)
    z_blocks: tuple[int, ...]  # row blocks of each site's projected core in pass 2
    task_bytes: int | None  # the memory one task is sized to (None: not bounded)
    input_bytes: int
    env_bytes: int  # all sketched environments C_1 … C_{n-1}
    store_bytes: int  # disk a run store needs
    flops: dict[str, float]  # per pass: "pass 1", "pass 2", "rounding"
    tasks: int
    peak_host: int
    peak_device: int | None
    peak_arrays: int | None
    spilled: int  # environment bytes a worker is expected to spill (to host or disk)
    to_disk: int = 0  # of which beyond its host memory: to its local directory's disk
    host_limit: int | None = None
    device_limit: int | None = None  # stored data beyond it spills to host (dask-cuda's)
    device_memory: int | None = None  # what its arrays may take: the GPU or its RMM pool
    where: str = ""  # the scheduler's address, or Dask's local scheduler
    host_envs: int = 0  # the environments C_1 … C_h a GPU run keeps in host memory
    host_env_bytes: int = 0  # their bytes (per worker)
    disk_envs: int = 0  # of those, C_1 … C_d written to disk instead (Plan.disk_envs)
    disk_env_bytes: int = 0  # their bytes (per worker)
    reproject: bool = False  # pass 2 projects Z twice instead of keeping it (Plan.reproject)

    @property
    def total_flops(self) -> float:
        return sum(self.flops.values())

    def __str__(self) -> str:
        from ._progress import format_bytes as b

        def limit(x: int | None) -> str:
            return f" (limit {b(x)})" if x else ""

        lines = [
            f"SRC plan: {self.product}",
            f"  chi_out {self.chi_out}, sketch {self.sketch} columns in {self.blocks} "
            f"block{'s' * (self.blocks > 1)} of {self.chunk}; projected cores in up to "
            f"{max(self.z_blocks)} row block{'s' * (max(self.z_blocks) > 1)}",
            f"  on the {self.device.upper()}: {self.workers} worker"
            f"{'s' * (self.workers > 1)} x {self.threads} thread{'s' * (self.threads > 1)}"
            + (f" ({self.where})" if self.where else "")
            + (f", tasks sized to {b(self.task_bytes)}" if self.task_bytes else ""),
            f"  inputs {b(self.input_bytes)}, environments {b(self.env_bytes)}, "
            f"run store {b(self.store_bytes)} of disk"
            + (f"; environments of sites {self.disk_envs + 1}-{self.host_envs} "
               f"({b(self.host_env_bytes)}) in host memory, copied back a site ahead"
               if self.host_envs > self.disk_envs else "")
            + (f"; environments of sites 1-{self.disk_envs} ({b(self.disk_env_bytes)}) "
               "written to the workers' disk, read back a site ahead" if self.disk_envs else "")
            + ("; projected cores made twice, not kept" if self.reproject else ""),
            f"  peak per worker: host {b(self.peak_host)}{limit(self.host_limit)}"
            + (f", device {b(self.peak_device)}{limit(self.device_memory)}"
               + (f" (its RMM pool; arrays {b(self.peak_arrays)})"
                  if self.peak_arrays is not None and self.peak_arrays != self.peak_device
                  else "")
               + (f", data spilled beyond {b(self.device_limit)}" if self.device_limit else "")
               if self.peak_device is not None else "")
            + (f"; spills about {b(self.spilled)}" if self.spilled else "")
            + (f", {b(self.to_disk)} of it to disk" if self.to_disk else ""),
            "  FLOPs: " + ", ".join(f"{k} {v:.3g}" for k, v in self.flops.items())
            + f" (total {self.total_flops:.3g}); {self.tasks} tasks",
        ]
        return "\n".join(lines)


def estimate(stack: Stack, sweep: SweepPlan, facts: Workers, *, store: bool,
             tasks: int, store_bytes: int, product: str, where: str = "") -> RunPlan:
    """The :class:`RunPlan` of ``sweep`` on ``facts``' workers (``store``: with a run store;
    ``tasks``: the graph's task count).

    What a worker holds, over the sweep: at the end of pass 1 the environments of
    its column blocks (pinned round robin), beside pass 1's tasks; at site ``j``
    of pass 2 (right to left) those of sites ``1 … j`` not yet used, ``Z_j``, and
    the step's task making ``Z_{j-1}``. With a store the environments are on disk
    and only a site's are read back at a time. Data beyond what Dask keeps in
    memory (``Workers.keep``; on a GPU, beyond the device limit) is spilled.
    """
    plan = sweep.plan
    item = stack.dtype.itemsize
    inputs = sum(math.prod(s) * item for j in range(stack.n) for s in stack.shapes(j))
    mine = _share(plan, facts.count)
    ahead = inputs_in_flight(stack, sweep.lookahead)
    pass1 = (min(facts.threads, math.ceil(mine * len(plan.blocks)))
             * pass1_task(stack, plan.chunk, plan.device))
    # a site that is one task runs alone; a site cut in row blocks runs them side by side
    tasks_at = [pass1] + [_pass2_running(stack, sweep, j, facts.threads)
                          for j in range(stack.n - 1, -1, -1)]
    # inputs read ahead of their use are stored data too (dask-cuda spills them with
    # the rest beyond its device limit); environments the plan puts in host memory (a
    # GPU run's) are there besides
    on_host = host_held(stack, plan, facts.count) if plan.host_envs else [0.0] * len(tasks_at)
    fetched = sweep.lookahead if sweep.pass2.home and not store else None
    held = [(data + ahead, running, put) for data, running, put in
            zip(data_held(stack, plan, facts.count, store, fetched), tasks_at, on_host,
                strict=True)]
    # pinned host memory: a GPU worker's reads of lazy inputs and environments' way to disk
    reads = pinned_reads(stack, sweep.lookahead, plan.device)
    on_disk = disk_held(stack, plan, facts.count)
    reads += staged_envs(stack, plan, facts.count)
    device_keep = facts.device_limit if plan.device == "gpu" else None
    usable = usable_device(facts) if plan.device == "gpu" else None
    peak_host = peak_device = spilled = to_disk = 0
    for (data, running, put), written in zip(held, on_disk, strict=True):
        here = data if device_keep is None else min(data, device_keep)
        if usable is not None:  # data a task needs room from is spilled (``_oom``)
            here = min(here, max(0, usable - running))
        host = data - here + put if plan.device == "gpu" else data
        kept = host if facts.keep is None else min(host, facts.keep)
        spilled = max(spilled, data - here + host - kept if plan.device == "gpu" else host - kept)
        to_disk = max(to_disk, host - kept + written)
        if plan.device == "gpu":
            peak_device = max(peak_device, here + running)
            peak_host = max(peak_host, facts.rss + kept + reads)
        else:
            peak_host = max(peak_host, facts.rss + kept + running)
    return RunPlan(
        product=product, device=plan.device, workers=facts.count, threads=facts.threads,
        chi_out=plan.chi_out, sketch=plan.sketch, chunk=plan.chunk, blocks=len(plan.blocks),
        z_blocks=sweep.z_blocks, task_bytes=plan.task_bytes, input_bytes=inputs,
        env_bytes=int(sum(_environments(stack, plan, 1.0))), store_bytes=store_bytes,
        flops=flops(stack, plan.sketch, plan.chi_out, plan.round, projected_again(sweep)),
        tasks=tasks,
        peak_host=int(peak_host),
        peak_device=pool_size(int(peak_device), facts) if plan.device == "gpu" else None,
        peak_arrays=int(peak_device) if plan.device == "gpu" else None,
        spilled=int(spilled), to_disk=int(to_disk), host_limit=facts.host_limit,
        device_limit=facts.device_limit, device_memory=usable, where=where,
        host_envs=plan.host_envs, host_env_bytes=int(on_host[0]),
        disk_envs=plan.disk_envs, disk_env_bytes=int(on_disk[0]),
        reproject=any(step.reproject for step in sweep.steps if step))


def pool_size(arrays: int, facts: Workers) -> int:
    """The device memory a GPU worker takes when its arrays reach ``arrays`` bytes: that,
    or where they live in an RMM pool that starts at ``Workers.device_pool`` and may
    grow to ``Workers.device_memory``, the pool's size. RMM grows a pool by half of what
    it may still grow (or by what an allocation needs, if more), and it grows once the
    arrays come within ``device-headroom`` of its size (blocks it cannot place between
    those it holds): the arrays' peak alone undercounts the pool (the memory ladder of
    benchmarks/README.md compares both with RMM's statistics)."""
    start, most = facts.device_pool, facts.device_memory
    if not start or not most or start >= most:
        return arrays
    if arrays + config.get("device-headroom") * most <= start:
        return start
    usable = usable_device(facts) or most
    return int(max(arrays, min(usable, start + max(arrays - start, (most - start) / 2))))


def projected_again(sweep: SweepPlan) -> dict[int, int]:
    """``{site: times Z is projected again}``: once for its environment sum where ``Z``
    is not kept (``Plan.reproject``), once per block where that sum is cut."""
    return {j: sweep.env_sums[j]
            for j, step in enumerate(sweep.steps) if step is not None and step.reproject}


def usable_device(facts: Workers) -> int | None:
    """The device memory a GPU worker's arrays may take: its GPU's, or what its RMM
    pool may grow to, less ``device-headroom``."""
    if not facts.device_memory:
        return None
    return int((1 - config.get("device-headroom")) * facts.device_memory)


def data_held(stack: Stack, plan: Plan, n_workers: int, store: bool,
              fetched: int | None = None) -> list[float]:
    """Bytes of data (results Dask stores, and on a GPU keeps on the device up to its
    limit) the busiest of ``n_workers`` holds over the sweep: at the end of pass 1,
    then at each site of pass 2 from right to left — the environments of its column
    blocks not yet used (with a store, one site's, read back; on a GPU, not those the
    plan puts in host memory, ``Plan.host_envs``, but the copies of the two sites
    fetched back ahead of use), the site's projected core ``Z`` (its share of the
    rows where pass 2 is split over the workers; where it is projected again instead,
    ``Plan.reproject``, the environment ``S_j`` it is projected from), and lazy inputs
    the plan keeps for pass 2 (every GPU worker keeps its own copy).

    ``fetched``: where all of pass 2 runs on the first worker (``Pass2.home``), the
    sites ahead of use that it fetches the other workers' blocks of ``C_j`` (the
    sweep's lookahead): at site ``j`` it holds their copies of sites ``j - fetched …
    j`` beside its own blocks, while the others still hold theirs."""
    env = environments(stack, plan, n_workers)
    h = plan.host_envs
    z_share = 1 / n_workers if Pass2.of_run(plan.device, n_workers).split else 1.0
    kept = 0.0
    if plan.keep_inputs:
        kept = (stack.input_bytes(lazy=True) * input_groups(plan.device, n_workers)
                / max(1, n_workers))
    held = [(max(env) if store else sum(env[h + 1:])) + kept]
    others = _others_blocks(stack, plan, n_workers) if fetched is not None else None
    for j in range(stack.n - 1, -1, -1):
        if store:
            envs = env[j]
        else:  # those of sites h+1 … j kept, and sites j, j-1 fetched back from the host
            envs = sum(env[h + 1:j + 1]) + sum(env[i] for i in (j, j - 1) if 0 < i <= h)
        z = _s_bytes(stack, plan, j) if reprojects(stack, plan, j) else _z_bytes(stack, plan, j)
        held.append(envs + z * z_share + kept + _fetched(others, h, j, fetched))
    return held


def _others_blocks(stack: Stack, plan: Plan, n_workers: int) -> list[float]:
    """Bytes of each site's ``C_j`` that the first of ``n_workers`` does not make (the
    other workers' blocks): what it fetches where it runs all of pass 2."""
    rest = 1 - _share(plan, n_workers) if n_workers > 1 else 0.0
    return [c * rest for c in _environments(stack, plan, 1.0)]


def _fetched(others: list[float] | None, h: int, j: int, ahead: int | None) -> float:
    """Bytes of the other workers' blocks of ``C_i`` (``others``) the first worker holds
    at site ``j`` of pass 2 where it runs all of it (``data_held``'s ``fetched``): sites
    ``j - ahead … j``; of those pass 1 left in host memory (the first ``h``,
    ``Plan.host_envs``), the two sites ``fetch`` copies back at a time (``j - 1``,
    ``j``)."""
    if others is None or ahead is None:
        return 0.0
    return sum(others[i] for i in range(max(1, j - ahead), j + 1) if i > h or i >= j - 1)


def host_held(stack: Stack, plan: Plan, n_workers: int) -> list[float]:
    """Bytes of the environments the busiest worker holds in host memory because the
    plan puts them there (``Plan.host_envs``, but not those it writes to disk,
    ``Plan.disk_envs``), at the same points as :func:`data_held`: all of them at the
    end of pass 1, then those not yet used."""
    return _held(environments(stack, plan, n_workers), stack.n, plan.disk_envs, plan.host_envs)


def disk_held(stack: Stack, plan: Plan, n_workers: int) -> list[float]:
    """Bytes of the environments the busiest worker has written to disk
    (``Plan.disk_envs``), at the same points as :func:`data_held`."""
    return _held(environments(stack, plan, n_workers), stack.n, 0, plan.disk_envs)


def _held(env: list[float], n: int, after: int, upto: int) -> list[float]:
    """Bytes of the environments of sites ``after+1 … upto`` not yet used, at the end of
    pass 1 and at each site of pass 2 (right to left)."""
    return [sum(env[after + 1:upto + 1])] + [sum(env[after + 1:min(j, upto) + 1])
                                            for j in range(n - 1, -1, -1)]


def staged_envs(stack: Stack, plan: Plan, n_workers: int) -> float:
    """Host bytes of the pinned buffers environments pass through on their way to disk
    and back (``Plan.disk_envs``): a block of ``C_j`` per task running at once, twice
    (the pinned pool, ``_pinned``, keeps what the writes of pass 1 leave for the reads
    of pass 2)."""
    if not plan.disk_envs:
        return 0.0
    share = _share(plan, n_workers) * plan.sketch / plan.chunk  # blocks the worker holds
    block = max(environments(stack, plan, n_workers)[1:plan.disk_envs + 1]) / max(1.0, share)
    return 2.0 * plan.threads * block


def environments(stack: Stack, plan: Plan, n_workers: int) -> list[float]:
    """Bytes of each site's sketched environment ``C_j`` the busiest of ``n_workers``
    holds (its column blocks; none at site 0)."""
    return _environments(stack, plan, _share(plan, n_workers))


def _share(plan: Plan, n_workers: int) -> float:
    """The busiest worker's share of the sketch columns (blocks are pinned round robin)."""
    return min(1.0, math.ceil(len(plan.blocks) / max(1, n_workers)) * plan.chunk / plan.sketch)


def _environments(stack: Stack, plan: Plan, share: float) -> list[float]:
    """Bytes of each site's sketched environment ``C_j`` (none at site 0), ``share``
    of its columns."""
    item = stack.dtype.itemsize
    return [0.0] + [plan.sketch * math.prod(stack.left_bonds(j)) * item * share
                    for j in range(1, stack.n)]


def pass1_task(stack: Stack, chunk: int, device: str = "cpu") -> int:
    """Bytes of pass 1's largest task: a block of ``chunk`` columns through one site,
    as the plan sizes it (:func:`~src_dask._plan.sketch_column_bytes`)."""
    return chunk * sketch_column_bytes(stack, device)


def _pass2_at_once(sweep: SweepPlan, j: int, threads: int) -> int:
    """Pass-2 tasks of site ``j`` a worker runs at once: one where the site is one task
    (or its row blocks are, at most, one), else its threads."""
    if sweep.pass2.together and sweep.z_blocks[j] == 1:
        return 1
    return min(threads, sweep.z_blocks[j]) if sweep.pass2.together else threads


def _pass2_parts(stack: Stack, sweep: SweepPlan, j: int) -> tuple[int, int, int]:
    """Elements a pass-2 task of site ``j`` holds besides the data it reads, by kind: a
    row block of ``Z`` projected (its rows of ``S`` in, the contraction's temporaries
    and result), its sketch piece, the environment update (η and ``S_{j-1}``, or the
    rows of it that one running sum holds where it is summed in blocks)."""
    plan = sweep.plan
    rows = z_rows(stack, plan, j)
    block = math.ceil(rows / sweep.z_blocks[j])
    q = z_rows(stack, plan, j - 1) if j > 0 else 1
    if sweep.env_sums:  # S_{j-1} summed in blocks
        q = math.ceil(q / sweep.env_sums[j])
    ud = stack.up(j) * stack.down(j)
    left = math.prod(stack.left_bonds(j))
    right = math.prod(s[1] for s in stack.shapes(j))
    three = K.three_real(stack.dtype, plan.device)
    project = (K.contraction_elements(_project_eq(stack), _project_shapes(stack, j, block),
                                      three)
               + block * right)
    sketch, update = plan.chunk * block * ud, q * rows * ud + 2 * q * left
    # the planes of both operands and half the product more (_kernels.matmul)
    if K.planes(stack.dtype, plan.device, plan.chunk):
        sketch += K.three_real_elements(plan.chunk * left, block * left * ud, sketch) - sketch
    if K.planes(stack.dtype, plan.device, q):
        update += K.three_real_elements(q * block * ud, block * left * ud, q * left) - q * left
    return project, sketch, update


def _pass2_task(stack: Stack, sweep: SweepPlan, j: int) -> int:
    """Bytes of the largest pass-2 task of site ``j`` (see :func:`_pass2_parts`)."""
    return max(_pass2_parts(stack, sweep, j)) * stack.dtype.itemsize


def _pass2_running(stack: Stack, sweep: SweepPlan, j: int, threads: int) -> int:
    """Bytes of the pass-2 tasks of site ``j`` a worker runs at once (see
    :func:`_pass2_parts`). Where ``Z_j`` is projected again (``Plan.reproject``) each
    task projects its row block first: the sketches run side by side, the environment
    sum, a chain through the blocks, alone."""
    at_once = _pass2_at_once(sweep, j, threads)
    step = sweep.steps[j] if j < len(sweep.steps) else None
    if step is None or not step.reproject:
        return at_once * _pass2_task(stack, sweep, j)
    project, sketch, update = _pass2_parts(stack, sweep, j)
    return max(at_once * (project + sketch), project + update) * stack.dtype.itemsize


def _s_bytes(stack: Stack, plan: Plan, j: int) -> int:
    """Bytes of the environment ``S_j`` that ``Z_j`` is projected from (at most)."""
    right = math.prod(s[1] for s in stack.shapes(j))
    return z_rows(stack, plan, j) * right * stack.dtype.itemsize


def _z_bytes(stack: Stack, plan: Plan, j: int) -> int:
    """Bytes of the projected core ``Z_j`` (at most)."""
    return (z_rows(stack, plan, j) * math.prod(stack.left_bonds(j)) * stack.up(j)
            * stack.down(j) * stack.dtype.itemsize)


def pinned_reads(stack: Stack, lookahead: int, device: str) -> int:
    """Host bytes of a GPU worker's reads of lazy inputs ``lookahead`` sites ahead of
    use: they land in pinned memory, and the pinned pool (``_pinned``) keeps the blocks they
    leave, so twice the reads in flight (the memory ladder of benchmarks/README.md
    compares the planned host peak with the workers' RSS)."""
    if device != "gpu" or not stack.input_bytes(lazy=True):
        return 0
    return 2 * inputs_in_flight(stack, lookahead)


def inputs_in_flight(stack: Stack, lookahead: int) -> int:
    """Input cores read ahead of their use (``lookahead`` sites, and the site in use)."""
    item = stack.dtype.itemsize
    site = max(sum(math.prod(s) for s in stack.shapes(j)) for j in range(stack.n)) * item
    return (lookahead + 1) * site


# -- FLOPs ------------------------------------------------------------------------------
def flops(stack: Stack, sketch: int, chi_out: int, rounding: bool,
          again: dict[int, int] | None = None) -> dict[str, float]:
    """FLOPs of each pass as the kernels execute them (their contraction paths; a
    complex multiply-add is 8 flop, a real one 2; QRs and SVDs counted as
    ``O(m n^2)`` with the constants of Householder QR and of an SVD); ``again``:
    ``{site: times Z is projected again}`` (``Plan.reproject``)."""
    again = again or {}
    mul = 8 if stack.dtype.kind == "c" else 2
    p1 = p2 = rnd = 0.0
    for j in range(stack.n - 1):  # pass 1: C_j -> C_{j+1} for every column
        p1 += _path_madds(K._sketch_step_eq(len(stack.factors)),
                          _sketch_shapes(stack, j, sketch))
    for j in range(stack.n):
        rows = z_rows(stack, _Width(sketch), j)
        left = math.prod(stack.left_bonds(j))
        ud = stack.up(j) * stack.down(j)
        p2 += _project_madds(stack, j, rows) * (1 + again.get(j, 0))
        if j > 0:
            q = z_rows(stack, _Width(sketch), j - 1)
            p2 += sketch * left * rows * ud  # sketch M = C_j Z_j
            p2 += q * rows * ud * left  # S_{j-1} = conj(η) Z_j
            p2 += rows * ud * q * q  # Householder QR of the (rows·ud) x q sketch
        if rounding and j < stack.n - 1:  # SVD of the (left·ud) x right core
            m = (min(chi_out, z_rows(stack, _Width(sketch), j - 1)) if j else 1) * ud
            r = min(rows, m)
            rnd += 2 * m * r * r + 11 * r**3  # Golub & Van Loan's R-SVD, in multiply-adds
    return {"pass 1": p1 * mul, "pass 2": p2 * mul, **({"rounding": rnd * mul} if rounding else {})}


@dataclass(frozen=True)
class _Width:  # a stand-in plan for z_rows: only the sketch width matters
    sketch: int


def _sketch_shapes(stack: Stack, j: int, sketch: int) -> tuple[tuple[int, ...], ...]:
    shapes = stack.shapes(j)
    return ((sketch,) + tuple(s[0] for s in shapes), (sketch, shapes[0][2], shapes[-1][3]),
            *(tuple(s) for s in shapes))


def _project_eq(stack: Stack) -> str:
    return K.project_eq(len(stack.factors))


def _project_shapes(stack: Stack, j: int, rows: int) -> tuple[tuple[int, ...], ...]:
    shapes = stack.shapes(j)
    return (*(tuple(s) for s in shapes), (rows,) + tuple(s[1] for s in shapes))


def _project_madds(stack: Stack, j: int, rows: int) -> float:
    return _path_madds(_project_eq(stack), _project_shapes(stack, j, rows))


def _path_madds(eq: str, shapes: tuple[tuple[int, ...], ...]) -> float:
    """Multiply-adds of the pairwise GEMMs the kernels run for ``eq``."""
    steps, _ = K._plan(eq, tuple(tuple(s) for s in shapes))
    total = 0.0
    for _, how, spec in steps:
        if how == "matmul":
            nb, nfa, nc = spec[4]
            total += nb * nfa * nc * spec[5][2]
    return total
