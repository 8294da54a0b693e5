"""The public entry points: ``src``, ``apply``, ``compress`` and ``plan``.

``src`` checks its options, brings the factors to one normal form
(:mod:`._stack`), asks the plan (:mod:`._plan`) for every size, opens the run
store when there is one (:mod:`._runstore`), and computes the graph
(:mod:`._graph`) on the client or Dask's local scheduler.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import ipaddress
import logging
import math
import numbers
import os
import time
from collections.abc import Iterator
from functools import partial
from typing import Any, NamedTuple, TextIO

import dask
import dask.optimization
import dask.utils

from . import (
    _arraylike,
    _estimate,
    _graph,
    _kernels,
    _paths,
    _plan,
    _progress,
    _random,
    _runstore,
    _shared,
    _transfer,
    config,
)
from ._cluster import choose_device, worker_facts, workers_info
from ._estimate import RunPlan
from ._runstore import OpenRun, Progress
from ._stack import Stack, in_graph, make_stack
from ._transfer import is_cupy
from .trains import RunInfo, TensorTrain, as_train
from .ucx import ucx_waits_for_default_stream

log = logging.getLogger("src_dask")


def src(*trains: Any, chi_out: int, oversample: int | str = 0, cutoff: float = 0.0,
        dtype: Any = None, seed: int | None = None, chunk: int | None = None,
        client: Any = None, store: str | os.PathLike | None = None,
        overwrite: bool = False, progress: bool | TextIO = False,
        performance_report: str | os.PathLike | None = None,
        persist: bool = False) -> TensorTrain:
    """Compress the product ``trains[0]·trains[1]·…`` to bond dimension ``chi_out``.

    Successive randomized compression (Camaño, Epperly & Tropp, 2025) as one Dask
    task graph, of MPO·MPS, MPO·MPO, MPO^k·MPS, a bra MPS·MPO^k or one train.

    Parameters
    ----------
    *trains
        The factors, leftmost first: sequences of per-site arrays in quimb's
        layouts (NumPy, Dask or Zarr), quimb MPS/MPO objects or TensorTrains.
    chi_out
        Bond dimension of the result.
    oversample
        Extra sketch columns ``p >= 0``, or ``"auto"`` for ``max(ceil(chi_out/2), 10)``.
        With ``p > 0`` the result is rounded exactly to ``chi_out`` by an SVD
        sweep; this brings the error close to the optimal truncation.
    cutoff
        Relative singular-value threshold in ``[0, 1)``: directions below
        ``cutoff * sigma_max`` are dropped (in the QR, or in the rounding when
        oversampling).
    dtype
        Working and output dtype (float32, float64, complex64, complex128);
        promoted from the inputs by default.
    seed
        Seed of the Gaussian sketch. The result depends on it alone, not on
        ``chunk`` nor on the number of workers.
    chunk
        Sketch columns per block, the unit of parallelism and of memory.
    client
        A ``distributed.Client``; by default the current client, else Dask's
        local scheduler (threads, unless ``dask.config`` says otherwise).
    store
        A run directory (Zarr) for the environments, the output and the run's
        progress: memory is then bounded by disk, and calling ``src`` again
        with the same inputs, options and store resumes an interrupted run
        (or returns the finished one). Workers must be able to reach the path.
    overwrite
        Replace a ``store`` that holds a run of other inputs or options (else an
        error); only a run store is ever replaced (docs/safety.md).
    progress
        A progress bar by pass and site: ``True`` for stderr (a widget in a
        Jupyter notebook), or a text stream. The result is the same either way.
    performance_report
        Path of an HTML file for Dask's performance report of the run (task
        stream, worker profiles, bandwidth); needs a distributed ``client``.
    persist
        With a distributed ``client``: the result is a train of Dask arrays over
        cores kept in the workers' memory, used where it is by the next call (a
        time-evolution loop, ``apply`` then ``compress``); ``to_numpy()`` brings
        it home. Ignored without a client and with ``store``.

    Returns
    -------
    TensorTrain
        An MPS (if a factor is an MPS) or an MPO, in quimb's layouts: NumPy
        arrays (CuPy where every input is CuPy and no client is used; Dask arrays
        with ``store`` or ``persist``). Right-canonical without oversampling (the
        norm in site 0), left-canonical after rounding (in the last site).
    """
    stack, plan, client, store, seed, extra, facts = _prepare(
        trains, chi_out, oversample, cutoff, dtype, seed, chunk, client, store)
    progress = _progress.check_progress(progress)
    performance_report = _progress.check_report(performance_report, client)
    quimb_ids = next((t._quimb for t in _quimb_inputs(trains, stack)), None)
    if store is None:
        seed = _random.draw_seed() if seed is None else seed  # drawn here: y.seed says it
        log.info("src: seed %d", seed)
        return _run(stack, dataclasses.replace(plan, key=_random.seed_key(seed)), client,
                    facts, progress, performance_report, persist=persist,
                    info=RunInfo(seed=seed, quimb_ids=quimb_ids), chunk_given=chunk is not None)
    asked = {"chi_out": chi_out, "oversample": extra, "cutoff": plan.cutoff,
             "dtype": stack.dtype.name, "seed": seed}
    return _run_in_store(stack, plan, store, asked, overwrite, client, facts, progress,
                         performance_report, quimb_ids)


def _quimb_inputs(trains: tuple[Any, ...], stack: Stack) -> list[TensorTrain]:
    """The inputs that came as quimb objects (their index and tag names), the result's
    own kind first: an MPS result takes an MPS's names."""
    given = [f.train for f in stack.factors if f.train._quimb]
    return sorted(given, key=lambda t: t.kind != stack.kind)


