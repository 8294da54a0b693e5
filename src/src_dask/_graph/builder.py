"""A task graph under construction (:class:`GraphBuilder`) and the loading of
each site's input cores into it (:class:`Inputs`)."""

from __future__ import annotations

from functools import partial
from typing import Any

import dask.array as da
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.utils import key_split

from .. import _arraylike, _shared
from .. import _kernels as K
from .._integrity import VerifiedArray
from .._plan import SweepPlan
from .._stack import Stack
from . import keys, tasks


class GraphBuilder:
    """Keys, tasks, worker placement and the input collections of one run's graph."""

    def __init__(self, sweep: SweepPlan, token: str, sent: dict[int, Any] | None = None
                 ) -> None:
        self.sweep = sweep
        self.token = token
        self.sent = sent or {}  # id(array): its copy's future, or its file (_shared)
        self.addresses = list(sweep.addresses)
        self.tasks: dict[Any, Any] = {}
        self.inputs: list[da.Array] = []
        self.placement: dict[Any, str] = {}
        self._shared: dict[int, tuple[Any, Any]] = {}  # id(array): (array, its data key)
        self._mapped: dict[tuple[int, int | None], Any] = {}  # (id(array), group): its map
        self._signals: dict[Any, Any] = {}

    @property
    def n_workers(self) -> int:
        """Workers the graph places tasks on (0: Dask's local scheduler)."""
        return len(self.addresses)

    def name(self, step: str, site: int) -> str:
        return keys.name(step, site, self.token)

    def add(self, key: Any, func, /, *deps: Any, **static: Any) -> Any:
        """Add ``func(*deps, **static)``; ``deps`` are keys (or lists of keys, or None),
        or in-memory arrays (from :meth:`array`)."""
        func = partial(func, **static) if static else func
        if self.sweep.own_streams:
            func = partial(tasks.on_own_stream, func)
        elif self.sweep.own_heap:
            func = partial(tasks.with_heap, func)
        self.tasks[key] = (func, *deps)
        return key

    def pin(self, key: Any, block: int) -> Any:
        """Prefer the worker that owns column block ``block`` for ``key``.

        Environments are the big state: a block's whole chain of ``C_j`` and
        its pieces of the sketch stay on one worker, and the (smaller) cores
        and projected cores travel to it. Loose: another worker may take over
        if that one is lost.
        """
        if self.addresses:
            self.placement[key] = self.addresses[block % self.n_workers]
        return key

    def signal(self, key: Any) -> Any:
        """A key that stands for ``key`` where a task only waits for it: a tiny task
        on ``key``'s worker that returns None once ``key`` has run. Reads and copies
        ahead of use are paced by steps on other workers; waiting on the step itself
        moved its result (a 256 MB block of C, a 64 MB core) to them for nothing."""
        if key is None or self.n_workers < 2 or key_split(key) == "src_after":
            return key  # one worker (nothing moves), or a signal already
        if key not in self._signals:
            signal = keys.after(key, self.token)
            self.tasks[signal] = (tasks.signal, key)
            self._signals[key] = signal  # placed with ``key`` (see :meth:`delayed`)
        return self._signals[key]

    def array(self, x: Any, after: Any = None, group: int | None = None) -> Any:
        """Array ``x`` whole, for a task's arguments: an in-memory array as it is (it
        travels inside the task that uses it: no task of its own for the scheduler to
        run) or, where several workers prepare their own copy, as one data key they
        all use (the graph carries it once), or the key of its copy sent ahead
        (``sent``); a lazy one as a key whose task reads it.

        A stored array gets a new read task at every call: each pass reads its
        cores anew instead of keeping them in memory from pass 1 to pass 2.
        ``after`` (a key) holds the read back until that task has run: reads have
        no inputs, so idle threads would otherwise read every core at the start.
        ``group``: the worker whose task uses the read, which then reads it itself
        (left free, a read ran where ``after`` had, and the core crossed to the
        other worker through host memory: docs/design.md §7, "Multi-GPU over Dask").
        """
        if tasks.is_stored(x):
            key = keys.read()
            pinned = self.sweep.plan.device == "gpu"
            self.tasks[key] = (partial(tasks.read_whole, pinned=pinned), _arraylike.source(x),
                               after)
            return key if group is None else self.pin(key, group)
        x = tasks.lazy(x)
        if K.is_in_memory(x):
            if id(x) in self.sent:  # sent to the workers ahead of the run
                return self._sent(x, after, group)
            if self.sweep.groups == 1:
                return x
            if id(x) not in self._shared:  # the array is held, so its id stays its own
                key = keys.shared_input()
                self.tasks[key] = x
                self._shared[id(x)] = (x, key)
            return self._shared[id(x)][1]
        x = x.rechunk(x.shape)
        self.inputs.append(x)
        return (x.name,) + (0,) * x.ndim

    def _sent(self, x: Any, after: Any, group: int | None) -> Any:
        """The key of in-memory input ``x`` sent ahead of the run: its future's, or,
        for a copy in this host's shared memory, that of a task that maps it once
        ``after`` has run (as a read would be) on ``group``'s worker (each worker that
        uses it maps its own)."""
        sent = self.sent[id(x)]
        if not isinstance(sent, _shared.Shared):
            self.tasks[sent.key] = sent
            return sent.key
        if (id(x), group) not in self._mapped:
            key = keys.shared_input()
            self.tasks[key] = (partial(tasks.read_shared, sent), after)
            self._mapped[id(x), group] = key if group is None else self.pin(key, group)
        return self._mapped[id(x), group]

    def delayed(self, key: str) -> Delayed:
        """The graph as one Delayed computing ``key``."""
        placement = self.placement
        for step, signal in self._signals.items():  # a signal runs where its step does
            if step in placement:
                placement[signal] = placement[step]
        annotations = None
        if placement:
            annotations = {"workers": placement.get,
                           "allow_other_workers": lambda k: True if k in placement else None}
        layer = MaterializedLayer(self.tasks, annotations=annotations)
        return Delayed(key, HighLevelGraph.from_collections(key, layer, self.inputs))


