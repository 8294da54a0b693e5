"""The SRC sweep as one Dask task graph.

Keys are named ``src_<step>_site<j>-<token>``, so Dask's dashboard groups the
tasks by step and site and shows where a run is:

``src_load_site<j>``
    read, pad and cast the input cores of site ``j`` (one task per factor);
``src_pass1_site<j>``
    the sketch chain ``C_j → C_{j+1}``, one task per block of sketch columns —
    the blocks never talk to each other, so pass 1 is embarrassingly parallel;
``src_pass2_site<j>``
    the projected core ``Z`` (one task), a piece of the sketch per column block
    (runs where that block's ``C_j`` lives), one QR, and the update of ``S``;
``src_round_site<j>``
    the exact rounding sweep of oversampled runs;
``src_result_site<j>``
    the output core in quimb's layout.
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import dask.array as da
import numpy as np
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from . import _kernels as K
from ._stack import Stack


@dataclass(frozen=True)
class Plan:
    """The numbers that shape the graph."""

    sketch: int  # sketch columns s = chi_out + oversample
    chunk: int  # sketch columns per block
    chi_out: int
    cutoff: float
    key: int  # Philox key word from the seed
    round: bool  # exact rounding to chi_out after an oversampled sketch

    @property
    def blocks(self) -> list[tuple[int, int]]:
        return [(c, min(c + self.chunk, self.sketch)) for c in range(0, self.sketch, self.chunk)]


def _lazy(core: Any) -> Any:
    """Dask arrays stay; Zarr (and other array-likes) are wrapped without reading."""
    if isinstance(core, da.Array) or K.is_in_memory(core):
        return core
    return da.from_array(core, chunks=getattr(core, "chunks", "auto"), asarray=False)


class _Graph:
    """A task graph under construction: keys, tasks and the input collections."""

    def __init__(self, workers: list[str], scatter: Callable | None) -> None:
        self.tasks: dict[Any, Any] = {}
        self.inputs: list[da.Array] = []
        self.workers = workers
        self.placement: dict[Any, str] = {}
        self.scatter = scatter
        self.in_memory: dict[Any, Any] = {}

    def add(self, key: Any, func, /, *deps: Any, **static: Any) -> Any:
        """Add ``func(*deps, **static)``; ``deps`` are keys (or lists of keys, or None)."""
        self.tasks[key] = (partial(func, **static) if static else func, *deps)
        return key

    def pin(self, key: Any, block: int) -> None:
        """Prefer the worker that owns column block ``block`` for ``key``.

        Environments are the big state: a block's whole chain of ``C_j`` and
        its pieces of the sketch stay on one worker, and the (smaller) cores
        and projected cores travel to it. Loose: another worker may take over
        if that one is lost.
        """
        if self.workers:
            self.placement[key] = self.workers[block % len(self.workers)]

    def array(self, x: Any) -> Any:
        """A key holding array ``x`` whole; lazy arrays are read only when it runs."""
        x = _lazy(x)
        if K.is_in_memory(x):
            key = ("src_input-" + uuid.uuid4().hex,)
            self.in_memory[key] = x
            return key
        x = x.rechunk(x.shape)
        self.inputs.append(x)
        return (x.name,) + (0,) * x.ndim

    def delayed(self, key: str) -> Delayed:
        """The graph as one Delayed computing ``key``.

        In-memory inputs go to the cluster once, by ``scatter``, rather than
        inside the graph that the scheduler receives.
        """
        if self.scatter is not None and self.in_memory:
            self.in_memory = dict(zip(self.in_memory, self.scatter(list(self.in_memory.values())),
                                      strict=True))
        self.tasks.update(self.in_memory)
        placement = self.placement
        annotations = None
        if placement:
            annotations = {"workers": placement.get,
                           "allow_other_workers": lambda k: True if k in placement else None}
        layer = MaterializedLayer(self.tasks, annotations=annotations)
        deps = {key: {x.name for x in self.inputs}}
        layers = {key: layer}
        for x in self.inputs:
            layers.update(x.__dask_graph__().layers)
            deps.update(x.__dask_graph__().dependencies)
        return Delayed(key, HighLevelGraph(layers, deps))


def build(stack: Stack, plan: Plan, workers: list[str] | None = None,
          scatter: Callable | None = None) -> Delayed:
    """The list of output cores (quimb layouts, host arrays) of SRC on ``stack``.

    One Delayed for the whole sweep: Dask optimises and submits one graph.
    ``workers`` (addresses of a distributed cluster) places the column blocks;
    ``scatter`` (a client's) sends in-memory inputs to the cluster.
    """
    token = uuid.uuid4().hex
    n = stack.n
    g = _Graph(workers or [], scatter)

    def name(step: str, j: int) -> str:
        return f"src_{step}_site{j}-{token}"

    cores = []
    for j in range(n):
        site = []
        for i, f in enumerate(stack.factors):
            raw = f.train[j]
            site.append(g.add((name("load", j), i), K.prepare_core, g.array(raw),
                              kind=f.train.kind, site=j, n=n, transpose=f.transpose,
                              dtype=stack.dtype, check=not K.is_in_memory(raw),
                              name=f.train.name))
        cores.append(site)

    # Pass 1: C_1 … C_{n-1}, one independent chain per block of columns.
    envs: list[list[Any]] = [[None] * len(plan.blocks) for _ in range(n)]
    for c, (start, stop) in enumerate(plan.blocks):
        env = None
        for j in range(n - 1):
            env = g.add((name("pass1", j), c), K.sketch_step, env, cores[j],
                        seed_key=plan.key, site=j, start=start, stop=stop)
            g.pin(env, c)
            envs[j + 1][c] = env

    # Pass 2: right to left. The state after site j is (η_j, Z_{j-1}).
    out: list[Any] = [None] * n
    state = g.add((name("pass2", n - 1), "project"), K.start_pass2, cores[n - 1])
    for j in range(n - 1, 0, -1):
        pieces = [g.add((name("pass2", j), "sketch", c), K.sketch_piece, envs[j][c], state)
                  for c in range(len(plan.blocks))]
        for c, piece in enumerate(pieces):
            g.pin(piece, c)
        state = g.add((name("pass2", j), "qr"), K.pass2_step, pieces, state, cores[j - 1],
                      up=stack.up(j), down=stack.down(j), cutoff=plan.cutoff,
                      max_rank=stack.max_rank(j), site=j)
        out[j] = g.add((name("pass2", j), "core"), operator.getitem, state, 0)
    out[0] = g.add((name("pass2", 0), "core"), K.first_core, state)

    if plan.round:
        carry = None
        for j in range(n):
            step = g.add((name("round", j), "svd"), K.round_step, carry, out[j],
                         chi=plan.chi_out, cutoff=plan.cutoff, last=j == n - 1)
            out[j] = g.add((name("round", j), "core"), operator.getitem, step, 0)
            carry = g.add((name("round", j), "carry"), operator.getitem, step, 1)

    results = [g.add(name("result", j), _to_host, o, kind=stack.kind, site=j, n=n)
               for j, o in enumerate(out)]
    return g.delayed(g.add(f"src_result-{token}", list, results))


def _to_host(core: Any, kind: str, site: int, n: int) -> np.ndarray:
    """An output core in quimb's layout as a NumPy array for the client."""
    if not K.all_finite(core):
        raise FloatingPointError(
            f"site {site}: the result contains NaN or inf (overflow? rescale the inputs)"
        )
    core = K.unpad(core, kind, site, n)
    if K.xp_of(core) is not np:
        core = core.get()
    return np.ascontiguousarray(core)