def plan(*trains: Any, chi_out: int, oversample: int | str = 0, cutoff: float = 0.0,
         dtype: Any = None, seed: int | None = None, chunk: int | None = None,
         client: Any = None, store: str | os.PathLike | None = None,
         overwrite: bool = False, progress: bool | TextIO = False,
         performance_report: str | os.PathLike | None = None,
         persist: bool = False) -> RunPlan:
    """What :func:`src` with the same arguments would do and need, without doing it.

    Nothing is computed and nothing is written: the result says the per-worker
    peak memory (host, and device on a GPU run), the bytes of the environments,
    the disk a ``store`` needs, the FLOPs of each pass, the number of tasks and
    the chosen ``chunk`` and blocks; ``print`` it for a summary. A problem that
    cannot run is refused as :func:`src` refuses it, before any work: a
    :class:`~src_dask.errors.PlanError` (a ``MemoryError``) when one sketch
    column or one environment sum does not fit a worker, an ``OSError`` when
    the store does not fit its disk.
    """
    stack, p, client, store, _, _, facts = _prepare(
        trains, chi_out, oversample, cutoff, dtype, seed, chunk, client, store)
    _progress.check_progress(progress)
    _progress.check_report(performance_report, client)
    if store is not None:
        _paths.check_space(store, _runstore.planned_bytes(stack, p.sketch), "the run store")
    addresses = _addresses(client)
    graph = _graph.build(stack, p, addresses)
    return _estimate_of(stack, p, client, facts, store is not None, _graph.task_count(graph))


def _prepare(trains: tuple[Any, ...], chi_out: Any, oversample: Any, cutoff: Any, dtype: Any,
             seed: Any, chunk: Any, client: Any, store: Any) -> _Call:
    """The checked options of :func:`src` and :func:`plan`, and the plan; its key is
    set once the seed is known."""
    chi_out = _positive_int(chi_out, "chi_out")
    extra, cutoff = _oversample(oversample, chi_out), _cutoff(cutoff)
    if seed is not None and (not _is_int(seed) or seed < 0):
        raise ValueError(f"seed: expected None or a non-negative int, got {seed!r}")
    seed = None if seed is None else int(seed)  # NumPy integers too
    chunk = None if chunk is None else _positive_int(chunk, "chunk")
    client = _client(client)
    store = None if store is None else _runstore.check_path(store)
    stack = make_stack(trains, dtype)
    plan, facts = _plan_for(stack, chi_out, extra, cutoff, chunk, client, store is not None)
    _check_spill_room(stack, plan, client, facts, store is not None)
    return _Call(stack, plan, client, store, seed, extra, facts)


def _check_spill_room(stack: Stack, plan: _plan.Plan, client: Any, facts: _plan.Workers,
                      store: bool) -> None:
    """An ``OSError`` (ENOSPC) before any work where what the workers would spill to
    disk beyond their memory (the plan's estimate, per worker, times the workers
    that spill to the same file system) does not fit what is free there. Workers that
    keep all their data in memory (no limit) spill nothing: not asked."""
    if facts.disk_free is None or facts.keep is None:
        return
    addresses = _addresses(client)
    sweep = _plan.SweepPlan.decide(stack, plan, addresses)
    need = _estimate.estimate(stack, sweep, facts, store=store, tasks=0, store_bytes=0,
                              product="").to_disk * facts.disk_sharing
    if need > facts.disk_free:
        b = dask.utils.format_bytes
        raise OSError(errno.ENOSPC, f"{facts.spill_dir}: the workers would spill about "
                      f"{b(need)} of environments to disk there (beyond their memory), but "
                      f"only {b(facts.disk_free)} are free; give them more memory, a "
                      "local_directory on a larger disk, or a run store (store=) on one")


def _addresses(client: Any) -> list[str] | None:
    """The addresses of ``client``'s workers, in order (None without a client)."""
    return None if client is None else sorted(workers_info(client))


class _Call(NamedTuple):
    """A checked call of :func:`src` or :func:`plan`."""

    stack: Stack
    plan: _plan.Plan
    client: Any
    store: str | None
    seed: int | None
    oversample: int
    facts: _plan.Workers  # what the workers have, asked once a call


def _estimate_of(stack: Stack, plan: _plan.Plan, client: Any, facts: _plan.Workers,
                 store: bool, tasks: int) -> RunPlan:
    """The :class:`RunPlan` of a run of ``tasks`` tasks."""
    addresses = _addresses(client)
    sweep = _plan.SweepPlan.decide(stack, plan, addresses)
    return _estimate.estimate(
        stack, sweep, facts, store=store,
        tasks=tasks, store_bytes=_runstore.planned_bytes(stack, plan.sketch),
        product=stack.describe(),
        where="Dask's local scheduler" if client is None else f"at {client.scheduler.address}")


