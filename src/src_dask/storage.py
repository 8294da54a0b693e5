"""Trains on disk: one Zarr v3 group per train, one array per site.

Layout of a saved train::

    path/                   zarr group, attributes:
        format   "src_dask.train"   version  2
        kind     "mps" | "mpo"      sites    n
        layout   "lrp" | "lrud"     (end sites drop the missing bond)
        id       a fresh hex id per save
        complete True, set last: the mark of a finished save
    path/site_0 … site_{n-1}        the cores, chunked so no chunk exceeds
                                    ``max_chunk_bytes`` (default 256 MiB), with a
                                    CRC32C checksum per chunk (``_integrity``) and
                                    the train's id as attribute ``train_id``

:func:`save` writes into a hidden sibling ``.<name>.partial-<tag>`` and renames it
into place only when every site is written, so an interrupted save leaves the old
train (if any) as it was and never a complete-looking new one. It replaces only an
empty directory or, with ``overwrite=True``, a train it wrote: never anything else.

:func:`open` gives a TensorTrain of Dask arrays over these arrays: nothing is
read until a core is computed, so opening a 50 GB train costs no memory. Every
read is verified: a missing or damaged chunk, NaN or inf, or a train saved over
since it was opened raises (:mod:`src_dask.errors`) instead of giving numbers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import operator
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from . import _info, _integrity, _paths
from ._info import Info
from ._integrity import MAX_CHUNK_BYTES, chunks_for
from ._layout import RANKS, dimension_names, role
from .errors import PathRefusedError, StoreError
from .trains import TensorTrain, _to_numpy, as_train

FORMAT = "src_dask.train"
VERSION = 2
#: A stack of trains (the factors of a product): a group whose attribute ``factors``
#: names its trains, leftmost first, each saved in the folder of that name inside it.
STACK_FORMAT = "src_dask.stack"
_STACK_VERSION = 1
#: Attributes :func:`save` and :func:`save_stack` write themselves (not in ``attrs=``).
_RESERVED = {"format", "version", "kind", "sites", "layout", "id", "complete", "factors"}
_LAYOUT = {"mps": "lrp", "mpo": "lrud"}


def _zarr():
    import zarr

    return zarr


# -- paths ------------------------------------------------------------------------------
def _is_train(path: str) -> bool:
    """Whether ``path`` holds what :func:`save` or :func:`save_stack` wrote (a train or
    a stack of them): what they may replace."""
    attrs = _paths.group_attrs(path)
    return attrs is not None and attrs.get("format") in (FORMAT, STACK_FORMAT)


def check_writable(path: str | os.PathLike, overwrite: bool = False, *,
                   apart_from: Mapping[str, Any] | None = None,
                   nbytes: int | None = None) -> None:
    """Raise before any work if :func:`save` or :func:`save_stack` could not write
    ``path``: :class:`~src_dask.errors.PathRefusedError` for what src_dask does not
    replace (a file, a directory of other things, the working directory or one of
    its parents, a parent that is a file), or for a path that is, is inside or
    contains what ``apart_from`` names (label: a train whose stores are read, or a
    directory) — a result written there would destroy data still being read;
    ``FileExistsError`` for a train or stack already there without ``overwrite``;
    an ``OSError`` where ``nbytes`` would not fit its file system."""
    path = _paths.as_path(path)
    target = os.path.realpath(path)
    _check_target(path, target, overwrite)  # the working directory among what it refuses
    _paths.check_parent(target, path)
    for label, what in (apart_from or {}).items():
        dirs = ({label: os.path.realpath(os.fspath(what))}
                if isinstance(what, (str, os.PathLike)) else _paths.train_dirs(what, label))
        _paths.check_apart(target, dirs, path)
    if nbytes is not None:
        _paths.check_space(target, nbytes, "the train")


def open_trains(*paths: str | os.PathLike) -> list[TensorTrain]:
    """The trains saved at ``paths`` (:func:`save`), leftmost factor first, a stack
    (:func:`save_stack`) expanding to its factors; each opened as :func:`open` does
    (lazily). A path that holds no train is a ``FileNotFoundError`` or a
    :class:`~src_dask.errors.StoreError` naming it, before anything is read."""
    from . import _runstore

    trains: list[TensorTrain] = []
    for given in paths:
        path = _paths.as_path(given)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such file or directory")
        attrs = _paths.group_attrs(path) if os.path.isdir(path) else None
        fmt = None if attrs is None else attrs.get("format")
        if fmt == STACK_FORMAT:
            trains += open_stack(path).values()
        elif fmt == FORMAT:
            trains.append(open(path))
        elif fmt == _runstore.FORMAT:
            raise StoreError(f"{path}: is a run store, not a train (a run's result is "
                             "what src returns; save it with src_dask.save)")
        else:
            raise StoreError(f"{path}: not a src_dask train (write one with src_dask.save) or "
                             "'src-dask generate'")
    return trains


def _check_target(path: str, target: str, overwrite: bool) -> str:
    """What is at ``target`` (the real path of ``path``): ``"absent"``, ``"empty"``
    (an empty directory) or ``"train"`` (a train or stack that ``overwrite`` allows
    replacing); raises for anything that must not be replaced."""
    if not os.path.lexists(target):
        return "absent"
    if not os.path.isdir(target):
        what = "is a file" if os.path.isfile(target) else "is not a directory"
        raise PathRefusedError(f"{path}: {what}, not a src_dask train; src_dask does not "
                               "replace it (remove it yourself or choose another path)")
    if _paths.holds_working_directory(target):
        raise PathRefusedError(f"{path}: is the current working directory or contains it; "
                               "src_dask does not replace it (choose another path)")
    if not os.listdir(target):
        return "empty"
    if not _is_train(target):
        raise PathRefusedError(f"{path}: exists and is not a src_dask train or stack; "
                               "src_dask does not replace it (remove it yourself or choose "
                               "another path)")
    if not overwrite:
        raise FileExistsError(f"{path}: already exists; pass overwrite=True to replace it")
    return "train"


def _check_chunks(chunks: Any, kind: str) -> tuple[int, ...] | None:
    """``chunks`` as a tuple of positive ints of the rank of a middle core."""
    if chunks is None:
        return None
    rank = RANKS[kind][1]
    legs = "(l, r, p)" if kind == "mps" else "(l, r, u, d)"
    want = (f"chunks: expected {rank} positive ints, the chunk shape of a middle "
            f"{kind.upper()} core {legs} (rank {rank}), got {chunks!r}")
    if isinstance(chunks, (str, bytes)) or not hasattr(chunks, "__len__"):
        raise ValueError(want)
    if len(chunks) != rank:
        raise ValueError(want)
    out = []
    for c in chunks:
        if isinstance(c, bool):
            raise ValueError(want)
        try:
            c = operator.index(c)
        except TypeError:
            raise ValueError(want) from None
        if c < 1:
            raise ValueError(want)
        out.append(c)
    return tuple(out)


# -- save -------------------------------------------------------------------------------
def save(train: Any, path: str | os.PathLike, chunks: tuple[int, ...] | None = None, *,
         max_chunk_bytes: int = MAX_CHUNK_BYTES, overwrite: bool = False,
         attrs: dict[str, Any] | None = None) -> None:
    """Write ``train`` to a Zarr v3 group at ``path`` (see the module docstring).

    ``chunks`` fixes the chunk shape of every middle site (end sites drop the
    missing bond axis); by default each core is chunked to stay under
    ``max_chunk_bytes``. Dask cores are written block by block without being
    gathered in memory.

    ``path`` may be new, an empty directory, or (with ``overwrite=True``) a train
    that src_dask saved, which is replaced only once the new one is complete.
    Anything else there (a file, a directory of other things, the current working
    directory, the store a core is read from or one around it) is refused with
    :class:`~src_dask.errors.PathRefusedError` before anything is written. Cores
    holding NaN or inf are refused (stored data is always finite, so NaN read back
    means damage). ``attrs`` (JSON values) are added to the group's attributes: how
    the train was made, for instance.
    """
    path = _paths.as_path(path)
    tt = as_train(train)
    chunk_shape = _check_chunks(chunks, tt.kind)
    _check_max_chunk_bytes(max_chunk_bytes)
    extra = _check_attrs_given(attrs)
    target = os.path.realpath(path)
    # the train's own store is fine: it is replaced only once every site is written
    _paths.check_apart(target, _paths.train_dirs(tt, "the train being saved"), path,
                       allow_same=True)
    with _installed(path, target, overwrite) as tmp:
        _write(tt, tmp, path, chunk_shape, max_chunk_bytes, extra)


def save_stack(factors: Mapping[str, Any], path: str | os.PathLike, *,
               max_chunk_bytes: int = MAX_CHUNK_BYTES, overwrite: bool = False,
               attrs: dict[str, Any] | None = None) -> None:
    """Write the trains of ``factors`` (name: train, leftmost factor first) as one
    stack at ``path``: a group naming them in order, each train saved as by
    :func:`save` in the folder of its name. Written and replaced as :func:`save`
    does (atomically; only an empty directory, or with ``overwrite`` a train or
    stack src_dask wrote); ``attrs`` go to the stack and to each of its trains.
    :func:`open_stack` reads it back; the command line's ``run`` takes it as its
    factors."""
    path = _paths.as_path(path)
    names = list(factors)
    if not names:
        raise ValueError("save_stack: no factors given")
    for name in names:
        if not isinstance(name, str) or not name or name in (".", "..") or "/" in name \
                or "\\" in name or name.startswith("."):
            raise ValueError(f"save_stack: factor name {name!r} is not a folder name")
    trains = {name: as_train(t) for name, t in factors.items()}
    _check_max_chunk_bytes(max_chunk_bytes)
    extra = _check_attrs_given(attrs)
    target = os.path.realpath(path)
    for name, tt in trains.items():
        _paths.check_apart(target, _paths.train_dirs(tt, f"factor {name}"), path)
    with _installed(path, target, overwrite) as tmp:
        group = _zarr().open_group(tmp, mode="w-")
        group.attrs.update({**extra, "format": STACK_FORMAT, "version": _STACK_VERSION,
                            "factors": names, "complete": False})
        for name, tt in trains.items():
            _write(tt, os.path.join(tmp, name), f"{path}/{name}", None, max_chunk_bytes, extra)
        group.attrs["complete"] = True


def open_stack(path: str | os.PathLike) -> dict[str, TensorTrain]:
    """The trains of the stack at ``path`` (:func:`save_stack`), by name, leftmost
    factor first, each opened as :func:`open` does. Every factor must be a folder
    inside the stack's own (after symlinks): a crafted ``factors`` attribute
    (``../elsewhere``, an absolute path, a symlink out) is a
    :class:`~src_dask.errors.StoreError`, never a read of what it names."""
    path = _paths.as_path(path)
    attrs = _paths.group_attrs(path) if os.path.isdir(path) else None
    if attrs is None or attrs.get("format") != STACK_FORMAT:
        raise StoreError(f"{path}: not a src_dask stack (format "
                         f"{None if attrs is None else attrs.get('format')!r})")
    factors = attrs.get("factors")
    if not isinstance(factors, list) or not factors or \
            not all(isinstance(f, str) and f for f in factors):
        raise StoreError(f"{path}: stack attribute 'factors' is not a list of names "
                         f"(got {factors!r})")
    root = os.path.realpath(path)
    out = {}
    for name in factors:
        where = os.path.realpath(os.path.join(path, name))
        if where == root or os.path.commonpath([root, where]) != root:
            raise StoreError(f"{path}: stack factor {name!r} is outside the stack folder "
                             f"(it resolves to {where}); refusing to read it")
        out[name] = open(os.path.join(path, name))
    return out


def _check_max_chunk_bytes(max_chunk_bytes: Any) -> None:
    number = isinstance(max_chunk_bytes, (int, float, np.number))
    if isinstance(max_chunk_bytes, bool) or not number or not max_chunk_bytes > 0:
        raise ValueError(f"max_chunk_bytes: expected a positive number of bytes, got "
                         f"{max_chunk_bytes!r}")


def _check_attrs_given(attrs: dict[str, Any] | None) -> dict[str, Any]:
    """``attrs`` as JSON values, refused where they would replace the format's own."""
    if attrs is None:
        return {}
    if not isinstance(attrs, dict):
        raise ValueError(f"attrs: expected a dict of JSON values, got {type(attrs).__name__}")
    clash = sorted(_RESERVED & set(attrs))
    if clash:
        raise ValueError(f"attrs: {', '.join(clash)} are the format's own attributes")
    try:
        return json.loads(json.dumps(attrs))
    except (TypeError, ValueError) as err:
        raise ValueError(f"attrs: not JSON values ({err})") from None


