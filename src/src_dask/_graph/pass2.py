"""Pass 2 of the sweep, right to left (docs/design.md §2.3): at each site the
projected core ``Z_j`` (in row blocks when it is large) is sketched against
``C_j``, and the QR step makes the output core ``η_j``, the environment
``S_{j-1}`` and, where it is whole, the next projected core.

How each site is cut into tasks is decided by the plan, before the graph is
built (:class:`~src_dask._plan.SweepPlan`: its ``steps``, ``z_blocks``,
``cut_env``); this module only lays the tasks out.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import partial
from typing import Any

from .. import _kernels as K
from .._plan import SiteStep, row_owner
from .._runstore import Progress, RunStore
from . import tasks
from .builder import GraphBuilder, Inputs


@dataclass(frozen=True)
class _Z:
    """Where a site's projected core is: the keys of its row blocks, or (``in_state``)
    ``[the previous step's key]``, whose third item is ``Z`` whole; or, not kept
    (``again``), ``source``: ``S_j``'s key (or the keys of its row blocks, one per group
    of ``Z``'s; None: ``S = 1``) that the tasks using a row block project it from
    (``Plan.reproject``), in ``blocks`` row blocks. ``groups``: where ``S_j`` was summed
    in blocks, ``Z``'s row blocks are shared out over them (``SweepPlan.z_groups``)."""

    keys: list[Any]
    in_state: bool = False
    again: bool = False
    source: Any = None
    blocks: int = 0
    groups: int = 1

    def rows_of(self, b: int) -> tuple[Any, tuple[int, int]]:
        """The ``S_j`` that row block ``b`` is projected from, and its rows there."""
        return _rows_of(self.source, b, self.blocks)

    def rows(self, b: int) -> tuple[int, int, int]:
        """Row block ``b``'s place among ``Z``'s rows (``_kernels.block_rows``)."""
        return b, self.blocks or len(self.keys), self.groups


def _rows_of(env: Any, b: int, blocks: int) -> tuple[Any, tuple[int, int]]:
    """The ``S_j`` that row block ``b`` of ``blocks`` of ``Z_j`` is projected from
    (``env``: a key, or the keys of its blocks, one per group of ``Z_j``'s blocks),
    and the block's rows there."""
    if isinstance(env, list):
        group, within, count = K.block_group(b, blocks, len(env))
        return env[group], (within, count)
    return env, (b, blocks)


class _Pass2:
    """Pass 2's tasks for one graph (see :func:`add`)."""

    def __init__(self, g: GraphBuilder, inputs: Inputs, envs: list[list[Any]],
                 store: RunStore | None, progress: Progress | None) -> None:
        self.g, self.inputs, self.envs, self.store = g, inputs, envs, store
        self.stack, self.plan, self.sweep = inputs.stack, g.sweep.plan, g.sweep
        n = self.stack.n
        self.first = progress.pass2_next if progress else n - 1
        self.cores = {j: inputs.load(j, 2, self.ahead_of(j)) for j in range(self.first + 1)}
        self._cores_of_group: dict[tuple[int, int], list[Any]] = {}
        self.checkpoint: Any = None  # the last checkpoint task of split pass 2
        self.out: list[Any] = [None] * n

    def cores_at(self, j: int, w: int) -> list[Any]:
        """Site ``j``'s cores for use on worker ``w`` (its index): each worker's own
        copy where the workers prepare their own inputs (GPUs), else the one copy."""
        if self.sweep.groups == 1 or w == 0:
            return self.cores[j]
        if (j, w) not in self._cores_of_group:
            self._cores_of_group[j, w] = self.inputs.load(j, 2, self.ahead_of(j), group=w)
        return self._cores_of_group[j, w]

    def ahead_of(self, j: int) -> Any:
        """The signal that lets site j's inputs of pass 2 be read (or fetched)."""
        ahead = self.sweep.lookahead
        if j + ahead >= self.stack.n:
            return None
        return self.g.signal((self.g.name("pass2", j + ahead), "core"))

    def place(self, key: Any, block: int) -> Any:
        """Pin ``key`` to the worker of ``block``, or to the first one (``home``)."""
        return self.g.pin(key, 0 if self.sweep.pass2.home else block)

    def resume(self) -> Any:
        """The output cores and the environment an earlier run left (None: S = 1)."""
        g, n, device = self.g, self.stack.n, self.plan.device
        for j in range(n - 1, self.first, -1):
            self.out[j] = g.add((g.name("pass2", j), "core"), tasks.stored, store=self.store,
                                what="eta", site=j, device=device)
        if self.first == n - 1:
            return None
        return g.add((g.name("pass2", self.first), "resume"), tasks.stored, store=self.store,
                     what="right_env", site=self.first, device=device)

    def project(self, j: int, env: Any) -> _Z:
        """``Z_j`` from ``S_j`` (``env``: a key, or a list of the keys of its row blocks,
        one per group of ``Z_j``'s row blocks), in the plan's row blocks."""
        g, m, groups = self.g, self.sweep.z_blocks[j], self.sweep.z_groups(j)
        step = self.sweep.steps[j] if j > 0 else None
        if step is not None and step.reproject:  # made where it is used
            return _Z([], again=True, source=env, blocks=m, groups=groups)
        zs = []
        for b in range(m):
            source, rows = _rows_of(env, b, m)
            zs.append(g.add((g.name("pass2", j), "project", b), tasks.project, self.cores[j],
                            source, rows=rows, site=j, run=g.token))
        # row blocks spread over CPU workers (the sketch and update of a block follow it);
        # all of pass 2 on the first of several GPUs
        if m > 1 or self.sweep.pass2.home:
            zs = [self.place(z, b) for b, z in enumerate(zs)]
        return _Z(zs, groups=groups)

    def block_envs(self, j: int) -> list[Any]:
        """The keys of ``C_j``'s blocks as pass 2 uses them: with a store, the end of
        the block's chain (``C_j`` is then read from disk); where all of pass 2 runs on
        the first worker (``Pass2.home``), fetched to it ahead of use."""
        g, n, out = self.g, self.stack.n, []
        for c in range(len(self.plan.blocks)):
            env = self.envs[j][c] if self.store is None else self.envs[n - 1][c]
            if self.on_host(j):
                env = self.place(g.add((g.name("pass2", j), "fetch", c), tasks.fetch, env,
                                       self.fetch_after(j), device=self.plan.device), c)
            elif self.sweep.pass2.home and self.store is None and c % max(1, self.g.n_workers):
                env = g.pin(g.add((g.name("pass2", j), "fetch", c), tasks.first, env,
                                  self.ahead_of(j)), 0)
            out.append(env)
        return out

    def on_host(self, j: int) -> bool:
        """Whether pass 1 left ``C_j`` in host memory or on disk (``Plan.host_envs``)."""
        return self.store is None and 0 < j <= self.plan.host_envs

    def fetch_after(self, j: int) -> Any:
        """The signal that lets ``C_j`` be copied back from host memory: the end of
        site ``j+2``'s QR, so the copy runs beside site ``j+1`` and the device holds
        two sites' environments, not all the host's."""
        if j + 2 > self.first:
            return None
        return self.g.signal((self.g.name("pass2", j + 2), "core"))

    def pieces(self, j: int, z: _Z, block_envs: list[Any]) -> list[Any]:
        """The sketch of ``Z_j``: on a CPU one task per pair of a block of ``C_j`` and
        a row block of ``Z_j``, where the block of ``C_j`` is (``[c][b]``); on a GPU
        one task per row block of ``Z_j``, against all of ``C_j`` (``[b]``: the GPU
        multiplies so fast that a task per pair costs more in scheduling than in
        arithmetic; on one GPU, or all of pass 2 on the first of several, the blocks
        of ``C_j`` and ``Z_j`` are in one place)."""
        g, blocks = self.g, self.plan.blocks
        if z.again:  # each row block projected, then sketched, in one task
            return [self.place(g.add((g.name("pass2", j), "sketch", b), tasks.project_sketch,
                                     self.cores[j], *z.rows_of(b), block_envs, blocks=blocks,
                                     site=j, run=g.token, store=self.store), b)
                    for b in range(z.blocks)]
        if not self.sweep.pass2.pieces_at_env:
            return [self.place(g.add((g.name("pass2", j), "sketch", b), tasks.sketch_rows,
                                     block_envs, key, blocks=blocks, site=j, run=g.token,
                                     store=self.store), b)
                    for b, key in enumerate(z.keys)]
        return [[g.pin(g.add((g.name("pass2", j), "sketch", b, c), tasks.sketch_piece, env, key,
                             site=j, start=start, stop=stop, run=g.token, store=self.store),
                       c)
                 for b, key in enumerate(z.keys)]
                for c, ((start, stop), env) in enumerate(zip(blocks, block_envs, strict=True))]

    def qr(self, j: int, z: _Z, step: SiteStep) -> Any:
        """The QR task of site ``j``: ``(η_j, S_{j-1}, Z_{j-1})``, as far as ``step``
        makes them here."""
        g, stack, store = self.g, self.stack, self.store
        checkpoint = partial(store.write_pass2, j) if store else None
        options = dict(up=stack.up(j), down=stack.down(j), cutoff=self.plan.cutoff,
                       max_rank=stack.max_rank(j), site=j, run=g.token,
                       checkpoint=None if step.chain else checkpoint)
        left = self.cores[j - 1] if step.whole else None
        key = (g.name("pass2", j), "qr")
        block_envs = self.block_envs(j)
        if step.fused:
            state = g.add(key, tasks.fused_pass2, block_envs, z.keys, left,
                          z_in_state=z.in_state, blocks=self.plan.blocks, store=store,
                          **options)
        else:
            by_rows = not self.sweep.pass2.pieces_at_env or z.again
            state = g.add(key, tasks.pass2_step, self.pieces(j, z, block_envs),
                          None if step.chain else z.keys, left, by_rows=by_rows, **options)
        if self.sweep.pass2.home:
            g.pin(state, 0)
        return state

    def chain(self, j: int, z: _Z, cut: bool) -> Any:
        """``S_{j-1}`` summed along ``Z_j``'s row blocks where each is (one running sum
        in memory, not one partial per block), then checkpointed. ``cut``: one running
        sum per block of rows (``SweepPlan.env_sums``), whose keys are returned as a
        list: no task holds ``S_{j-1}`` whole (but the checkpoint of a run store, which
        saves it whole)."""
        g, m = self.g, z.blocks or len(z.keys)
        outs: list[Any] = list(range(self.sweep.env_sums[j])) if cut else [None]
        envs = []
        for o in outs:
            env = None
            if z.again and self.sweep.pass2.together:
                # all of pass 2 in one place: the chain through the row blocks is one
                # task (a scheduler round trip per block would cost more than a block's
                # GEMMs), holding what each of its steps would: the sum and one block
                name = (g.name("pass2", j), "update") + (() if o is None else (o,))
                sources, s_rows = zip(*(z.rows_of(b) for b in range(m)), strict=True)
                envs.append(self.place(g.add(
                    name, tasks.project_update_all, self.out[j], self.cores[j],
                    list(sources), s_rows=list(s_rows), groups=z.groups,
                    out=None if o is None else (o, len(outs)), site=j, run=g.token), 0))
                continue
            for b in range(m):
                name = (g.name("pass2", j), "update", b) + (() if o is None else (o,))
                out = None if o is None else (o, len(outs))
                if z.again:  # the row block projected again, here
                    key = g.add(name, tasks.project_update, self.out[j], self.cores[j],
                                *z.rows_of(b), env, rows=z.rows(b), out=out, site=j,
                                run=g.token)
                else:
                    key = g.add(name, tasks.partial_update, self.out[j], z.keys[b], env,
                                rows=z.rows(b), out=out, site=j, run=g.token)
                env = self.place(key, b)
            envs.append(env)
        if self.store is None:
            return envs if cut else envs[0]
        if not cut:
            return g.add((g.name("pass2", j), "env"), tasks.checkpointed, envs[0],
                         self.out[j], checkpoint=partial(self.store.write_pass2, j))
        # each block saves its own rows: no task holds S_{j-1} whole
        name, store = g.name("pass2", j), self.store
        rows = g.add((name, "env", "begin"), tasks.checkpoint_begin, self.out[j], store=store,
                     site=j, left=self.stack.left_bonds(j), blocks=len(envs))
        written = [g.add((name, "env", "rows", o), tasks.checkpoint_rows, env, rows,
                         store=store, site=j, block=(o, len(envs)))  # where the block is
                   for o, env in enumerate(envs)]
        saved = g.add((name, "env", "end"), tasks.checkpoint_end, *written, store=store, site=j)
        return [g.add((name, "env", o), tasks.first, env, saved) for o, env in enumerate(envs)]

    def site(self, j: int, z: _Z) -> tuple[_Z | None, Any]:
        """Site ``j``'s step; returns the next site's ``Z`` (None: to be projected from
        the returned environment) and that environment."""
        g, sweep = self.g, self.sweep
        cut, step = sweep.cut_env[j], sweep.steps[j]
        state = self.qr(j, z, step)
        self.out[j] = g.add((g.name("pass2", j), "core"), operator.getitem, state, 0)
        if step.chain:
            return None, self.chain(j, z, cut)
        # the next site's task picks Z out of this state when it is one fused task too
        if step.whole and sweep.pass2.together and j > 1 and sweep.fits[j - 1]:
            return _Z([state], in_state=True), None
        if step.whole:
            return _Z([g.add((g.name("pass2", j - 1), "project", 0), operator.getitem,
                             state, 2)]), None
        return None, g.add((g.name("pass2", j), "env"), operator.getitem, state, 1)


    # -- split over the workers by rows of Z (Pass2.split, docs/design.md §8) ---------
    def owner(self, block: int, blocks: int) -> int:
        return row_owner(block, blocks, self.g.n_workers)

    def split_project(self, j: int, parts: _Parts) -> list[Any]:
        """``Z_j``'s row blocks, each on the worker that owns its rows."""
        g, m = self.g, self.sweep.z_blocks[j]
        zs = []
        for b in range(m):
            w = self.owner(b, m)
            if parts.shares is None:
                pick, given = None, None if parts.whole is None else [parts.whole]
            else:
                pick, given = b - parts.first[w], parts.shares[w]
            key = g.add((g.name("pass2", j), "project", b), tasks.project_rows,
                        self.cores_at(j, w), given, pick=pick,
                        rows=(b, m) if pick is None else None, site=j, run=g.token)
            zs.append(g.pin(key, w))
        return zs

    def split_envs(self, j: int) -> dict[int, list[Any]]:
        """Per worker that owns rows of ``Z_j``: the keys of ``C_j``'s blocks there. A
        block made on another worker is copied to it ahead of use (with a run store
        each worker reads the blocks from disk instead)."""
        g, n, m = self.g, self.stack.n, self.sweep.z_blocks[j]
        out: dict[int, list[Any]] = {}
        for w in sorted({self.owner(b, m) for b in range(m)}):
            keys = []
            for c in range(len(self.plan.blocks)):
                env = self.envs[j][c] if self.store is None else self.envs[n - 1][c]
                if self.on_host(j):
                    env = g.pin(g.add((g.name("pass2", j), "fetch", c, w), tasks.fetch,
                                      env, self.fetch_after(j), device=self.plan.device), w)
                elif self.store is None and c % self.g.n_workers != w:
                    env = g.pin(g.add((g.name("pass2", j), "fetch", c, w), tasks.first, env,
                                      self.ahead_of(j)), w)
                keys.append(env)
            out[w] = keys
        return out

    def split_qr(self, j: int, zs: list[Any]) -> dict[int, Any]:
        """The sketch of each row block where it is, then the QR on every worker that
        owns rows: ``{worker: its QR task}``. Each gathers the others' (small) pieces
        and makes the same ``η_j`` from the same pieces with the same kernels, so the
        updates that follow wait for no copy of ``η_j``: one hop a site fewer on the
        critical path than one QR whose result goes to every worker."""
        g, stack, m = self.g, self.stack, len(zs)
        envs = self.split_envs(j)
        sketches = [g.pin(g.add((g.name("pass2", j), "sketch", b), tasks.sketch_rows,
                                envs[self.owner(b, m)], z, blocks=self.plan.blocks, site=j,
                                run=g.token, store=self.store), self.owner(b, m))
                    for b, z in enumerate(zs)]
        states = {}
        for w in sorted({self.owner(b, m) for b in range(m)}):
            key = (g.name("pass2", j), "qr") + ((w,) if w else ())
            states[w] = g.pin(g.add(key, tasks.split_qr, sketches, up=stack.up(j),
                                    down=stack.down(j), cutoff=self.plan.cutoff,
                                    max_rank=stack.max_rank(j), site=j, run=g.token), w)
        return states

    def split_update(self, j: int, states: dict[int, Any], zs: list[Any]) -> _Parts:
        """Each worker's share of ``S_{j-1}`` from its rows of ``Z_j`` and its own QR's
        ``η_j`` (``states``), cut by the rows each worker projects at site ``j-1``."""
        g, m, left = self.g, len(zs), self.sweep.z_blocks[j - 1]
        mine = _ranges(m, self.owner)
        theirs = _ranges(left, self.owner)
        shares: dict[int, list[Any]] = {h: [] for h in theirs}
        for w, (b0, b1) in mine.items():
            for h, dest in theirs.items():
                key = g.add((g.name("pass2", j), "update", w, h), tasks.share, states[w],
                            zs[b0:b1], first=b0, blocks=m, dest=(*dest, left), site=j,
                            run=g.token)
                shares[h].append(g.pin(key, w))
        parts = _Parts(shares=shares, first={h: b0 for h, (b0, _) in theirs.items()})
        if self.store is not None:
            self.checkpoint = g.pin(g.add(
                (g.name("pass2", j), "env"), tasks.split_checkpoint, states[0],
                [shares[h] for h in sorted(shares)], self.checkpoint,
                checkpoint=partial(self.store.write_pass2, j)), 0)
        return parts

    def split_site(self, j: int, parts: _Parts) -> _Parts:
        """Site ``j`` of split pass 2; returns ``S_{j-1}`` as the workers' shares."""
        zs = self.split_project(j, parts)
        states = self.split_qr(j, zs)
        parts = self.split_update(j, states, zs)
        self.out[j] = self.g.add((self.g.name("pass2", j), "core"), tasks.eta_of, states[0],
                                 self.checkpoint)
        return parts


@dataclass(frozen=True)
class _Parts:
    """``S_j`` as split pass 2 hands it on: ``whole`` (a key; both None: ``S = 1``),
    or ``shares[w]``, the keys of every worker's share of the rows worker ``w``
    projects (row blocks ``first[w]``… of the site)."""

    whole: Any = None
    shares: dict[int, list[Any]] | None = None
    first: dict[int, int] | None = None


def _ranges(blocks: int, owner: Any) -> dict[int, tuple[int, int]]:
    """``{worker: (first block, last block + 1)}`` of the workers that own row blocks."""
    out: dict[int, tuple[int, int]] = {}
    for b in range(blocks):
        w = owner(b, blocks)
        out[w] = (out[w][0], b + 1) if w in out else (b, b + 1)
    return out

def add(g: GraphBuilder, inputs: Inputs, envs: list[list[Any]], store: RunStore | None,
        progress: Progress | None) -> list[Any]:
    """Add pass 2 (from where ``progress`` says an earlier run stopped); returns the
    keys of the padded output cores, site by site."""
    p = _Pass2(g, inputs, envs, store, progress)
    env = p.resume()
    if p.sweep.pass2.split:
        parts = _Parts(whole=env)
        for j in range(p.first, 0, -1):
            parts = p.split_site(j, parts)
        p.out[0] = g.add((g.name("pass2", 0), "core"), K.first_core,
                         p.split_project(0, parts))
        return p.out
    z = None
    for j in range(p.first, 0, -1):
        if z is None:
            z = p.project(j, env)
        z, env = p.site(j, z)
    if z is None:
        z = p.project(0, env)
    p.out[0] = g.add((g.name("pass2", 0), "core"), K.first_core, z.keys)
    return p.out