def _plan_for(stack: Stack, chi_out: int, extra: int, cutoff: float, chunk: int | None,
              client: Any, store: bool = False) -> tuple[_plan.Plan, _plan.Workers]:
    """The run's plan, but for the seed's key (set once the seed is known), and the
    workers' facts it follows from."""
    inputs = [c for f in stack.factors for c in f.train]
    device = choose_device(client, inputs)
    # CuPy in, CuPy out (as quimb does), unless a client gets the result
    to_host = client is not None or not all(map(is_cupy, inputs))
    facts = worker_facts(client, device)
    return decide_plan(stack, chi_out, extra, cutoff, chunk, device=device, facts=facts,
                       slots=_plan.slots(client, device), to_host=to_host,
                       store=store), facts


def decide_plan(stack: Stack, chi_out: int, extra: int, cutoff: float, chunk: int | None, *,
                device: str, facts: _plan.Workers, slots: int, to_host: bool = True,
                store: bool = False) -> _plan.Plan:
    """The plan for ``facts``, what the smallest worker has (:class:`_plan.Workers`,
    from :func:`_cluster.worker_facts`, or described by hand, as
    :func:`src_dask.diagnostics.described_plan` does for a machine one does not
    have); ``slots``: blocks of sketch columns that run at once. On a GPU the tasks
    get what the run's data leave of the device (``_plan.device_task_bytes``)."""
    sketch = _plan.sketch_width(stack, chi_out, extra)
    keep = _plan.keep_inputs(stack.input_bytes(lazy=True), facts.memory)

    def sized(task: int | None, decided: _plan.Plan | None = None) -> _plan.Plan:
        """The plan with tasks of ``task`` bytes, and what ``decided`` decided of where
        the data go (``host_envs``, ``disk_envs``, ``reproject``)."""
        cols = min(chunk or _plan.default_chunk(stack, sketch, slots, task, device), sketch)
        plan = _plan.Plan(sketch=sketch, chunk=cols, chi_out=min(chi_out, sketch),
                          cutoff=cutoff, key=0, round=extra > 0, device=device,
                          to_host=to_host, keep_inputs=keep, task_bytes=task,
                          threads=facts.threads)
        ahead = _plan.read_ahead(stack, plan, facts)
        if decided is not None:
            plan = dataclasses.replace(plan, host_envs=decided.host_envs,
                                       disk_envs=decided.disk_envs,
                                       reproject=decided.reproject)
            if decided.read_ahead is not None:
                ahead = min(ahead or decided.read_ahead, decided.read_ahead)
        return dataclasses.replace(plan, read_ahead=ahead)

    plan = sized(_plan.task_bytes(facts, device))
    if device == "cpu" and not store:
        disk = _cpu_disk_envs(stack, plan, facts)
        plan = dataclasses.replace(plan, host_envs=disk, disk_envs=disk)
    if device == "gpu" and facts.device_memory and plan.task_bytes is not None:
        # the data's bytes hardly depend on the tasks' size (only through the columns'
        # blocks), so those of the first sizing bound the second
        ahead = _estimate.inputs_in_flight(stack, _plan.lookahead(stack, plan))
        if _reproject(stack, plan, facts, ahead, store):
            plan = dataclasses.replace(plan, reproject=True)
        # sized as if the device kept all the data it may (up to its limit): the room
        # the environments sent to host memory leave is margin for what the memory
        # model misses (the pool's fragmentation, the libraries' workspaces)
        data = max(_estimate.data_held(stack, plan, facts.count, store))
        if not store:  # environments beyond what the device keeps go to host memory,
            # and those beyond what the host keeps on to disk
            plan = dataclasses.replace(plan, host_envs=_host_envs(stack, plan, facts, ahead))
            plan = dataclasses.replace(plan, disk_envs=_disk_envs(stack, plan, facts))
            if plan.disk_envs and _plan.lookahead(stack, plan) > _ENVS_FIRST:
                # inputs read fewer sites ahead leave host memory to environments
                plan = dataclasses.replace(plan, read_ahead=_ENVS_FIRST)
                plan = dataclasses.replace(plan, disk_envs=_disk_envs(stack, plan, facts))
        task = _plan.device_task_bytes(facts.device_memory, facts.device_limit, data,
                                       facts.threads, ahead)
        if task < plan.task_bytes:
            try:
                smaller = sized(task, plan)
                _plan.check_fits(stack, smaller)  # refused before a store or a graph is made
                return smaller
            except MemoryError:  # the data leave too little: the tasks keep their share
                log.info("src: the data kept on the device (%.3g GB) leave %.3g GB a task, "
                         "less than pass 2 needs; tasks sized to %.3g GB (expect spilling)",
                         min(data, facts.device_limit or data) / 1e9, task / 1e9,
                         plan.task_bytes / 1e9)
    _plan.check_fits(stack, plan)  # refused before a store or a graph is made
    return plan


def _reproject(stack: Stack, plan: _plan.Plan, facts: _plan.Workers, ahead: int,
               store: bool) -> bool:
    """Whether a GPU run projects each ``Z_j`` twice instead of keeping it
    (``Plan.reproject``): where the device would not keep ``Z_j`` beside the rest of the
    run's data even with every environment in host memory (or in the store), so
    dask-cuda would spill it to host memory and read it back at every site. Not for
    pass 2 split over several GPUs (each holds its share of ``Z``)."""
    if _plan.Pass2.of_run(plan.device, facts.count).split:
        return False
    keep = facts.device_limit or _estimate.usable_device(facts) or 0
    least = dataclasses.replace(plan, host_envs=0 if store else stack.n - 1)
    return max(_estimate.data_held(stack, least, facts.count, store)) + ahead > keep


