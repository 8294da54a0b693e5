"""The run store: a Zarr group that holds one SRC run on disk.

It bounds a run's memory by disk instead of RAM, and makes it restartable. As
zarr keeps metadata, stores and arrays apart, it comes in three layers:

- :mod:`._runlayout`: where each thing is (group and array names, attribute
  keys, the format's version);
- :class:`RunStore`: the store by path, as tasks read and write it — the path,
  the run id and the layout, nothing else, so it pickles small into tasks;
- :class:`OpenRun`: the client's side — the lock, the overwrite policy, the
  checks of what an earlier run left, the result.

Safety rules (docs/safety.md): a directory is replaced only if it
is a run store (its ``zarr.json`` says so), and then only the entries a run
writes are deleted; every array is verifiable (:mod:`._integrity`), and a resumed
run checks what an earlier one left and recomputes what is damaged; a lock
file keeps a second process out while a run is on; a result read lazily from
the store raises once another run has replaced it.

Workers read and write it by path, so it must be on a file system they share
(the local disk of a LocalCluster, a parallel file system under Slurm).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from . import _integrity, _paths, _random
from ._layout import dimension_names
from ._lock import StoreLock
from ._runlayout import LAYOUT, RunLayout, env_dims, eta_dims, right_env_dims
from ._stack import Stack
from .errors import DamagedDataError, OverwriteNeededError, PathRefusedError, StoreError
from .trains import RunInfo, TensorTrain
from .trains import _to_numpy as to_numpy

log = logging.getLogger("src_dask")

#: What a run store's ``format`` attribute says (``storage`` tells stores apart by it).
FORMAT = LAYOUT.format


@dataclass(frozen=True)
class Progress:
    """What an earlier, unfinished run left in the store."""

    pass1_done: tuple[bool, ...]  # per block of sketch columns
    pass2_next: int  # pass 2 still has to do sites pass2_next … 1 (n-1 when not started)

    @property
    def pass1_complete(self) -> bool:
        return all(self.pass1_done)


def planned_bytes(stack: Stack, sketch: int) -> int:
    """Disk a run will need: environments, two checkpoints of S, η and the result
    (plus metadata and a checksum per chunk)."""
    item = stack.dtype.itemsize
    envs = sum(sketch * math.prod(stack.left_bonds(j)) for j in range(1, stack.n))
    s_env = 2 * sketch * stack.widest_cut
    cores = 2 * sum(sketch * sketch * stack.up(j) * stack.down(j) for j in range(stack.n))
    return (envs + s_env + cores) * item + 2**16 * (stack.n + 1)


def check_path(store: Any) -> str:
    """The absolute, symlink-resolved path of a ``store`` argument; refuses what
    cannot be a store before anything is touched."""
    path = os.path.realpath(_paths.as_path(store, "store"))
    if os.path.lexists(path) and not os.path.isdir(path):
        raise PathRefusedError(f"{path}: is a file, not a run store directory")
    _paths.check_parent(path, path)
    if _paths.holds_working_directory(path):
        raise PathRefusedError(f"{path}: is the working directory or one of its parents; "
                               "name a directory of its own for the run store")
    return path


def read_attrs(path: str) -> dict | None:
    """The attributes of the Zarr group at ``path``; None for nothing or an empty
    directory; {} for a directory that is not a Zarr group."""
    if not os.path.isdir(path) or not [e for e in os.listdir(path) if e != LAYOUT.lock]:
        return None
    attrs = _paths.group_attrs(path)
    return {} if attrs is None else attrs


@dataclass(frozen=True)
class RunStore:
    """One run's store by path, as the tasks read and write it. It holds the path,
    the run id and the layout only, so a task carries a few hundred bytes: the
    lock, the overwrite policy and the checks of a resumed run stay with the
    client's :class:`OpenRun`. Workers open the arrays by path, so the store must
    be on a file system they share."""

    path: str
    run_id: str | None = None
    layout: RunLayout = LAYOUT

    def _group(self) -> zarr.Group:
        return zarr.open_group(self.path, mode="r+", use_consolidated=False)

    def write_env(self, site: int, start: int, env: Any) -> None:
        """Block ``start…`` of the sketched environment ``C_site`` (pass 1)."""
        arr = zarr.open_array(f"{self.path}/{self.layout.env_site(site)}", mode="r+")
        arr[start:start + env.shape[0]] = to_numpy(env)

    def read_env(self, site: int, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of ``C_site``, verified (pass 2)."""
        name = self.layout.env_site(site)
        arr = zarr.open_array(f"{self.path}/{name}", mode="r")
        return _integrity.read(arr, (slice(start, stop),),
                               what=f"{self.path}: {name} (site {site})", finite=False)

    def mark_block_done(self, block: int) -> None:
        """Block ``block``'s chain of pass 1 is written."""
        zarr.open_array(f"{self.path}/{self.layout.pass1_path}", mode="r+")[block] = 1

    def write_pass2(self, site: int, eta: Any, env_left: Any) -> None:
        """Checkpoint after site ``site``: η_site, then S_{site-1}, then the progress."""
        self.begin_pass2(site, eta, tuple(env_left.shape[1:]), rows=env_left.shape[0])
        self.write_pass2_rows(site, 0, env_left)
        self.end_pass2(site)

    def begin_pass2(self, site: int, eta: Any, left: tuple[int, ...],
                    rows: int | None = None) -> None:
        """The checkpoint of ``site`` begun: η_site written, S_{site-1} (η's rows by
        ``left``) made, to be written by rows (:meth:`write_pass2_rows`, by writers whose
        first rows are multiples of ``rows``, in chunks of rows that divide it) and
        completed by :meth:`end_pass2`."""

        group = self._group()
        _write_whole(group, self.layout.eta_site(site), eta, eta_dims(site))
        shape = (eta.shape[0], *left)
        chunks = _integrity.chunks_for((min(rows or shape[0], shape[0]), *left), eta.dtype.itemsize)
        if rows:  # chunks cut smaller for their bytes still divide the writers' blocks
            chunks = (math.gcd(chunks[0], rows), *chunks[1:])
        _integrity.create(group, self.layout.right_env_site(site - 1), shape, eta.dtype,
                          chunks, overwrite=True,
                          dimension_names=right_env_dims(site - 1, len(left)))

    def write_pass2_rows(self, site: int, start: int, rows: Any) -> None:
        """Rows ``start…`` of S_{site-1} (a block of them) into the begun checkpoint."""
        arr = self._group()[self.layout.right_env_site(site - 1)]
        arr[start:start + rows.shape[0]] = to_numpy(rows)

    def end_pass2(self, site: int) -> None:
        """The checkpoint of ``site`` complete: a resumed run starts at ``site - 1``."""
        group = self._group()
        group[self.layout.progress].attrs[self.layout.pass2_next] = site - 1
        if self.layout.right_env_site(site) in group:
            del group[self.layout.right_env_site(site)]

    def _read_whole(self, name: str, site: int) -> np.ndarray:
        try:
            arr = zarr.open_array(f"{self.path}/{name}", mode="r")
        except Exception as err:  # noqa: BLE001 - missing or unreadable: damaged
            raise DamagedDataError(f"{self.path}: {name} (site {site}) is missing or "
                                   "unreadable") from err
        return _integrity.read(arr, what=f"{self.path}: {name} (site {site})")

    def read_eta(self, site: int) -> np.ndarray:
        """η_site of pass 2's checkpoint, verified."""
        return self._read_whole(self.layout.eta_site(site), site)

    def read_right_env(self, site: int) -> np.ndarray:
        """S_site, the environment pass 2 resumes from, verified."""
        return self._read_whole(self.layout.right_env_site(site), site)

    def write_result(self, site: int, core: np.ndarray, kind: str, n: int) -> tuple[int, ...]:
        """Output core ``site`` in quimb's layout; returns its shape."""
        _write_whole(self._group(), self.layout.result_site(site), core,
                     dimension_names(kind, site, n))
        return tuple(core.shape)


