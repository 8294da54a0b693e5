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
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.delayed import Delayed

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


def _task(func, *args, key: tuple, **kwargs) -> Delayed:
    return dask.delayed(func, pure=True)(*args, dask_key_name=key, **kwargs)


def build(stack: Stack, plan: Plan) -> list[Delayed]:
    """Delayed output cores (quimb layouts, host arrays) of SRC on ``stack``."""
    token = uuid.uuid4().hex
    n = stack.n

    def name(step: str, j: int) -> str:
        return f"src_{step}_site{j}-{token}"

    cores = []
    for j in range(n):
        site = []
        for i, f in enumerate(stack.factors):
            block = _lazy(f.train[j])
            site.append(_task(K.prepare_core, block, kind=f.train.kind, site=j, n=n,
                              transpose=f.transpose, dtype=stack.dtype,
                              check=not K.is_in_memory(block), name=f.train.name,
                              key=(name("load", j), i)))
        cores.append(site)

    # Pass 1: C_1 … C_{n-1}, one independent chain per block of columns.
    envs: list[list[Delayed | None]] = [[None] * len(plan.blocks) for _ in range(n)]
    for c, (start, stop) in enumerate(plan.blocks):
        env = None
        for j in range(n - 1):
            env = _task(K.sketch_step, env, cores[j], plan.key, j, start, stop,
                        key=(name("pass1", j), c))
            envs[j + 1][c] = env

    # Pass 2: right to left, QR of the sketch and projection.
    out: list[Any] = [None] * n
    env_right = None
    for j in range(n - 1, 0, -1):
        z = _task(K.project_core, cores[j], env_right, key=(name("pass2", j), "project"))
        pieces = [_task(K.sketch_piece, envs[j][c], z, key=(name("pass2", j), "sketch", c))
                  for c in range(len(plan.blocks))]
        out[j] = _task(K.orthonormalize, pieces, stack.up(j), stack.down(j), plan.cutoff,
                       stack.max_rank(j), key=(name("pass2", j), "qr"))
        env_right = _task(K.update_env, out[j], z, key=(name("pass2", j), "update"))
    out[0] = _task(K.first_core, _task(K.project_core, cores[0], env_right,
                                       key=(name("pass2", 0), "project")),
                   key=(name("pass2", 0), "core"))

    if plan.round:
        carry = None
        for j in range(n):
            step = _task(K.round_step, carry, out[j], plan.chi_out, plan.cutoff, j == n - 1,
                         key=(name("round", j), "svd"))
            out[j] = _task(operator.getitem, step, 0, key=(name("round", j), "core"))
            carry = _task(operator.getitem, step, 1, key=(name("round", j), "carry"))

    return [_task(_to_host, o, stack.kind, j, n, key=name("result", j)) for j, o in enumerate(out)]


def _to_host(core: Any, kind: str, site: int, n: int) -> np.ndarray:
    """An output core in quimb's layout as a NumPy array for the client."""
    core = K.unpad(core, kind, site, n)
    if K.xp_of(core) is not np:
        core = core.get()
    return np.ascontiguousarray(core)
