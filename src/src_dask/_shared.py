"""Arrays between a client and a worker of the same host, through shared memory.

Dask moves a NumPy array from a client to a worker on its own host as it would to
another host: serialized, through a TCP socket, and copied into the worker's memory
(about 1 GB/s on the GPU machine, so a χ=1000 MPS's 1.6 GB cost more than its product).
Here the client writes each large input into a file of ``/dev/shm`` (tmpfs: memory, not
disk) with several threads, and the worker maps it; a result goes back the same way,
the worker's task writing each output core as it is final and the client mapping it.
Each array is copied once, by several threads, and never serialized.

Files are named ``src_dask-shm-<pid>-<call>-<n>``: the client's process id and a token
of the call. The client removes its call's files when the call ends, however it ends,
and, at each call, those of its own user's processes that are gone (a client killed
before it could). Nothing else under ``/dev/shm`` is touched. Files are written, not
mapped, by the side that makes them: a full tmpfs is an ``OSError`` at the write, never
a ``SIGBUS`` at a copy into a map. The client maps a result's file once it is whole and
removes its name at once: the pages are then its array's alone, never copied.

A worker uses this path only after it showed it sees the client's files (one probe per
worker and client), so a worker on the loopback of another container, or of another
host behind a tunnel, gets its inputs through Dask as before.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import mmap
import os
import secrets
import threading
from collections.abc import Iterator
from typing import Any, NamedTuple

import dask.system
import numpy as np

from . import _transfer

#: Where the files go: a tmpfs on Linux.
DIRECTORY = "/dev/shm"

_PREFIX = "src_dask-shm-"

#: Arrays are copied in pieces of this many bytes, one thread a piece.
_PIECE = 64 << 20

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux

#: Part of the free tmpfs a call may fill (the rest stays for whoever else uses it).
_SHARE_OF_FREE = 0.5


class Shared(NamedTuple):
    """An array in the file ``path`` of shared memory."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


def _create(path: str) -> int:
    """A new file ``path`` (never one that exists), open for writing: its descriptor."""
    return os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)


def _flat(x: Any) -> np.ndarray:
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8)


def _threads() -> int:
    return max(1, min(8, dask.system.CPU_COUNT))


def write(arrays: list[Any], prefix: str) -> list[Shared]:
    """``arrays`` (NumPy; CuPy copied to the host first) as files ``prefix0``,
    ``prefix1``, …; made and filled by several threads. A failure removes what it
    wrote."""
    hosts = [_transfer.staged(x) for x in arrays]
    out = [Shared(f"{prefix}{i}", tuple(h.shape), h.dtype.str, h.nbytes)
           for i, h in enumerate(hosts)]
    made: dict[str, int] = {}  # the files made here: their descriptors
    try:
        for d in out:
            made[d.path] = _create(d.path)
        with concurrent.futures.ThreadPoolExecutor(_threads()) as pool:
            jobs = [pool.submit(_write_piece, made[d.path], h, i, d.path)
                    for d, h in zip(out, hosts, strict=True) for i in range(0, h.nbytes, _PIECE)]
            for f in jobs:
                f.result()
    except BaseException:
        for path in made:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        raise
    finally:
        for fd in made.values():
            os.close(fd)
    return out


def _write_piece(fd: int, host: np.ndarray, start: int, path: str) -> None:
    """Bytes ``start`` to ``start + _PIECE`` of ``host`` into the file ``fd`` (its
    ``path``). Written, not mapped: a full tmpfs is then an error here, never a
    ``SIGBUS`` at a copy into a map, and no map is left that something (a sampling
    profiler's hold on a frame, say) still views. The write lets go of the GIL."""
    piece = memoryview(_flat(host))[start:start + _PIECE]
    try:
        while piece:
            done = os.pwrite(fd, piece, start)
            if not done:  # a file system that takes nothing more
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            piece, start = piece[done:], start + done
    except OSError as e:
        raise OSError(e.errno, f"{path}: no room for {host.nbytes} bytes in shared memory "
                      f"({os.strerror(e.errno)})" if e.errno == errno.ENOSPC
                      else f"{path}: {os.strerror(e.errno)}") from None


def read(d: Shared, writable: bool = False) -> np.ndarray:
    """The array of ``d``, mapped (no copy): read-only, or ``writable`` (for
    :func:`take`: the file's name then goes, and its pages are the array's alone). A
    missing or short file is an error, never zeros."""
    try:
        fd = os.open(d.path, os.O_RDWR if writable else os.O_RDONLY)
    except FileNotFoundError:
        raise FileNotFoundError(f"{d.path}: an array in shared memory is missing (removed "
                                "before the run used it: the call was interrupted?)") from None
    try:
        size = os.fstat(fd).st_size
        if size != d.nbytes:
            raise OSError(f"{d.path}: an array in shared memory has {size} bytes of "
                          f"{d.nbytes}")
        if not d.nbytes:
            return np.empty(d.shape, d.dtype)
        # the client's (its file then removed: no one else sees it): writable, its page
        # tables filled at once, as an array of its own would have them (not a fault
        # per page later; a private map would copy every page there); the worker's:
        # read-only, pages come in as its tasks read them (what it holds grows with
        # its reads)
        flags = mmap.MAP_SHARED | (_POPULATE if writable else 0)
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        return np.frombuffer(mmap.mmap(fd, d.nbytes, flags=flags, prot=prot),
                             np.dtype(d.dtype)).reshape(d.shape)
    finally:
        os.close(fd)