@contextlib.contextmanager
def _installed(path: str, target: str, overwrite: bool) -> Iterator[str]:
    """A hidden sibling of ``target`` to write into, renamed into place when the block
    finishes (:func:`_install`); removed if it fails or is interrupted."""
    _check_target(path, target, overwrite)
    _paths.check_parent(target, path)
    parent, name = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    tmp = os.path.join(parent, f".{name}.partial-{tag}")
    try:
        yield tmp
        _install(tmp, target, path, overwrite, os.path.join(parent, f".{name}.old-{tag}"))
    finally:
        if os.path.lexists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def _finite(block: np.ndarray, what: str) -> np.ndarray:
    """``block``, or a ValueError naming ``what`` where it holds NaN or inf."""
    if block.dtype.kind in "fc" and not np.isfinite(block).all():
        raise ValueError(f"{what}: holds NaN or inf; src_dask saves finite values only "
                         "(NaN read back from a saved train means damaged data)")
    return block


def _write(tt: TensorTrain, tmp: str, path: str, chunk_shape: tuple[int, ...] | None,
           max_chunk_bytes: int, extra: dict[str, Any] | None = None) -> None:
    """Every site of ``tt`` into a new group at ``tmp``, the completion mark last."""
    zarr = _zarr()
    train_id = uuid.uuid4().hex
    group = zarr.open_group(tmp, mode="w-")
    n = len(tt)
    group.attrs.update({**(extra or {}), "format": FORMAT, "version": VERSION,
                        "kind": tt.kind, "sites": n, "layout": _LAYOUT[tt.kind],
                        "id": train_id, "complete": False})
    for j, core in enumerate(tt):
        what = f"{path}, site {j}"
        dtype = np.dtype(core.dtype)
        if chunk_shape is not None:
            c = list(chunk_shape)
            if j == n - 1:
                c.pop(1)
            if j == 0:
                c.pop(0)
            c = tuple(min(a, b) for a, b in zip(c, core.shape, strict=True))
        else:
            c = chunks_for(tuple(core.shape), dtype.itemsize, max_chunk_bytes)
        arr = _integrity.create(group, f"site_{j}", tuple(core.shape), dtype, c,
                                dimension_names=dimension_names(tt.kind, j, n))
        arr.attrs["train_id"] = train_id
        if type(core).__module__.startswith("dask.array"):
            import dask.array as da

            # into a pre-created array: da.to_zarr with shards can lose data
            blocks = core.rechunk(c).map_blocks(_finite, what=what, dtype=dtype)
            da.store(blocks, arr, lock=False)
        else:
            arr[...] = _finite(np.asarray(_to_numpy(core)), what)
    group.attrs["complete"] = True  # last: only a finished save carries it
    _integrity.consolidate(tmp)  # one read opens the whole train (xarray, remote stores)