def _host_envs(stack: Stack, plan: _plan.Plan, facts: _plan.Workers, ahead: int) -> int:
    """How many of the first sites' environments a GPU run keeps in host memory: those
    the device would not keep beside the rest of the run's data (what dask-cuda keeps
    before spilling, or the usable device)."""
    keep = facts.device_limit or _estimate.usable_device(facts) or 0
    everything = dataclasses.replace(plan, host_envs=stack.n - 1)
    other = max(_estimate.data_held(stack, everything, facts.count, False)) + ahead
    return _plan.host_envs(_estimate.environments(stack, plan, facts.count), keep - other)


#: Sites ahead of use a GPU worker reads inputs where environments go to its disk: the
#: pinned memory of reads further ahead would send more of them there.
_ENVS_FIRST = 2


def _disk_envs(stack: Stack, plan: _plan.Plan, facts: _plan.Workers) -> int:
    """How many of the environments a GPU run sends to host memory go on to disk: those
    beyond what the worker keeps in host memory before Dask would spill them (on its
    event loop), less the pinned buffers of the inputs read ahead of use
    (``_plan.read_ahead``) and of the environments' own way to disk and back."""
    if not plan.host_envs or facts.keep is None or _fetched_everywhere(plan, facts):
        return 0
    envs = _estimate.environments(stack, plan, facts.count)[:plan.host_envs + 1]
    staged = _estimate.staged_envs(stack, dataclasses.replace(plan, disk_envs=plan.host_envs),
                                   facts.count)
    budget = (facts.keep - staged
              - _estimate.pinned_reads(stack, _plan.lookahead(stack, plan), plan.device))
    return _plan.host_envs(envs, budget)


def _cpu_disk_envs(stack: Stack, plan: _plan.Plan, facts: _plan.Workers) -> int:
    """How many of the first sites' environments a CPU run writes to its workers' disk
    (``Plan.disk_envs``): those beyond what a worker keeps in memory before Dask
    would spill (``Workers.keep``), beside the rest of the run's data. Dask spills
    them too, but its memory monitor looks only every so often (100 ms by default),
    and a small worker's tasks make more data between two looks than its margin from
    the spill threshold to the restart; the tasks that made the data write them as
    they go, so the worker never holds more than it keeps."""
    if facts.keep is None or _fetched_everywhere(plan, facts):
        return 0
    everything = dataclasses.replace(plan, host_envs=stack.n - 1, disk_envs=stack.n - 1)
    other = (max(_estimate.data_held(stack, everything, facts.count, False))
             + _estimate.staged_envs(stack, everything, facts.count))
    return _plan.host_envs(_estimate.environments(stack, plan, facts.count),
                           facts.keep - other)


def _fetched_everywhere(plan: _plan.Plan, facts: _plan.Workers) -> bool:
    """Whether pass 2 is split by rows over the workers, each fetching every block of
    ``C_j``: a file is read once (and removed), so none goes to disk."""
    return _plan.Pass2.of_run(plan.device, facts.count).split


def _run_in_store(stack: Stack, plan: _plan.Plan, path: str, asked: dict[str, Any],
                  overwrite: bool, client: Any, facts: _plan.Workers,
                  progress: bool | TextIO, performance_report: str | None,
                  quimb_ids: dict[str, str] | None = None) -> TensorTrain:
    """A run into the store at ``path``: resumed, or returned when finished; the
    result is read from the store, with the seed the store's run uses. ``asked``: the
    options as given (with the inputs, they identify the run); ``quimb_ids``: the
    quimb names the result keeps (:class:`~src_dask.trains.RunInfo`)."""
    dirs: dict[str, str] = {}
    for i, f in enumerate(stack.factors):
        dirs.update(_paths.train_dirs(f.train, f"input {f.train.name or i}"))
    _paths.check_apart(path, dirs, f"store {path}")
    run, resume, seed, chunk = OpenRun.prepare(
        path, stack, {**asked, "inputs": _fingerprint(stack)}, seed=asked["seed"],
        sketch=plan.sketch, chunk=plan.chunk, overwrite=overwrite)
    try:
        if run.is_complete():
            log.info("src: %s holds the finished run (seed %d); not recomputing", run.path,
                     seed)
            return run.result(stack.kind, quimb_ids)
        log.info("src: seed %d", seed)
        plan = dataclasses.replace(plan, chunk=chunk, key=_random.seed_key(seed), to_host=True)
        _run(stack, plan, client, facts, progress, performance_report, run, resume)
        run.mark_complete()
        return run.result(stack.kind, quimb_ids)
    finally:
        run.release()