class Outbox:
    """Where a worker's task puts output cores for a client on its host: files of the
    call's ``prefix``, made only while the call's ``marker`` exists (a call that ended
    removed it, and then its files; a file made after that is removed here)."""

    def __init__(self, prefix: str, marker: str) -> None:
        self.prefix, self.marker = prefix, marker

    def put(self, core: Any, site: int) -> Shared:
        if not os.path.exists(self.marker):
            raise RuntimeError(f"{self.marker}: the call this run's result was for ended")
        (d,) = write([core], f"{self.prefix}out-{site}-")
        if not os.path.exists(self.marker):  # ended meanwhile: it may not have seen d
            with contextlib.suppress(FileNotFoundError):
                os.remove(d.path)
            raise RuntimeError(f"{self.marker}: the call this run's result was for ended")
        return d


def take(d: Shared) -> np.ndarray:
    """The array of ``d`` for the client (mapped, writable), its file removed: the
    memory stays the array's until it is freed."""
    try:
        return read(d, writable=True)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(d.path)


# -- one call's files ----------------------------------------------------------------
class Call(NamedTuple):
    """The files of one call: ``prefix`` of every name, and the ``marker`` that lives
    as long as the call does (:class:`Outbox`)."""

    prefix: str
    marker: str


@contextlib.contextmanager
def call_files() -> Iterator[Call]:
    """A call's file names, its marker made; on leaving, the marker and then every
    file of the call removed (whatever the call left: inputs, unread results)."""
    remove_stale()
    prefix = os.path.join(DIRECTORY, f"{_PREFIX}{os.getpid()}-{secrets.token_hex(6)}-")
    marker = prefix + "call"
    os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    try:
        yield Call(prefix, marker)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(marker)
        _remove(os.path.basename(prefix))


def _remove(start: str) -> int:
    """Remove the files of ``DIRECTORY`` whose names start with ``start`` (one of this
    module's prefixes); their count."""
    removed = 0
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(DIRECTORY):
            if name.startswith(start):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(DIRECTORY, name))
                    removed += 1
    return removed


def remove_stale() -> int:
    """Remove the files left by this user's processes that are gone (killed before
    they could); their count."""
    removed, uid = 0, os.getuid()
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(DIRECTORY):
            pid = name[len(_PREFIX):].split("-", 1)[0]
            if not (name.startswith(_PREFIX) and pid.isdigit()) or _alive(int(pid)):
                continue
            with contextlib.suppress(FileNotFoundError):
                if os.stat(os.path.join(DIRECTORY, name)).st_uid == uid:
                    os.remove(os.path.join(DIRECTORY, name))
                    removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


# -- which workers see this host's shared memory ----------------------------------------
#: Per worker (address and id): whether it sees this process's files.
_seen: dict[tuple[str, str], bool] = {}
_seen_lock = threading.Lock()


def room(nbytes: int) -> bool:
    """Whether ``nbytes`` more fit the free shared memory (within :data:`_SHARE_OF_FREE`)."""
    try:
        st = os.statvfs(DIRECTORY)
    except OSError:
        return False
    return nbytes <= _SHARE_OF_FREE * st.f_bavail * st.f_frsize


def reaches(client: Any, worker: str, ident: str) -> bool:
    """Whether ``worker`` of ``client`` (its address, and the ``id`` the scheduler
    gives it) sees this process's shared memory: asked once per worker with a file of
    random bytes only this process made."""
    if not os.path.isdir(DIRECTORY):
        return False
    with _seen_lock:
        if (worker, ident) in _seen:
            return _seen[(worker, ident)]
    with call_files() as call:
        secret = secrets.token_bytes(16)
        path = call.prefix + "probe"
        with open(path, "wb") as f:
            f.write(secret)
        try:
            seen = client.run(_holds, path, secret, workers=[worker]).get(worker, False)
        except Exception:  # a worker gone, or one that cannot answer: not through here
            seen = False
    with _seen_lock:
        _seen[(worker, ident)] = bool(seen)
    return bool(seen)


def _holds(path: str, secret: bytes) -> bool:
    """Whether the file ``path`` holds ``secret`` (run on a worker)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(secret) + 1) == secret
    except OSError:
        return False