def _install(tmp: str, target: str, path: str, overwrite: bool, old: str) -> None:
    """Rename the finished ``tmp`` to ``target``; a train there is moved aside to
    ``old`` first and removed once the new one is in place (put back on failure)."""
    if _check_target(path, target, overwrite) != "train":  # checked again: things move
        os.rename(tmp, target)  # absent, or an empty directory (which rename replaces)
        return
    os.rename(target, old)
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


# -- open -------------------------------------------------------------------------------
class _SameTrain:
    """The guard of an opened train's arrays: raises once the train at ``path`` is no
    longer the save it was opened as (saved over, or removed). Picklable."""

    def __init__(self, path: str, train_id: str) -> None:
        self.path = path
        self.train_id = train_id

    def __call__(self) -> None:
        local = "://" not in self.path
        attrs = _paths.group_attrs(self.path) if local else _remote_attrs(self.path)
        if attrs is None or attrs.get("id") != self.train_id:
            raise StoreError(f"{self.path}: was replaced by another save since it was opened "
                             "(or removed); open it again")

    def __repr__(self) -> str:
        return f"_SameTrain({self.path!r}, {self.train_id!r})"


def _remote_attrs(path: str) -> dict | None:
    try:
        return dict(_zarr().open_group(path, mode="r", use_consolidated=False).attrs)
    except Exception:  # noqa: BLE001 - gone or unreadable: not the train opened
        return None