def _run(stack: Stack, plan: _plan.Plan, client: Any, facts: _plan.Workers,
         progress: bool | TextIO, performance_report: str | None,
         run: OpenRun | None = None, resume: Progress | None = None,
         persist: bool = False, info: RunInfo | None = None,
         chunk_given: bool = True) -> TensorTrain | None:
    """Build the graph of the run and compute it: the result, or None when it went
    into ``run``. ``facts``: what the workers have (for the plan logged at INFO);
    ``persist``: the result's cores stay on the cluster (see :func:`src`); ``info``:
    what the result says of its run (the discarded weights added here);
    ``chunk_given``: the caller chose the chunk (else a run as one task, whose blocks
    run one after the other, takes one worker's default: fewer, larger GEMMs)."""
    persist = persist and client is not None and run is None
    if run is None and not progress and performance_report is None:
        flops = _one_task_flops(stack, plan, client, facts)
        if flops is not None:
            if not chunk_given:
                plan = dataclasses.replace(plan, chunk=_one_task_chunk(stack, plan, facts))
            return _run_in_one_task(stack, plan, client, flops, persist, info)
    summary = _progress.describe(stack, plan, client)
    addresses = _addresses(client)
    inputs = _in_memory_inputs(stack)
    back = 0 if persist or run is not None else stack.result_bytes(plan.chi_out)
    # In-memory inputs travel inside the graph (not scattered: a lost worker would lose
    # them for good), or where every worker shares this host's memory, through it (the
    # files last as long as the call: a task run again finds them).
    with _shared_memory(client, addresses or [], sum(map(_kernels.nbytes, inputs.values())),
                        back) as call:
        sent, info = _send_inputs(inputs, client, None, info, call)
        outbox = _outbox(call, back)
        graph = _graph.build(stack, plan, addresses, None if run is None else run.store,
                             resume, sent=sent, outbox=outbox)
        _warn_of_a_slow_link(stack, plan, client, addresses)
        _warn_of_projections_again(stack, plan, addresses)
        if log.isEnabledFor(logging.INFO):  # the plan says what the one-line summary does
            log.info("src: %s", _estimate_of(stack, plan, client, facts, run is not None,
                                              _graph.task_count(graph)))
        with in_graph(stack), _files_removed(graph, plan, client), \
                ucx_waits_for_default_stream(client, _plan.stream_sync(plan.device, addresses)), \
                _progress.watch(graph, client, progress, performance_report, summary):
            cores, weights = _compute(graph, client, launch_only=not plan.to_host,
                                      persist=persist, outbox=outbox is not None)
    if weights is not None:
        worst = max(range(len(weights)), key=weights.__getitem__)
        log.info("src: rounding discarded at most %.3g of the weight (bond %d), %.3g in all",
                 weights[worst], worst, sum(weights))
    if run is not None:
        run.write_discarded(weights)
        return None
    return TensorTrain(list(cores), stack.kind, name="result",
                       run_info=dataclasses.replace(info or RunInfo(), discarded=weights))


def _one_task_chunk(stack: Stack, plan: _plan.Plan, facts: _plan.Workers) -> int:
    """Sketch columns per block of a run that is one task: a block per thread of one
    CPU worker (its blocks run one after the other, each GEMM on all the host's
    cores), one block on a GPU, which runs one block's GEMMs at a time (the larger the
    better; an in-process GPU run has one too), not one per thread of the GPU worker:
    those would be smaller GEMMs on the same GPU."""
    slots = 1 if plan.device == "gpu" else max(1, facts.threads)
    return min(plan.sketch, _plan.default_chunk(stack, plan.sketch, slots, plan.task_bytes,
                                                plan.device))


@contextlib.contextmanager
def _files_removed(graph: Any, plan: _plan.Plan, client: Any) -> Iterator[None]:
    """The environments the run writes to disk (``Plan.disk_envs``) removed if it stops
    before reading them back (each is removed as it is read)."""
    try:
        yield
    except BaseException:
        if plan.disk_envs:
            token = _graph.keys.token_of(graph.key)
            with contextlib.suppress(Exception):
                if client is None:
                    _transfer.remove_run(token)
                else:
                    client.run(_transfer.remove_run, token)
        raise


def _one_task_flops(stack: Stack, plan: _plan.Plan, client: Any,
                    facts: _plan.Workers) -> float | None:
    """The FLOPs of a run on ``client`` small enough to run as one task on one worker
    (None for any other): at most ``src_dask.one-task-flops`` (the round trips of a
    graph of many dependent tasks would cost more than its arithmetic), or where the
    graph would gain less than its round trips cost (``_plan.one_task_beats_graph``:
    one GPU worker, or single-threaded CPU workers); its data and largest task within
    what a worker's tasks may use together and, on a GPU, within what dask-cuda keeps
    on the device before spilling (a task's own arrays never spill)."""
    if client is None or plan.task_bytes is None:
        return None
    bound = float(config.get("one-task-flops"))
    flops = _estimate.flops(stack, plan.sketch, plan.chi_out, plan.round)
    total = sum(flops.values())
    if total > bound:  # then only where the graph would not be faster (at 0: never)
        if bound <= 0:
            return None
        addresses = _addresses(client)
        # the whole sweep decided only where pass 2 may be Pass2.FIRST (CPU plans)
        pass2 = (_plan.SweepPlan.decide(stack, plan, addresses).pass2 if plan.device == "cpu"
                 else _plan.Pass2.of_run(plan.device, len(addresses)))
        if not _plan.one_task_beats_graph(flops["pass 1"], stack.n, facts.count, pass2,
                                          plan.threads, plan.device):
            return None
    data = max(_estimate.data_held(stack, plan, 1, False))
    inputs = stack.input_bytes(lazy=False) + stack.input_bytes(lazy=True)
    need = data + _estimate.pass1_task(stack, plan.sketch, plan.device) + inputs
    budget = plan.task_bytes * max(1, facts.threads)
    if plan.device == "gpu" and facts.device_limit:  # nothing of one task spills
        budget = min(budget, facts.device_limit)
    return total if need <= budget else None