class Inputs:
    """The prepared (padded, cast, moved) input cores of each site, added to the
    graph when a pass asks for them.

    Lazy inputs are read anew for each pass, so no core waits in memory from
    pass 1 to pass 2; in-memory inputs, and lazy ones when the plan keeps them,
    are prepared once for both passes. On several GPUs each worker that uses a
    core (its ``group``) holds its own copy: read by itself where Dask's comm is
    TCP (reading again beats moving GPU data at TCP's rate, docs/design.md §6.2),
    read by one worker and copied to the others where it is UCX
    (``SweepPlan.copy_inputs``). The data of lazy inputs is checked for NaN/inf
    once: in pass 1, or in pass 2 for the last site (pass 1 stops before it) and
    when an earlier run did all of pass 1.
    """

    def __init__(self, g: GraphBuilder, stack: Stack, pass1_done: bool) -> None:
        self.g, self.stack, self.pass1_done = g, stack, pass1_done
        self._loaded: dict[tuple[int, int, int], Any] = {}

    def load(self, j: int, sweep: int, after: Any = None, group: int = 0) -> list[Any]:
        """Keys of site ``j``'s cores for pass ``sweep``, read and moved once ``after``
        has run (a few sites ahead of their use: memory holds a few sites' inputs,
        not all of them), as ``group`` uses them.

        Where the plan copies inputs over a fast link, site ``j`` is read by group
        ``j % groups`` (reads spread over the workers) and copied to the others."""
        after = self.g.signal(after)
        groups = self.g.sweep.groups
        if not (self.g.sweep.copy_inputs and groups > 1):
            return self._read(j, sweep, after, group)
        reader = j % groups
        own = self._read(j, sweep, after, reader)
        if group == reader:
            return own
        out = []
        for i, key in enumerate(own):
            slot = ("copy", j, i, group, key)
            if slot not in self._loaded:
                copy = key[:2] + (i, "copy", group)
                self._loaded[slot] = self.g.pin(self.g.add(copy, tasks.first, key, after), group)
            out.append(self._loaded[slot])
        return out

    def _read(self, j: int, sweep: int, after: Any, group: int) -> list[Any]:
        """Site ``j``'s cores prepared by ``group`` from their source."""
        g, stack = self.g, self.stack
        plan, n = g.sweep.plan, stack.n
        out = []
        for i, f in enumerate(stack.factors):
            lazy = not K.is_in_memory(f.train[j])
            once = not lazy or plan.keep_inputs
            slot = (j, i, group)
            if not (once and slot in self._loaded):
                key = (g.name("load", j), 0 if once else sweep, i) + ((group,) if group else ())
                # a verified source checks its data as it is read
                check = (lazy and not isinstance(f.train.source(j), VerifiedArray)
                         and (sweep == 1 or j == n - 1 or self.pass1_done))
                pin = group if g.sweep.groups > 1 else None
                self._loaded[slot] = g.add(
                    key, tasks.prepare, g.array(f.train.source(j), after, pin), after,
                    kind=f.train.kind, site=j, n=n, transpose=f.transpose, dtype=stack.dtype,
                    check=check, name=f.train.name, device=plan.device)
                if g.sweep.groups > 1:
                    g.pin(self._loaded[slot], group)
            out.append(self._loaded[slot])
        return out