class OpenRun:
    """A run store opened by the client (:meth:`prepare`): it holds the lock while
    the run is on, decides whether the store resumes, is refused or is replaced,
    checks what an earlier run left, and reads the result. The graph's tasks get
    :attr:`store` only."""

    def __init__(self, store: RunStore, lock: StoreLock | None = None) -> None:
        self.store = store
        self._lock = lock

    @property
    def path(self) -> str:
        return self.store.path

    @property
    def run_id(self) -> str | None:
        return self.store.run_id

    @property
    def layout(self) -> RunLayout:
        return self.store.layout

    @classmethod
    def prepare(cls, path: str, stack: Stack, fingerprint: dict, *,
                seed: int | None, sketch: int, chunk: int,
                overwrite: bool) -> tuple[OpenRun, Progress, int, int]:
        """Open or create the store at ``path`` (from :func:`check_path`) and lock it;
        returns it, the progress, the seed and the chunk. Call :meth:`release` when
        the run ends.

        A store made by other inputs or options is refused (unless ``overwrite``);
        a store of the same run resumes with its seed and chunk, after checking what
        the earlier run left. A directory that is not a run store is never touched.
        """
        attrs = read_attrs(path)
        running = os.path.exists(os.path.join(path, LAYOUT.lock))  # a run may be setting up
        if attrs is not None and attrs.get("format") != LAYOUT.format and not running:
            raise PathRefusedError(
                f"{path}: exists and is not a src_dask run store; src_dask does not replace "
                "it (choose another path, or remove it yourself)")
        if attrs is None:
            _paths.check_space(path, planned_bytes(stack, sketch), "the run store")
        made = not os.path.exists(path)
        os.makedirs(path, exist_ok=True)
        lock = StoreLock(path)
        try:
            lock.acquire()
        except BaseException:
            if made:
                shutil.rmtree(path, ignore_errors=True)
            raise
        try:
            return cls._open_locked(path, lock, stack, fingerprint, seed=seed,
                                    sketch=sketch, chunk=chunk, overwrite=overwrite, made=made)
        except BaseException:
            lock.release()
            if made and os.path.isdir(path) and not os.listdir(path):
                os.rmdir(path)
            raise

    @classmethod
    def _open_locked(cls, path: str, lock: StoreLock, stack: Stack, fingerprint: dict, *,
                     seed: int | None, sketch: int, chunk: int, overwrite: bool,
                     made: bool) -> tuple[OpenRun, Progress, int, int]:
        attrs = read_attrs(path)  # again: another process may have written it meanwhile
        if attrs is not None:
            if attrs.get("format") != LAYOUT.format:
                raise PathRefusedError(f"{path}: exists and is not a src_dask run store; "
                                       "src_dask does not replace it")
            problem = LAYOUT.problem(attrs)
            wanted = _jsonable({**fingerprint, "seed": attrs.get("seed") if seed is None
                                else seed})
            if problem is None and attrs["sites"] != stack.n:  # another run, not damaged
                wanted["sites"] = stack.n
            if problem is None and attrs["fingerprint"] == wanted:
                run = cls(RunStore(path, attrs["run_id"]), lock)
                return run, run._checked_progress(attrs, stack), attrs["seed"], attrs["chunk"]
            if not overwrite:
                raise _refusal(path, attrs, problem, wanted, stack.n)
            _paths.check_space(path, planned_bytes(stack, sketch), "the run store")
            _remove_run(path)
        return cls._create(path, lock, stack, fingerprint, seed=seed, sketch=sketch,
                           chunk=chunk)

    @classmethod
    def _create(cls, path: str, lock: StoreLock, stack: Stack, fingerprint: dict, *,
                seed: int | None, sketch: int, chunk: int) -> tuple[OpenRun, Progress, int, int]:
        """A new store; on any failure nothing of it stays behind."""
        if seed is None:
            seed = _random.draw_seed()
        run_id = uuid.uuid4().hex
        layout = LAYOUT
        try:
            # ours from the start (an interrupted set-up can be replaced with overwrite),
            # but whole only once the last attributes are written
            group = zarr.open_group(path, mode="a", attributes={
                "format": layout.format, "version": layout.version, "run_id": run_id,
                layout.complete: False})
            for j in range(1, stack.n):
                bonds = stack.left_bonds(j)
                _integrity.create(group, layout.env_site(j), (sketch, *bonds), stack.dtype,
                                  (chunk, *bonds), dimension_names=env_dims(j, len(bonds)))
            blocks = math.ceil(sketch / chunk)
            progress = group.create_group(layout.progress)
            _integrity.create(progress, layout.pass1, (blocks,), "int8", (1,))[...] = 0
            progress.attrs[layout.pass2_next] = stack.n - 1
            # the group's attributes last: only a whole store reads as a run store
            group.attrs.update({"format": layout.format, "version": layout.version,
                                "run_id": run_id,
                                "fingerprint": _jsonable({**fingerprint, "seed": seed}),
                                "seed": seed, "sketch": sketch, "chunk": chunk,
                                "sites": stack.n, "bytes_planned": planned_bytes(stack, sketch),
                                layout.complete: False})
        except BaseException:
            _remove_run(path)
            raise
        return (cls(RunStore(path, run_id, layout), lock),
                Progress((False,) * blocks, stack.n - 1), seed, chunk)

    def _checked_progress(self, attrs: dict, stack: Stack) -> Progress:
        """What an earlier run left, verified: blocks of pass 1 whose environments
        are missing or damaged are done again, and pass 2 starts over when its
        checkpoint is damaged. A store marked complete must hold its whole result."""
        n, layout = stack.n, self.layout
        group = self._open_group("r")
        blocks = math.ceil(attrs["sketch"] / attrs["chunk"])
        if attrs[layout.complete]:
            for j in range(n):
                lost = _integrity.missing_chunks(self._array(group, layout.result_site(j)))
                if lost:
                    raise DamagedDataError(f"{self.path}: {layout.result_site(j)} (site {j}): "
                                           f"{len(lost)} chunk(s) missing; pass "
                                           "overwrite=True to compute the run anew")
            return Progress((True,) * blocks, 0)
        try:
            done = _integrity.read(self._array(group, layout.pass1_path),
                                   what=f"{self.path}: {layout.pass1_path}")
            if done.shape != (blocks,):
                raise DamagedDataError(f"pass1 has shape {done.shape}, expected ({blocks},)")
        except DamagedDataError as err:
            log.warning("src: %s; redoing pass 1", err)
            done = np.zeros(blocks)
        pass1 = [bool(v) and self._block_intact(group, c, n) for c, v in enumerate(done)]
        nxt = (group[layout.progress].attrs.get(layout.pass2_next)
               if layout.progress in group else None)
        if not isinstance(nxt, int) or isinstance(nxt, bool) or not 0 <= nxt <= n - 1:
            raise OverwriteNeededError(
                f"{self.path}: the run store's metadata is damaged (progress "
                f"{layout.pass2_next} is {nxt!r}, expected an int in 0…{n - 1})",
                "pass overwrite=True to start the run anew")
        if nxt < n - 1 and not self._pass2_intact(nxt, n):
            nxt = n - 1
        return Progress(tuple(pass1), nxt)

    def _block_intact(self, group: zarr.Group, block: int, n: int) -> bool:
        """Whether block ``block``'s environments are all there and decode."""
        chunk = group.attrs["chunk"]
        rows = slice(block * chunk, (block + 1) * chunk)
        for j in range(1, n):
            name = self.layout.env_site(j)
            try:
                arr = self._array(group, name)
                _integrity.read(arr, (rows,), what=f"{self.path}: {name}", finite=False)
            except DamagedDataError as err:
                log.warning("src: %s (block %d of pass 1); recomputing the block", err, block)
                return False
        return True

    def _pass2_intact(self, nxt: int, n: int) -> bool:
        """Whether pass 2's checkpoint (η of the sites done, S to resume from) reads."""
        try:
            for j in range(nxt + 1, n):
                self.store.read_eta(j)
            self.store.read_right_env(nxt)
        except DamagedDataError as err:
            log.warning("src: %s; pass 2 starts over", err)
            return False
        return True

    def _array(self, group: zarr.Group, name: str) -> Any:
        try:
            return group[name]
        except KeyError:
            raise DamagedDataError(f"{self.path}: {name} is missing from the run store"
                                   ) from None

    def _open_group(self, mode: str) -> zarr.Group:
        try:
            return zarr.open_group(self.path, mode=mode, use_consolidated=False)
        except Exception as err:  # noqa: BLE001 - any failure here is a damaged store
            raise StoreError(f"{self.path}: cannot open the run store "
                             f"({type(err).__name__}: {err})") from err

    def release(self) -> None:
        """Give up the lock (the end of the run, however it ended)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def is_complete(self) -> bool:
        return bool((read_attrs(self.path) or {}).get(self.layout.complete))

    def mark_complete(self) -> None:
        """Written last: from here on the store reads as a finished result; its metadata is
        then consolidated, so that its result opens in one read (xarray too)."""
        self._open_group("r+").attrs[self.layout.complete] = True
        # then (an optimisation, not a mark: src_dask never reads through it) in one read
        _integrity.consolidate(self.path, self.layout.result)  # zarr.open_group(".../result")
        _integrity.consolidate(self.path)  # xarray.open_zarr(path, group="result")

    def write_discarded(self, weights: list[float] | None) -> None:
        """The weights the rounding discarded, per bond (None: no rounding), kept with
        the result so that a finished store returns them too."""
        self._open_group("r+")[self.layout.result].attrs[self.layout.discarded] = weights

    def result(self, kind: str, quimb_ids: dict[str, str] | None = None) -> TensorTrain:
        """The output train, as Dask arrays over the result's arrays: read through
        checksums, and refused once another run has replaced this one; with the run's
        seed and discarded weights, and the quimb names ``quimb_ids``
        (:class:`~src_dask.trains.RunInfo`)."""
        group, layout = self._open_group("r"), self.layout
        guard = _SameRun(self.path, self.run_id)
        verified = [_integrity.VerifiedArray(self._array(group, layout.result_site(j)),
                                             f"{self.path}: {layout.result_site(j)} (site {j})",
                                             guard)
                    for j in range(group.attrs["sites"])]
        info = RunInfo(seed=group.attrs["seed"], quimb_ids=quimb_ids,
                       discarded=group[layout.result].attrs.get(layout.discarded))
        return TensorTrain([_integrity.to_dask(v) for v in verified], kind, name=self.path,
                           sources=verified, run_info=info)


def _refusal(path: str, attrs: dict, problem: str | None, wanted: dict,
             sites: int) -> OverwriteNeededError:
    """Why a store of another run (or with damaged metadata) is not replaced without
    ``overwrite``: the damage, or the options it differs in."""
    if problem is not None:
        return OverwriteNeededError(f"{path}: the run store's metadata is damaged ({problem})",
                                    "pass overwrite=True to start the run anew")
    stored = {**attrs["fingerprint"], "sites": attrs["sites"]}
    diff = sorted(k for k in set(stored) | set(wanted)
                  if k in wanted and stored.get(k) != wanted.get(k))
    if "sites" in diff:
        diff[diff.index("sites")] = f"sites: it holds {attrs['sites']}, this run has {sites}"
    return OverwriteNeededError(f"{path}: holds a run of other inputs or options "
                                f"(differs in {', '.join(diff)})")


def describe(path: str) -> dict[str, Any]:
    """What the run store at ``path`` holds, as plain data (for ``src-dask info``):
    options, inputs (kinds, bonds, legs), progress, and the result once complete.
    A store whose metadata does not add up is one :class:`StoreError`."""
    attrs = read_attrs(path)
    if not attrs or attrs.get("format") != LAYOUT.format:
        raise StoreError(f"{path}: not a src_dask run store")
    problem = LAYOUT.problem(attrs)
    if problem is not None:
        raise StoreError(f"{path}: the run store's metadata is damaged ({problem})")
    fingerprint = dict(attrs["fingerprint"])
    try:
        inputs = [_describe_input(kind, transpose, sites)
                  for kind, transpose, sites in fingerprint.pop("inputs", [])]
    except (TypeError, ValueError, IndexError) as err:
        raise StoreError(f"{path}: the run store's inputs record is damaged ({err})") from None
    run = OpenRun(RunStore(path, attrs["run_id"]))  # read only: no lock
    group = run._open_group("r")
    try:
        pass1 = [bool(v) for v in _integrity.read(run._array(group, LAYOUT.pass1_path),
                                                  what=f"{path}: {LAYOUT.pass1_path}")]
        nxt = group[LAYOUT.progress].attrs.get(LAYOUT.pass2_next)
    except (DamagedDataError, KeyError):
        pass1, nxt = [], None
    info: dict[str, Any] = {
        "path": path, "what": "run store", "complete": attrs[LAYOUT.complete],
        "options": fingerprint, "seed": attrs["seed"], "sketch": attrs["sketch"],
        "chunk": attrs["chunk"], "sites": attrs["sites"], "inputs": inputs,
        "pass1_blocks_done": sum(pass1), "pass1_blocks": len(pass1),
        "pass2_next_site": nxt if isinstance(nxt, int) else attrs["sites"] - 1,
        "bytes_planned": attrs.get("bytes_planned")}
    if attrs[LAYOUT.complete]:
        kind = "mps" if any(i["kind"] == "mps" for i in inputs) else "mpo"
        result = run.result(kind)
        info["result"] = {"kind": kind, "bond_dims": result.bond_dims,
                          "dtype": result.dtype.name, "bytes": result.nbytes}
    return info


def _describe_input(kind: str, transpose: bool, sites: list) -> dict[str, Any]:
    """One input of a run, from its fingerprint: kind, bonds and physical legs."""
    shapes = [shape for shape, _token in sites]
    legs = 2 if kind == "mpo" else 1
    return {"kind": kind, "transposed": bool(transpose), "sites": len(shapes),
            "bond_dims": [s[0] if j == 0 else s[1] for j, s in enumerate(shapes[:-1])],
            "phys_dims": [s[-legs:] for s in shapes]}


class _SameRun:
    """Raises when the store at ``path`` no longer holds the finished run ``run_id``
    (called before each read of a lazily returned result)."""

    def __init__(self, path: str, run_id: str | None) -> None:
        self.path, self.run_id = path, run_id

    def __call__(self) -> None:
        attrs = read_attrs(self.path) or {}
        if attrs.get("run_id") != self.run_id or not attrs.get(LAYOUT.complete):
            raise StoreError(f"{self.path}: the run store was replaced or changed since this "
                             "result was returned; its data is gone (compute() results you "
                             "want to keep, or save them with src_dask.save)")


def _remove_run(path: str) -> None:
    """Delete what a run writes at ``path`` (and nothing else: not the lock, not
    files someone else put there)."""
    for name in LAYOUT.entries:
        where = os.path.join(path, name)
        if os.path.isdir(where) and not os.path.islink(where):
            _rmtree(where)
        elif os.path.lexists(where):
            os.remove(where)
    left = [e for e in os.listdir(path) if e != LAYOUT.lock] if os.path.isdir(path) else []
    if left:
        log.warning("src: %s: kept %d entries that a run does not write (%s)", path, len(left),
                    ", ".join(sorted(left)[:5]))


def _rmtree(where: str, tries: int = 5) -> None:
    """``shutil.rmtree``, tried again while files keep appearing (a task of an
    interrupted run on a cluster finishing its chunk); then one clear error."""
    for attempt in range(tries):
        try:
            shutil.rmtree(where)
            return
        except FileNotFoundError:
            return
        except OSError as err:  # "Directory not empty": something is still writing
            if attempt == tries - 1:
                raise StoreError(f"{where}: cannot be removed ({err.strerror}); is a task of "
                                 "an earlier run still writing there? Try again once it "
                                 "has stopped") from err
            time.sleep(0.2 * (attempt + 1))


def _write_whole(group: zarr.Group, name: str, x: Any,
                 dims: tuple[str, ...] | None = None) -> None:

    x = to_numpy(x)
    arr = _integrity.create(group, name, x.shape, x.dtype,
                            _integrity.chunks_for(x.shape, x.dtype.itemsize), overwrite=True,
                            dimension_names=dims)
    arr[...] = x


def _jsonable(x: Any) -> Any:
    """``x`` as it reads back from JSON attributes (tuples become lists)."""
    return json.loads(json.dumps(x))