def _run_in_one_task(stack: Stack, plan: _plan.Plan, client: Any, flops: float,
                     persist: bool = False, info: RunInfo | None = None) -> TensorTrain:
    """The run as one task on a worker: its graph (laid out for one process) computed
    there by Dask's synchronous scheduler; the inputs travel once, in the task or
    ahead of it (:func:`_send_inputs`), and a large result, where the worker shares
    this host's memory, back through it (:mod:`._shared`).
    ``persist``: the cores stay on that worker (see :func:`src`); ``info``: as
    :func:`_run`'s."""
    # the scheduler's info on each worker (``info``, elsewhere; here that is the RunInfo)
    worker_info = workers_info(client)
    worker, threads = _plan.one_task_worker(worker_info)
    inputs = _in_memory_inputs(stack)
    back = 0 if persist else stack.result_bytes(plan.chi_out)
    with _shared_memory(client, [worker], sum(map(_kernels.nbytes, inputs.values())),
                        back) as call:
        sent, info = _send_inputs(inputs, client, worker, info, call)
        outbox = _outbox(call, back)
        graph = _graph.build(stack, plan, sent=sent, outbox=outbox)
        weights = _graph.discarded(graph)
        wanted = [graph.key] + ([weights.key] if weights is not None else [])
        # culled as one dict (a layer at a time, the high-level graph's cull took ~4x as
        # long: a call's inputs on the cluster are a layer each)
        dsk, _ = dask.optimization.cull(dict(graph.__dask_graph__()), wanted)
        if plan.device == "cpu":  # the host's cores, idle meanwhile (tasks.with_threads)
            here = partial(_graph.tasks.with_threads, threads, _graph.compute_here)
        else:  # the GPU worker's own threads, each queueing kernels as in-process runs do
            threads = int(worker_info[worker].get("nthreads") or 1)
            here = partial(_graph.compute_here, threads=threads)
        if _plan.own_heap(plan.device, on_cluster=True):  # glibc's malloc (tasks.with_heap)
            here = partial(_graph.tasks.with_heap, here)
        log.info("src: %.3g FLOPs: the run is one task on %s (%d threads)", flops, worker,
                 threads)
        with in_graph(stack):
            # elsewhere if that worker is lost (its threads then a guess, not a hang)
            future = client.submit(here, *_graph.seal(dsk), wanted, workers=[worker],
                                   allow_other_workers=True,
                                   key=f"compute_here-{_graph.keys.token_of(graph.key)}")
        try:
            if persist:  # one round trip for the cores' shapes and the weights
                metas, discarded = client.submit(_metas_of, future, pure=False).result()
                cores = _parts_of(future, metas)
                rest = [discarded]
            else:
                cores, *rest = future.result()
                if outbox is not None:  # mapped here, their files removed
                    cores = [_shared.take(d) for d in cores]
        except BaseException:  # a failure or an interrupt: nothing left running
            future.cancel()
            raise
    return TensorTrain(list(cores), stack.kind, name="result", run_info=dataclasses.replace(
        info or RunInfo(), discarded=rest[0] if rest else None))


#: In-memory inputs (and results) of fewer bytes ride inside a one-task run's task (and
#: its result): sending them ahead costs a round trip more than they save.
_SEND_AHEAD_BYTES = 16 << 20


def _in_memory_inputs(stack: Stack) -> dict[int, Any]:
    """The in-memory input cores of ``stack``, each once, by the arrays' ids."""
    return {id(c): c for f in stack.factors for j in range(stack.n)
            if _kernels.is_in_memory(c := f.train.source(j))}


@contextlib.contextmanager
def _shared_memory(client: Any, workers: list[str], inputs: int, result: int
                   ) -> Iterator[_shared.Call | None]:
    """The files of a call whose ``inputs`` or ``result`` bytes go through this host's
    shared memory to and from ``workers`` (config ``shared-memory``), removed when the
    call ends; None where they do not: no client, too few bytes, a worker in this
    process (Dask hands it the arrays themselves), or one that does not see this
    process's files (another host, another container)."""
    if (client is None or not workers or max(inputs, result) < _SEND_AHEAD_BYTES
            or not config.get("shared-memory")
            or any(w.startswith("inproc://") for w in workers)):
        yield None
        return
    info = workers_info(client)
    if not all(_shared.reaches(client, w, info.get(w, {}).get("id", "")) for w in workers):
        yield None
        return
    with _shared.call_files() as call:
        yield call


def _outbox(call: _shared.Call | None, nbytes: int) -> _shared.Outbox | None:
    """Where the output cores go for a ``call`` through shared memory: an outbox where
    the result (at most ``nbytes``) is worth it and fits, else None (Dask's comm)."""
    if call is None or nbytes < _SEND_AHEAD_BYTES or not _shared.room(nbytes):
        return None
    return _shared.Outbox(*call)