def open(path: str | os.PathLike) -> TensorTrain:  # noqa: A001 - mirrors zarr.open
    """The train saved at ``path`` as a TensorTrain of lazy Dask arrays.

    Raises FileNotFoundError where nothing is saved, and
    :class:`~src_dask.errors.StoreError` (a ValueError) naming ``path`` for anything
    there that is not a complete train of this format. Computing a core raises
    :class:`~src_dask.errors.DamagedDataError` for a missing or damaged chunk or
    NaN/inf, and StoreError once the train was saved over since it was opened.
    """
    return _open(path, as_dask=True)


def _open(path: str | os.PathLike, as_dask: bool) -> TensorTrain:
    """:func:`open`; ``as_dask=False``: a TensorTrain of the stored arrays themselves
    (their shapes and dtype, for :func:`describe`, without importing Dask's arrays)."""
    zarr = _zarr()
    path = _paths.as_path(path)
    local = "://" not in path
    if local:
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no saved train here")
        if not os.path.isdir(path):
            raise StoreError(f"{path}: is a file, not a src_dask train (a directory written "
                             "by src_dask.save)")
        if not os.listdir(path):
            raise FileNotFoundError(f"{path}: no saved train here (an empty directory)")
    try:
        group = zarr.open_group(path, mode="r", use_consolidated=False)
    except zarr.errors.ContainsArrayError:
        raise StoreError(f"{path}: is a Zarr array, not a src_dask train (a group written "
                         "by src_dask.save)") from None
    except (FileNotFoundError, zarr.errors.GroupNotFoundError) as err:
        if local:
            raise StoreError(f"{path}: not a src_dask train (no Zarr group here)") from err
        raise FileNotFoundError(f"{path}: no saved train here") from err
    except Exception as err:  # noqa: BLE001 - unreadable metadata, in zarr's words
        raise StoreError(f"{path}: not a src_dask train (its Zarr metadata cannot be read: "
                         f"{type(err).__name__}: {err})") from err
    attrs = dict(group.attrs)
    train_id, n, kind = _check_attrs(path, attrs)
    guard = _SameTrain(os.path.abspath(path) if local else path, train_id)
    missing = [j for j in range(n) if f"site_{j}" not in group]  # before any site's shape
    if missing:
        raise StoreError(f"{path}: incomplete train: site_{missing[0]} is missing (sites is "
                         f"{n}, {len(missing)} missing)")
    if f"site_{n}" in group:
        raise StoreError(f"{path}: train metadata is damaged (sites is {n}, but site_{n} "
                         "exists)")
    sources = []
    for j in range(n):
        arr = _site(group, path, j, n, kind, train_id)
        sources.append(_integrity.VerifiedArray(arr, f"{path}/site_{j}", guard=guard))
    if not as_dask:  # the stored arrays themselves (describe: shapes only)
        return _checked(lambda: TensorTrain(sources, kind, name=path))
    return _checked(lambda: TensorTrain([_integrity.to_dask(v) for v in sources], kind,
                                        name=path, sources=sources))


