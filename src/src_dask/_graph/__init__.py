"""The SRC sweep as one Dask task graph (docs/design.md §3.3).

:func:`build` lays out pass 1 (:mod:`.pass1`), pass 2 (:mod:`.pass2`), the
exact rounding of oversampled runs and the output cores, following the
decisions of a :class:`~src_dask._plan.SweepPlan`; :mod:`.keys` names the tasks
(and parses the names back for progress bars); :mod:`.tasks` holds what the
tasks run; :mod:`.builder` the graph under construction and the input loading.
"""

from __future__ import annotations

import operator
from typing import Any

from dask.delayed import Delayed

from .. import _kernels as K
from .. import _transfer
from .._plan import Plan, SweepPlan
from .._runstore import Progress, RunStore
from .._stack import Stack
from . import keys, pass1, pass2, tasks
from .builder import GraphBuilder, Inputs

__all__ = ["build", "compute_here", "discarded", "keys", "outputs", "task_count", "tasks"]


def build(stack: Stack, plan: Plan, addresses: list[str] | None = None,
          store: RunStore | None = None, progress: Progress | None = None,
          sent: dict[int, Any] | None = None, outbox: Any = None) -> Delayed:
    """The list of output cores of SRC on ``stack`` as one Delayed (one graph).

    ``addresses`` (of a distributed cluster's workers) places the column blocks.
    With a run ``store`` the environments and outputs go to disk, the result is a
    list of the output shapes, and ``progress`` says what an earlier run already did.
    ``sent``: futures of in-memory input cores already sent to the workers, by the
    arrays' ids (``_api._send_inputs``), used in their place; ``outbox``: a
    :class:`~src_dask._shared.Outbox` the output cores go to (a client on the worker's
    host), the result then their files.
    """
    g = GraphBuilder(SweepPlan.decide(stack, plan, addresses), keys.new_token(), sent)
    todo = pass1.todo(g, progress)
    inputs = Inputs(g, stack, pass1_done=not todo)
    envs = pass1.add(g, inputs, todo, store)
    out = pass2.add(g, inputs, envs, store, progress)
    if plan.round:
        out, weights = _rounding(g, out, plan)
        g.add(keys.discarded(g.token), list, weights)
    results = [g.add(g.name("result", j), tasks.finish, o, kind=stack.kind, site=j, n=stack.n,
                     store=store, to_host=plan.to_host, outbox=outbox)
               for j, o in enumerate(out)]
    return g.delayed(g.add(keys.result(g.token), list, results))


def _rounding(g: GraphBuilder, out: list[Any], plan: Plan) -> tuple[list[Any], list[Any]]:
    """The exact rounding sweep to ``plan.chi_out``, left to right (docs/design.md §2.4):
    the rounded cores, and the keys of the weight each bond discards."""
    carry, n, rounded, weights = None, len(out), [], []
    for j, core in enumerate(out):
        step = g.add((g.name("round", j), "svd"), K.round_step, carry, core, chi=plan.chi_out,
                     cutoff=plan.cutoff, last=j == n - 1)
        rounded.append(g.add((g.name("round", j), "core"), operator.getitem, step, 0))
        if j < n - 1:
            carry = g.add((g.name("round", j), "carry"), operator.getitem, step, 1)
            weights.append(g.add((g.name("round", j), "discarded"), operator.getitem, step, 2))
    return rounded, weights


def task_count(graph: Delayed) -> int:
    """Tasks a scheduler runs for ``graph`` and :func:`discarded` (the rest is culled)."""
    extra = discarded(graph)
    wanted = {graph.key} | ({extra.key} if extra is not None else set())
    return len(graph.__dask_graph__().cull(wanted))


def discarded(graph: Delayed) -> Delayed | None:
    """The weights the rounding sweep of ``graph`` discards, one per bond (a list), or
    None for a graph without rounding."""
    key = keys.discarded(graph.key.rsplit("-", 1)[1])
    return Delayed(key, graph.dask, layer=graph.key) if key in graph.dask else None


def outputs(graph: Delayed) -> list[Delayed]:
    """One Delayed per output core of ``graph`` (a :func:`build` result), over the same
    graph: a client can fetch each core as soon as it is final."""
    _, cores = graph.dask[graph.key]
    return [Delayed(k, graph.dask, layer=graph.key) for k in cores]


class Sealed:
    """A graph carried by one task as data (:func:`seal`).

    Distributed reads a task's arguments for the keys it depends on, tasks inside
    containers included, so a graph passed as is makes the task wait on the cluster for
    keys that exist only inside the graph (its lazy inputs' layers: ``standard_normal``
    and the like) and fail as "lost dependencies". Distributed does not look inside this
    object."""

    __slots__ = ("dsk",)

    def __init__(self, dsk: dict) -> None:
        self.dsk = dsk


def seal(dsk: dict) -> tuple[Sealed, dict]:
    """``dsk`` for one task (:func:`compute_here`): its own tasks sealed, and the
    futures it holds (results persisted on the cluster, e.g. an earlier run's cores)
    apart, for distributed to pass in as the task's dependencies."""
    from distributed import Future

    futures = {k: v for k, v in dsk.items() if isinstance(v, Future)}
    return Sealed({k: v for k, v in dsk.items() if k not in futures}), futures


def compute_here(graph: Sealed, values: dict, keys_wanted: list[Any],
                 threads: int = 1) -> list[Any]:
    """The values of ``keys_wanted`` in ``graph`` (with ``values``, the results of its
    futures, in their keys' place), computed in this process: a whole run as one task
    on a worker (``_api._run``). By Dask's synchronous scheduler, or with ``threads``
    > 1 its threaded one (a GPU worker's threads queue kernels side by side, as an
    in-process run's do), its GPU waits blocking as an in-process run's
    (``_transfer.alone_on_the_worker``)."""
    from dask.local import get_sync
    from dask.threaded import get

    dsk = {**graph.dsk, **values}
    with _transfer.alone_on_the_worker():
        if threads > 1:
            return list(get(dsk, keys_wanted, num_workers=threads))
        return list(get_sync(dsk, keys_wanted))
