"""The run store: a Zarr group that holds one SRC run on disk.

It bounds a run's memory by disk instead of RAM, and makes it restartable::

    store/                    attrs: format "src_dask.run", version, fingerprint
                              (inputs and options), seed, sketch, chunk, sites,
                              complete (written last: only then is it a result)
    store/env/site_j          C_j, (s, a_1, …, a_k), chunked along s by blocks
                              of sketch columns; written by pass 1, read by pass 2
    store/progress            attrs: pass2_next (the next site pass 2 will do);
                              array pass1[c] = 1 once block c's chain is written
    store/eta/site_j          η_j, the padded output core of pass 2 at site j
    store/S/site_j            the right environment pass 2 resumes from
    store/result/site_j       the output cores in quimb's layout

Workers read and write it by path, so it must be on a file system they share
(the local disk of a LocalCluster, a parallel file system under Slurm).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from ._stack import Stack
from .trains import TensorTrain
from .trains import _to_numpy as to_numpy

FORMAT = "src_dask.run"
VERSION = 1


@dataclass(frozen=True)
class Progress:
    """What an earlier, unfinished run left in the store."""

    pass1_done: tuple[bool, ...]  # per block of sketch columns
    pass2_next: int  # pass 2 still has to do sites pass2_next … 1 (n-1 when not started)

    @property
    def pass1_complete(self) -> bool:
        return all(self.pass1_done)


def planned_bytes(stack: Stack, sketch: int) -> int:
    """Disk a run will need: environments, two checkpoints of S, η and the result."""
    item = stack.dtype.itemsize
    envs = sum(sketch * math.prod(stack.left_bonds(j)) for j in range(1, stack.n))
    s_env = 2 * max(sketch * math.prod(stack.left_bonds(j)) for j in range(stack.n))
    cores = 2 * sum(sketch * sketch * stack.up(j) * stack.down(j) for j in range(stack.n))
    return (envs + s_env + cores) * item


def _check_disk(path: str, need: int) -> None:
    """Fail early, naming the path, where the store cannot be written or would not fit."""
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent) or "."
    probe = os.path.join(parent, f".src_dask-probe-{uuid.uuid4().hex}")
    try:
        with open(probe, "wb"):
            pass
        os.remove(probe)
    except OSError as err:
        raise OSError(err.errno, f"{path}: the run store cannot be written there "
                                 f"({err.strerror}); it needs {need} bytes") from err
    free = shutil.disk_usage(parent).free
    if free < need:
        raise OSError(28, f"{path}: the run store needs {need} bytes but only {free} are free")


class RunStore:
    """One run's store, opened by the client and (by path) by the workers."""

    def __init__(self, path: str):
        self.path = path

    # -- client side ------------------------------------------------------
    @classmethod
    def prepare(cls, path: str | os.PathLike, stack: Stack, fingerprint: dict, *,
                seed: int | None, sketch: int, chunk: int,
                overwrite: bool) -> tuple[RunStore, Progress, int, int]:
        """Open or create the store; returns it, the progress, the seed and the chunk.

        A store made by other inputs or options is refused (unless
        ``overwrite``); a store of the same run resumes with its seed and chunk.
        """
        path = os.path.abspath(os.fspath(path))
        attrs = _read_attrs(path)
        if attrs is not None and not overwrite:
            if attrs.get("format") != FORMAT:
                raise ValueError(f"{path}: exists and is not a src_dask run store; "
                                 "pass overwrite=True to replace it")
            stored = attrs["fingerprint"]
            if seed is None:
                fingerprint = {**fingerprint, "seed": stored.get("seed")}
            if stored != _jsonable(fingerprint):
                diff = sorted(k for k in set(stored) | set(fingerprint)
                              if stored.get(k) != _jsonable(fingerprint).get(k))
                raise ValueError(f"{path}: holds a run of other inputs or options (differs in "
                                 f"{', '.join(diff)}); pass overwrite=True to replace it")
            store = cls(path)
            return store, store._progress(attrs), attrs["seed"], attrs["chunk"]

        need = planned_bytes(stack, sketch)
        _check_disk(path, need)
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> 1)
        fingerprint = {**fingerprint, "seed": seed}
        group = zarr.open_group(path, mode="w")
        group.attrs.update({"format": FORMAT, "version": VERSION,
                            "fingerprint": _jsonable(fingerprint), "seed": seed,
                            "sketch": sketch, "chunk": chunk, "sites": stack.n,
                            "bytes_planned": need, "complete": False})
        for j in range(1, stack.n):
            bonds = stack.left_bonds(j)
            group.create_array(f"env/site_{j}", shape=(sketch, *bonds), dtype=stack.dtype,
                               chunks=(chunk, *bonds), compressors=None)
        blocks = math.ceil(sketch / chunk)
        progress = group.create_group("progress")
        progress.create_array("pass1", shape=(blocks,), chunks=(1,), dtype="int8",
                              fill_value=0)
        progress.attrs["pass2_next"] = stack.n - 1
        return cls(path), Progress((False,) * blocks, stack.n - 1), seed, chunk

    def _progress(self, attrs: dict) -> Progress:
        group = zarr.open_group(self.path, mode="r")
        done = tuple(bool(v) for v in group["progress/pass1"][...])
        return Progress(done, int(group["progress"].attrs["pass2_next"]))

    def is_complete(self) -> bool:
        return bool(_read_attrs(self.path).get("complete"))

    def mark_complete(self) -> None:
        """Written last: from here on the store reads as a finished result."""
        zarr.open_group(self.path, mode="r+").attrs["complete"] = True

    def result(self, kind: str) -> TensorTrain:
        """The output train, as Dask arrays over ``result/site_j``."""
        import dask.array as da

        group = zarr.open_group(self.path, mode="r")
        arrays = [group[f"result/site_{j}"] for j in range(group.attrs["sites"])]
        return TensorTrain([da.from_zarr(a) for a in arrays], kind, name=self.path,
                           sources=arrays)

    # -- worker side (inside tasks) ---------------------------------------------
    def _group(self) -> zarr.Group:
        return zarr.open_group(self.path, mode="r+")

    def write_env(self, site: int, start: int, env: Any) -> None:
        arr = zarr.open_array(f"{self.path}/env/site_{site}", mode="r+")
        arr[start:start + env.shape[0]] = to_numpy(env)

    def read_env(self, site: int, start: int, stop: int) -> np.ndarray:
        return zarr.open_array(f"{self.path}/env/site_{site}", mode="r")[start:stop]

    def mark_block_done(self, block: int) -> None:
        zarr.open_array(f"{self.path}/progress/pass1", mode="r+")[block] = 1

    def write_pass2(self, site: int, eta: Any, env_left: Any) -> None:
        """Checkpoint after site ``site``: η_site, then S_{site-1}, then the progress."""
        group = self._group()
        _write_whole(group, f"eta/site_{site}", eta)
        _write_whole(group, f"S/site_{site - 1}", env_left)
        group["progress"].attrs["pass2_next"] = site - 1
        if f"S/site_{site}" in group:
            del group[f"S/site_{site}"]

    def read_eta(self, site: int) -> np.ndarray:
        return zarr.open_array(f"{self.path}/eta/site_{site}", mode="r")[...]

    def read_right_env(self, site: int) -> np.ndarray:
        return zarr.open_array(f"{self.path}/S/site_{site}", mode="r")[...]

    def write_result(self, site: int, core: np.ndarray) -> tuple[int, ...]:
        _write_whole(self._group(), f"result/site_{site}", core)
        return tuple(core.shape)


def _write_whole(group: zarr.Group, name: str, x: Any) -> None:
    from .storage import chunks_for

    x = to_numpy(x)
    arr = group.create_array(name, shape=x.shape, dtype=x.dtype, overwrite=True,
                             chunks=chunks_for(x.shape, x.dtype.itemsize), compressors=None)
    arr[...] = x


def _read_attrs(path: str) -> dict | None:
    """The group attributes at ``path``; None when nothing is there."""
    if not os.path.exists(path):
        return None
    if os.path.isdir(path) and not os.listdir(path):
        return None
    try:
        return dict(zarr.open_group(path, mode="r").attrs)
    except Exception:  # noqa: BLE001 - anything unreadable is "not a run store"
        return {}


def _jsonable(x: Any) -> Any:
    """``x`` as it reads back from JSON attributes (tuples become lists)."""
    return json.loads(json.dumps(x))