def _checked(make: Any) -> TensorTrain:
    """``make()``, its errors of bonds that do not match (a train edited by hand) a
    StoreError."""
    try:
        return make()
    except (TypeError, ValueError) as err:
        raise StoreError(str(err)) from err


def _check_attrs(path: str, attrs: dict) -> tuple[str, int, str]:
    """The id, number of sites and kind of the train whose group attributes are
    ``attrs``; a StoreError naming ``path`` for anything that does not add up."""
    if attrs.get("format") != FORMAT:
        raise StoreError(f"{path}: not a src_dask train (format {attrs.get('format')!r})")
    version = attrs.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise StoreError(f"{path}: train metadata is damaged (version {version!r} is not an "
                         "int)")
    if version < VERSION:
        sites = attrs.get("sites")
        sites = sites if isinstance(sites, int) else "SITES"
        raise StoreError(
            f"{path}: train format version {version}, written by an older src_dask without "
            f"checksums; this src_dask reads version {VERSION}. Write it again in place: "
            f"src_dask.save([zarr.open_group({path!r})[f'site_{{j}}'] for j in "
            f"range({sites})], {path!r}, overwrite=True)")
    if version > VERSION:
        raise StoreError(f"{path}: train format version {version} is newer than this "
                         f"src_dask understands ({VERSION})")
    if attrs.get("complete") is not True:
        raise StoreError(f"{path}: incomplete: an interrupted save; write it again")
    kind = attrs.get("kind")
    if kind not in RANKS:
        raise StoreError(f"{path}: train metadata is damaged (kind {kind!r}, expected 'mps' "
                         "or 'mpo')")
    n = attrs.get("sites")
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise StoreError(f"{path}: train metadata is damaged (sites {n!r}, expected an int "
                         ">= 2)")
    layout = attrs.get("layout")
    if layout != _LAYOUT[kind]:
        raise StoreError(f"{path}: train metadata is damaged (layout {layout!r}, an "
                         f"{kind.upper()} is stored as {_LAYOUT[kind]!r})")
    train_id = attrs.get("id")
    if not isinstance(train_id, str) or not train_id:
        raise StoreError(f"{path}: train metadata is damaged (no id)")
    return train_id, n, kind