def _send_inputs(inputs: dict[int, Any], client: Any, worker: str | None,
                 info: RunInfo | None, call: _shared.Call | None = None
                 ) -> tuple[dict[int, Any], RunInfo | None]:
    """The in-memory input cores ``inputs`` (from :data:`_SEND_AHEAD_BYTES` on) sent
    ahead of the run, each once; what stands for them by the arrays' ids, and ``info``
    saying how many bytes went and in how long (a call's transfer, apart from its
    run). Through this host's shared memory where the ``call`` has files there and
    room (:mod:`._shared`: one copy by several threads); else, to the ``worker`` of a
    one-task run, by Dask's ``scatter``, straight to it (on one host half the time of
    carrying them inside the task), only where the client surely reaches it (this
    host's loopback, in-process, or a client made with ``direct_to_workers``).
    Otherwise (or with no ``worker``: a graph) they travel inside the graph."""
    nbytes = sum(_kernels.nbytes(c) for c in inputs.values())
    if nbytes < _SEND_AHEAD_BYTES:
        return {}, info
    start = time.perf_counter()
    if call is not None and _shared.room(nbytes):
        how, sent = "through shared memory", _shared.write(list(inputs.values()),
                                                          call.prefix + "in-")
    elif worker is not None and (_on_loopback(worker) or client.direct_to_workers):
        how, sent = "by scatter", client.scatter(list(inputs.values()), workers=[worker],
                                                direct=True, hash=False)
    else:
        return {}, info
    seconds = time.perf_counter() - start
    log.info("src: %s of in-memory inputs sent to %s %s in %.3g s",
             dask.utils.format_bytes(nbytes), worker or "the workers", how, seconds)
    return dict(zip(inputs, sent, strict=True)), dataclasses.replace(
        info or RunInfo(), sent_bytes=nbytes, sent_s=seconds)


def _on_loopback(address: str) -> bool:
    """Whether a worker's ``address`` is in this process or on this host's loopback."""
    from distributed.comm import parse_address, parse_host_port

    scheme, location = parse_address(address)
    if scheme == "inproc":
        return True
    host = parse_host_port(location)[0].strip("[]")  # text only: no comm backend asked
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


def _part(result: Any, j: int) -> Any:
    """Core ``j`` of a one-task run's result."""
    return result[0][j]


def _metas_of(result: Any) -> tuple[list[tuple[tuple[int, ...], Any]], Any]:
    """The shapes and dtypes of a one-task run's cores, and its discarded weights
    (None without rounding), where the result is."""
    return [_meta(c) for c in result[0]], result[1] if len(result) > 1 else None


def _parts_of(future: Any, metas: list[tuple[tuple[int, ...], Any]]) -> list[Any]:
    """Dask arrays over the cores of a one-task run's result ``future``, each taken out
    of it on the worker that holds it when first computed (no task runs now)."""
    import dask.array as da
    from dask import delayed

    whole = delayed(future)  # the future a value of the graph (as _graph.seal finds it)
    return [da.from_delayed(delayed(_part, pure=True)(whole, j), shape=shape, dtype=dtype)
            for j, (shape, dtype) in enumerate(metas)]


def _meta(x: Any) -> tuple[tuple[int, ...], Any]:
    """The shape and dtype of a result core, where it is."""
    return tuple(x.shape), x.dtype


def _on_the_cluster(client: Any, futures: list[Any]) -> list[Any]:
    """Dask arrays over ``futures`` (results in the workers' memory), once they are
    done: only their shapes and dtypes come to the client."""
    import dask.array as da
    from dask import delayed

    metas = client.gather(client.map(_meta, futures, pure=False))
    return [da.from_delayed(delayed(f), shape=shape, dtype=dtype)
            for f, (shape, dtype) in zip(futures, metas, strict=True)]


#: Schedulers whose GPU workers' slow link was reported (once a cluster, not every call).
_slow_links_reported: set[str] = set()


def _warn_of_a_slow_link(stack: Stack, plan: _plan.Plan, client: Any,
                         addresses: list[str] | None) -> None:
    """Once a cluster: the WARNING of :func:`_plan.slow_gpu_link`, if it has one."""
    if client is None or client.scheduler.address in _slow_links_reported:
        return
    text = _plan.slow_gpu_link(stack, plan, addresses)
    if text:
        _slow_links_reported.add(client.scheduler.address)
        log.warning(text)


#: Where pass 2 projects its cores again (``Plan.reproject``) and that more than
#: multiplies the run's FLOPs by this, the run says so: once a site costs about 1.35
#: on the reference stack; tasks far smaller than a site's rows cut the environments'
#: sums into blocks, each of which projects the whole core again.
REPROJECT_WARNING = 1.5


def _warn_of_projections_again(stack: Stack, plan: _plan.Plan,
                               addresses: list[str] | None) -> None:
    """A WARNING where the device memory leaves tasks so small that pass 2's projections
    again (``Plan.reproject``) multiply the run's FLOPs past ``REPROJECT_WARNING``: a run
    that completes, but many times slower than on a device with room for a little more."""
    if not plan.reproject:
        return
    again = _estimate.projected_again(_plan.SweepPlan.decide(stack, plan, addresses))
    flops = [sum(_estimate.flops(stack, plan.sketch, plan.chi_out, plan.round, a).values())
             for a in (again, {})]
    if flops[0] > REPROJECT_WARNING * flops[1]:
        log.warning("src: tasks of %s of device memory make pass 2 project a core up to %d "
                    "times: %.3g FLOPs, %.3g times those of projecting each once; more "
                    "device memory per worker (fewer threads, a larger pool or GPU) "
                    "would take less time", dask.utils.format_bytes(plan.task_bytes or 0),
                    1 + max(again.values(), default=0), flops[0], flops[0] / flops[1])


