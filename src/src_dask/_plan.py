"""Every sizing, placement and fusion decision of a run, made in one place.

:class:`Plan` holds the numbers a run is asked for (sketch width, block of
columns, seed key, device, …); :class:`SweepPlan` adds what follows from them,
the stack and the cluster — how far ahead inputs are read, how each projected
core is cut, where pass 2 runs and how its tasks are fused — so the graph
builder only follows decisions and never makes one. Each function here is
small, pure and unit-tested.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

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


@dataclass(frozen=True)
class Pass2:
    """Where pass 2 runs, for the whole sweep.

    ``split``: several workers share every site of pass 2 by rows of ``Z``
    (docs/design.md §8): each projects its rows, sketches them against the whole
    ``C_j`` (the blocks it did not make in pass 1 are copied to it ahead of use),
    the sketch pieces meet in one QR, and each worker forms its share of
    ``S_{j-1}``, sent by rows to the worker that projects them next. The default
    on several GPU workers (config ``pass2-split``: ``auto``).
    ``home``: several GPUs without the split — all of pass 2 on the first
    worker, which fetches the others' blocks of ``C_j`` ahead of use.
    ``together``: pass 2 runs in one place (a GPU or a single worker), so a site
    whose ``Z`` is whole is one task: on a distributed cluster each dependent
    task costs a scheduler round trip, more than a small site's GEMMs; Dask's
    local schedulers on a CPU keep the pieces as tasks, which its threads run
    side by side. ``spread``: CPU workers share ``Z``'s row blocks, summing
    ``S_{j-1}`` along them. ``pieces_at_env``: a CPU multiplies a block where
    the block of ``C_j`` lives; a GPU multiplies so fast that moving data
    dominates, so ``C_j`` goes to ``Z`` (smaller by the physical legs).
    """

    home: bool
    together: bool
    spread: bool
    pieces_at_env: bool
    split: bool = False

    @classmethod
    def decide(cls, device: str, workers: int, groups: int, split: Any = "auto") -> Pass2:
        """For a run on ``device`` with ``workers`` workers, ``groups`` of which
        prepare their own inputs (:func:`input_groups`); ``split`` (config
        ``pass2-split``): ``True``, ``False`` or ``"auto"`` (on several GPUs)."""
        gpu = device == "gpu"
        if workers > 1 and (split is True or (split == "auto" and gpu)):
            return cls(home=False, together=False, spread=False, pieces_at_env=False,
                       split=True)
        return cls(home=groups > 1, together=gpu or workers == 1,
                   spread=not gpu and workers > 1, pieces_at_env=not gpu)

    def step(self, z_here: int, z_left: int) -> SiteStep:
        """The step at a site whose ``Z`` has ``z_here`` row blocks, the next site's
        ``z_left`` (not split pass 2)."""
        chain = z_here > 1 and self.spread
        return SiteStep(fused=self.together and z_here == 1, chain=chain,
                        whole=not chain and z_left == 1)


@dataclass(frozen=True)
class SweepPlan:
    """A :class:`Plan` with everything that follows from it for one stack and one
    set of workers (see :meth:`decide`)."""

    plan: Plan
    workers: tuple[str, ...]
    groups: int  # workers that prepare their own copy of the inputs
    copy_inputs: bool  # each site read by one of them, copied to the others (a fast link)
    own_streams: bool  # each task's kernels on a stream of its own, waited for (own_streams)
    lookahead: int  # sites ahead of their use that inputs are read
    z_blocks: tuple[int, ...]  # row blocks of each site's projected core
    pass2: Pass2

    @classmethod
    def decide(cls, stack: Stack, plan: Plan, workers: list[str] | None) -> SweepPlan:
        workers = tuple(workers or ())
        groups = input_groups(plan.device, len(workers))
        split = config.get_choice("pass2-split", ("auto", True, False))
        pass2 = Pass2.decide(plan.device, len(workers), groups, split)
        blocks = [z_blocks(stack, plan, j) for j in range(stack.n)]
        if pass2.split:  # at least one row block of Z per worker
            blocks = [max(b, min(z_rows(stack, plan, j), len(workers)))
                      for j, b in enumerate(blocks)]
        return cls(plan=plan, workers=workers, groups=groups,
                   copy_inputs=copy_inputs(plan.device, workers),
                   own_streams=own_streams(plan.device, workers),
                   lookahead=lookahead(stack, plan), z_blocks=tuple(blocks), pass2=pass2)


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


def default_chunk(stack: Stack, sketch: int, slots: int) -> int:
    """Columns per block: one block per worker thread (``slots``; per GPU on a GPU
    run: a GPU runs one block's GEMMs at a time, the larger the better), none over
    the config's ``block-size``."""
    per_column = max(math.prod(stack.left_bonds(j)) for j in range(stack.n))
    per_column *= stack.dtype.itemsize
    blocks = max(slots, math.ceil(sketch * per_column / config.get_bytes("block-size")))
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


# -- the graph's shape ---------------------------------------------------------------------
def input_groups(device: str, workers: int) -> int:
    """How many workers prepare their own copy of the inputs: every GPU worker
    (moving a core between GPUs costs more than reading it again), one otherwise
    (each lazy core is read once per pass)."""
    return workers if device == "gpu" and workers > 1 else 1


def copy_inputs(device: str, workers: tuple[str, ...]) -> bool:
    """Whether each site's cores are read by one GPU worker and copied to the others
    over the link, rather than read again by each (config ``copy-inputs``; ``auto``:
    where Dask's comm between the workers is UCX — CUDA IPC over NVLink, ~170 GB/s,
    docs/design.md §6.2 — a copy costs milliseconds and halves the reading; over TCP,
    ~1 GB/s, reading again is faster)."""
    want = config.get_choice("copy-inputs", ("auto", True, False))
    if device != "gpu" or len(workers) < 2:
        return False
    return all(str(w).startswith("ucx://") for w in workers) if want == "auto" else want


def own_streams(device: str, workers: tuple[str, ...]) -> bool:
    """Whether each task runs its kernels on a non-blocking stream of its thread and
    waits for them before it ends: on several GPU workers. Dask's UCX comm
    synchronizes the default stream before it sends GPU data, on the worker's event
    loop, so with kernels queued there every transfer (and every message of that
    worker meanwhile) would wait for the whole queue of its GPU; kernels on
    non-blocking streams are not waited for, and a task's result is complete when
    it ends. One GPU keeps tasks that only queue kernels (nothing is sent)."""
    return device == "gpu" and len(workers) > 1


def row_owner(block: int, blocks: int, workers: int) -> int:
    """The worker (index) that owns row block ``block`` of ``blocks`` in split pass 2:
    consecutive blocks per worker, so each owns one contiguous range of rows."""
    return block * workers // blocks


def lookahead(stack: Stack, plan: Plan) -> int:
    """How many sites ahead of their use inputs are read: enough that reads overlap
    each other and the contractions, within ``2 * plan.z_block_bytes`` of inputs
    in flight (2 to 8 sites)."""
    site_bytes = max(sum(math.prod(s) for s in stack.shapes(j)) for j in range(stack.n))
    return max(2, min(8, 2 * plan.z_block_bytes // max(1, site_bytes * stack.dtype.itemsize)))


def z_blocks(stack: Stack, plan: Plan, site: int) -> int:
    """Row blocks of the projected core ``Z`` at ``site``: enough to keep each within
    ``plan.z_block_bytes``. (Its rows, the bond right of the site, may come out
    fewer than this bound with a cutoff; blocks then come out smaller or empty.)"""
    rows = z_rows(stack, plan, site)
    nbytes = (math.prod(stack.left_bonds(site)) * rows * stack.up(site) * stack.down(site)
              * stack.dtype.itemsize)
    return max(1, min(rows, math.ceil(nbytes / plan.z_block_bytes)))


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
