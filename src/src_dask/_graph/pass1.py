"""Pass 1 of the sweep: the sketched environments ``C_1 … C_{n-1}``, one
independent chain of tasks per block of sketch columns (docs/design.md §2.2)."""

from __future__ import annotations

from typing import Any

from .._runstore import Progress, RunStore
from . import tasks
from .builder import GraphBuilder, Inputs


def todo(g: GraphBuilder, progress: Progress | None) -> list[int]:
    """The blocks of sketch columns pass 1 still has to do."""
    blocks = g.sweep.plan.blocks
    return [c for c in range(len(blocks)) if not (progress and progress.pass1_done[c])]


def add(g: GraphBuilder, inputs: Inputs, blocks_todo: list[int],
        store: RunStore | None) -> list[list[Any]]:
    """Add pass 1's chains; returns ``envs[j][c]``, the key of block ``c`` of ``C_j``
    (None for blocks an earlier run did)."""
    stack, plan, groups = inputs.stack, g.sweep.plan, g.sweep.groups
    n, blocks, ahead = stack.n, plan.blocks, g.sweep.lookahead
    lead: dict[int, int] = {}  # the first block each group runs: its chain paces the reads
    for c in blocks_todo:
        lead.setdefault(c % groups, c)
    cores = {(j, grp): inputs.load(j, 1, (g.name("pass1", j - ahead), c) if j >= ahead else None,
                                   grp)
             for grp, c in lead.items() for j in range(n - 1)}
    envs: list[list[Any]] = [[None] * len(blocks) for _ in range(n)]

    def done(j: int, c: int) -> Any:  # the last task of block c at site j
        if store is None and j + 1 <= plan.host_envs:
            return (g.name("pass1", j), c, "host")
        return (g.name("pass1", j), c)

    barriers = _barriers(g, blocks_todo, n, done)
    for c in blocks_todo:
        start, stop = blocks[c]
        env = None
        for j in range(n - 1):
            after = barriers.get((j - _LAG, c % max(1, g.n_workers)))
            env = g.pin(g.add((g.name("pass1", j), c), tasks.pass1_block, env,
                              cores[j, c % groups], after, site=j, start=start, stop=stop,
                              run=g.token, store=store, block=c, last=j == n - 2,
                              seed_key=plan.key, legs=(stack.up(j), stack.down(j))), c)
            # the environments the device does not keep: a copy in host memory for pass
            # 2, made by a thread of the worker (the chain goes on with the device's)
            kept = done(j, c)
            if kept != env and j + 1 <= plan.disk_envs and _reads_back_here(g, c):
                # nor in host memory: to the worker's disk, read back where it was written
                g.pin(g.add(kept, tasks.to_disk, env, run=g.token, name=f"{j + 1}-{c}"), c)
            elif kept != env:
                g.pin(g.add(kept, tasks.to_host, env), c)
            envs[j + 1][c] = kept
    return envs


def _reads_back_here(g: GraphBuilder, c: int) -> bool:
    """Whether pass 2 fetches block ``c``'s environments once, on the worker that made
    them (a file written there is read there, and removed as it is read); else they
    stay in host memory, to travel: the other workers' blocks where all of pass 2 runs
    on the first, and every block where pass 2 is split by rows (each worker that owns
    rows fetches all of them)."""
    if g.sweep.pass2.split:
        return False
    return not g.sweep.pass2.home or c % max(1, g.n_workers) == 0


#: Sites a block's chain may run ahead of the slowest block that shares its inputs.
_LAG = 2


def _barriers(g: GraphBuilder, blocks_todo: list[int], n: int,
              done: Any) -> dict[tuple[int, int], Any]:
    """``{(site, worker): key}``: a task that has run once every block on the worker
    (index; blocks are pinned round robin) has done the site (``done(j, c)``: the
    block's last task there, its step or the copy of its environment to host memory).
    A block's step at site ``j`` waits for the barrier of site ``j - _LAG``, so a
    worker's chains go through the sites together: each site's cores are used by all
    its blocks and dropped, and the environments copied to host memory leave the
    device before more are made. Left free, Dask ran the chains one after another
    and kept every site's cores for the last one (with many blocks on a small GPU pool
    they were spilled to host memory and read back for each block: docs/design.md
    §3.3, "Pass 1's chains together"), and ran steps
    before copies, whose environments dask-cuda then spilled on the event loop."""
    n_workers = max(1, g.n_workers)
    out: dict[tuple[int, int], Any] = {}
    for w in range(n_workers):
        mine = [c for c in blocks_todo if c % n_workers == w]
        if len(mine) < 2:
            continue
        for j in range(n - 1 - _LAG):
            steps = [g.signal(done(j, c)) for c in mine]
            out[j, w] = g.pin(g.add((g.name("pass1", j), "all", w), tasks.signal_all, *steps),
                              w)
    return out