def _compute(graph: Any, client: Any, launch_only: bool = False, persist: bool = False,
             outbox: bool = False) -> tuple[list[Any], list[float] | None]:
    """The output cores of ``graph`` and the weights its rounding discards (None without
    rounding). On a cluster each core travels to the client as
    soon as it is final, while pass 2 goes on (still one graph, one submission),
    instead of all of them in one message at the end (gigabytes at once for the
    reference stacks: docs/design.md §7, "Results").

    ``launch_only``: every task only queues GPU kernels (CuPy inputs, CuPy results),
    so threads have nothing to overlap and Dask's synchronous scheduler, with half
    the threaded one's overhead a task, runs the graph, unless the Dask config
    names a scheduler. ``persist``: the cores stay on the cluster (Dask arrays over
    them; see :func:`src`). ``outbox``: the graph's output cores are files of shared
    memory (``_graph.build``), each mapped here as it comes.
    """
    weights = _graph.discarded(graph)
    if client is None:
        sync = launch_only and dask.config.get("scheduler", None) is None
        cores, weights = dask.compute(graph, weights, scheduler="sync" if sync else None)
        return list(cores), weights
    from distributed import as_completed

    futures = client.compute(_graph.outputs(graph) + ([weights] if weights is not None else []))
    if persist:
        cores = futures[:-1] if weights is not None else futures
        try:
            return (_on_the_cluster(client, cores),
                    futures[-1].result() if weights is not None else None)
        except BaseException:  # a failure or an interrupt stops the rest of the run
            client.cancel(futures)
            raise
    where = {f.key: j for j, f in enumerate(futures)}
    n_cores = len(futures) - (weights is not None)
    out: list[Any] = [None] * len(futures)
    try:
        for future, value in as_completed(futures, loop=client.loop, with_results=True):
            j = where[future.key]
            out[j] = _shared.take(value) if outbox and j < n_cores else value
            future.release()
    except BaseException:  # a failure or an interrupt stops the rest of the run
        client.cancel(futures)
        raise
    return (out[:-1], out[-1]) if weights is not None else (out, None)


def apply(mpo: Any, x: Any, chi_out: int | None = None, **options: Any) -> TensorTrain:
    """``mpo · x`` compressed to ``chi_out`` (``x`` an MPS or an MPO); see :func:`src`.

    The operator comes first, as in quimb's ``A.apply(x)``; a bra ``x·mpo`` is
    ``src(x, mpo, ...)``."""
    chi_out = _chi_out(chi_out, options, "apply")
    op = as_train(mpo, name="apply: mpo")
    if op.kind == "mps":
        raise ValueError("apply: the first argument is an MPS, but apply(mpo, x) takes the "
                         "operator first (mpo · x); for the bra x·mpo call "
                         "src_dask.src(mps, mpo, chi_out=...)")
    return src(mpo, x, chi_out=chi_out, **options)


def compress(train: Any, chi_out: int | None = None, **options: Any) -> TensorTrain:
    """One train compressed to bond dimension ``chi_out``; see :func:`src`."""
    return src(train, chi_out=_chi_out(chi_out, options, "compress"), **options)


def _chi_out(chi_out: Any, options: dict[str, Any], what: str) -> Any:
    """``chi_out``, with a pointer for quimb's name of it, ``max_bond``."""
    if "max_bond" in options:
        raise TypeError(f"{what}: chi_out is quimb's max_bond here: pass chi_out="
                        f"{options['max_bond']!r} instead of max_bond")
    if chi_out is None:
        raise TypeError(f"{what}: missing chi_out, the bond dimension of the result "
                        "(quimb's max_bond)")
    return chi_out


# -- option checks ---------------------------------------------------------------
def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _positive_int(x: Any, what: str) -> int:
    if not _is_int(x) or x < 1:
        raise ValueError(f"{what}: expected a positive int, got {x!r}")
    return int(x)


def _oversample(p: Any, chi_out: int) -> int:
    if isinstance(p, str):
        if p != "auto":
            raise ValueError(f"oversample: expected an int >= 0 or 'auto', got {p!r}")
        return max(math.ceil(chi_out / 2), 10)
    if not _is_int(p) or p < 0:
        raise ValueError(f"oversample: expected an int >= 0 or 'auto', got {p!r}")
    return int(p)


def _cutoff(c: Any) -> float:
    if not isinstance(c, numbers.Real) or isinstance(c, bool) or not 0 <= c < 1:
        raise ValueError(f"cutoff: expected a number in [0, 1), got {c!r}")
    return float(c)


def _client(client: Any) -> Any:
    """The client to compute on: the given one, else the current one, else None."""
    from distributed import Client

    if client is not None:
        if not isinstance(client, Client):
            raise TypeError(f"client: expected a distributed.Client, got {type(client).__name__}")
        if client.status in ("closing", "closed"):
            raise ValueError(f"client: the client is {client.status}; pass an open "
                             "distributed.Client (or none, for Dask's local scheduler)")
        return client
    try:
        return Client.current(allow_global=True)
    except ValueError:
        return None


def _fingerprint(stack: Stack) -> list:
    """What identifies the inputs of a stored run: kinds, shapes, and a token per
    core (a hash of the data for in-memory arrays; of the graph or the store
    path and metadata for lazy ones)."""
    return [[f.train.kind, f.transpose,
             [[list(c.shape), _arraylike.token(f.train.source(j))]
              for j, c in enumerate(f.train)]]
            for f in stack.factors]


