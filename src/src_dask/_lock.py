"""One writer per run store: an exclusive lock file with its owner's host and pid.

A second run on a locked store fails at once with a message naming the owner;
a lock left by a process of this host that no longer runs (a killed run) is
taken over with a WARNING. A lock from another host is never guessed stale.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid

from .errors import StoreLockedError

log = logging.getLogger("src_dask")

#: The lock file's name inside the store.
LOCK = ".src_dask.lock"


class StoreLock:
    """An exclusive lock file in the store: host, pid and time of its owner.

    A lock left by a process of this host that no longer runs is taken over,
    with a WARNING; any other lock makes a second run fail at once.
    """

    def __init__(self, path: str) -> None:
        self.file = os.path.join(path, LOCK)
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(),
                      "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "token": uuid.uuid4().hex}

    def acquire(self) -> None:
        for _ in range(3):
            try:
                fd = os.open(self.file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(self.owner, f)
            return
        raise StoreLockedError(f"{os.path.dirname(self.file)}: cannot take the lock")

    def _take_over_if_stale(self) -> None:
        store = os.path.dirname(self.file)
        try:
            with open(self.file, encoding="utf-8") as f:
                owner = json.load(f)
        except FileNotFoundError:
            return  # released meanwhile: try again
        except (OSError, ValueError):
            owner = {}
        host, pid = owner.get("host"), owner.get("pid")
        if host == self.owner["host"] and isinstance(pid, int) and not _alive(pid):
            log.warning("src: %s: taking over the lock of process %d on %s, which no longer "
                        "runs (an interrupted run)", store, pid, host)
            stale = f"{self.file}.stale-{uuid.uuid4().hex[:8]}"
            try:
                os.rename(self.file, stale)  # only one taker wins the rename
                os.remove(stale)
            except FileNotFoundError:
                pass
            return
        who = (f"process {pid} on {host}, since {owner.get('since')}" if pid else
               "an unreadable lock file")
        raise StoreLockedError(f"{store}: another run is using this store ({who}); wait for "
                               f"it to end, or remove {self.file} if that run is gone")

    def release(self) -> None:
        try:
            with open(self.file, encoding="utf-8") as f:
                mine = json.load(f).get("token") == self.owner["token"]
        except (OSError, ValueError):
            return
        if mine:
            os.remove(self.file)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