def _site(group: Any, path: str, j: int, n: int, kind: str, train_id: str) -> Any:
    """The array of site ``j``, checked against the group's metadata."""
    name = f"site_{j}"
    try:
        arr = group[name]
    except KeyError:
        raise StoreError(f"{path}: incomplete train: {name} is missing (sites is {n})"
                         ) from None
    except Exception as err:  # noqa: BLE001 - unreadable metadata, in zarr's words
        raise StoreError(f"{path}: {name} cannot be read ({type(err).__name__}: {err})"
                         ) from err
    if not hasattr(arr, "shape"):
        raise StoreError(f"{path}: {name} is a group, not an array")
    want = RANKS[kind][role(j, n)]
    if arr.ndim != want:
        raise StoreError(f"{path}: {name} has rank {arr.ndim} (shape {tuple(arr.shape)}); an "
                         f"{kind.upper()} core here has rank {want}")
    if not _integrity.is_verifiable(arr):
        raise StoreError(f"{path}: {name} has no checksums, so it was not written by "
                         "src_dask.save (edited by hand?)")
    if arr.attrs.get("train_id") != train_id:
        raise StoreError(f"{path}: {name} belongs to another save (copied in by hand?)")
    return arr



def describe(path: str | os.PathLike) -> Info:
    """What ``path`` holds — a saved train, a stack of them or a run store — as plain
    data whose ``str()`` is the text ``src-dask info`` prints: kind, sites, bonds,
    physical legs, dtype, bytes and how it was made (``generated``/``made_by``); a
    stack's factors; a run store's options, progress and result. Anything else is a
    :class:`~src_dask.errors.StoreError`."""
    path = os.fspath(path)
    attrs = _paths.group_attrs(path) if os.path.isdir(path) else None
    fmt = None if attrs is None else attrs.get("format")
    if fmt == FORMAT:
        return _describe_train(path)
    if fmt == STACK_FORMAT:
        return _info.stack(path, {name: _describe_train(os.path.join(path, name))
                                  for name in open_stack(path)}, attrs or {})
    from . import _runstore

    if fmt == _runstore.FORMAT:
        return Info(_runstore.describe(path))
    raise StoreError(f"{path}: not a src_dask train, stack or run store")


def _describe_train(path: str) -> Info:
    tt = _open(path, as_dask=False)
    info = Info(path=path, what="train", kind=tt.kind, sites=len(tt), bond_dims=tt.bond_dims,
                phys_dims=[list(p) for p in tt.phys_dims], dtype=tt.dtype.name,
                bytes=tt.nbytes)
    attrs = _paths.group_attrs(os.path.realpath(path)) or {}
    for key in ("generated", "made_by"):
        if key in attrs:
            info[key] = attrs[key]
    return info


@dataclasses.dataclass(frozen=True)
class RunProgress:
    """How far the run in the run store at ``path`` got (:func:`run_progress`): whether
    it is ``complete``, whether it has ``begun`` (some pass 1 block written) and
    ``where`` it is ("pass 1, K of N blocks of sketch columns done" or "pass 2, at site
    S"). Its methods are the lines the command line prints about a resumed or an
    interrupted ``run --store``."""

    path: str
    complete: bool
    begun: bool
    where: str

    def resumed(self) -> str | None:
        """What a run that then used this store (its progress read before the run) did
        with it: resumed it, or took its finished result; None where nothing was done
        yet (a fresh start)."""
        if self.complete:
            return f"{self.path} held this run, finished: its result, not recomputed"
        if self.begun:
            return f"resumed the run in {self.path} from {self.where}"
        return None

    def stopped(self) -> str:
        """Where an interrupted run stopped, what keeps it and how to go on."""
        return f"in {self.where}; {self.path} keeps it: rerun the same command to resume"


def run_progress(path: str | os.PathLike | None) -> RunProgress | None:
    """The progress of the run store at ``path`` (from :func:`describe`), or None where
    there is nothing to say: no path, nothing there, something other than a run store,
    or a store set up only partly (interrupted before its metadata was written)."""
    if path is None or not os.path.isdir(path):
        return None
    try:
        info = describe(path)
    except Exception:  # noqa: BLE001 - set up only partly, or not a store: nothing to say
        return None
    if info.get("what") != "run store":
        return None
    done, blocks = info["pass1_blocks_done"], info["pass1_blocks"]
    where = (f"pass 1, {done} of {blocks} blocks of sketch columns done" if done < blocks
             else f"pass 2, at site {info['pass2_next_site']}")
    return RunProgress(os.fspath(path), bool(info["complete"]), done > 0, where)
