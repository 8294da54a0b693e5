"""Ctrl-C for a client and the local cluster it starts: one interrupt, one line.

Used by the command line and by :func:`src_dask.cluster`; public so that a script
that starts its own local cluster can stop the same way (``with
local_client(src_dask.cluster) as client: ...``).

A terminal's Ctrl-C goes to the whole process group: Dask's worker processes
would die with the client, and every thread of Dask logs what the interrupt
undoes. Here worker processes are started with SIGINT blocked
(:func:`sigint_deferred`), the client's process silences Dask's logs from the
first SIGINT (:func:`quiet_logs`, :func:`sigint_quiets`) and closes its cluster
before it says "interrupted" (:func:`local_client`), and what the interrupt
left behind is freed with the logs still quiet (:func:`forget`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["forget", "local_client", "quiet_logs", "quiet_worker", "sigint_deferred",
           "sigint_quiets"]


@contextlib.contextmanager
def sigint_deferred() -> Iterator[Callable[[], bool]]:
    """SIGINT held back while the block starts worker processes; yields a function
    that says, after the block, whether one came meanwhile.

    SIGINT is blocked in this (the main) thread, so the threads Dask creates
    meanwhile (its event loop, and the ones that start worker processes, now or
    later in place of a dead worker) block it too, and so do the worker
    processes they start: the signal mask is inherited across fork and exec,
    and Python leaves it as it is. A terminal's Ctrl-C, sent to the whole
    process group, then interrupts only this process. A SIGINT that arrives
    during the block is recorded, not lost. A no-op outside the main thread or
    without POSIX signal masks.
    """
    if (threading.current_thread() is not threading.main_thread()
            or not hasattr(signal, "pthread_sigmask")
            # not set from Python, or ignored (a background job): leave it be
            or signal.getsignal(signal.SIGINT) in (None, signal.SIG_IGN)):
        yield lambda: False
        return
    with contextlib.suppress(Exception):
        # started now, or its start (which unblocks SIGINT in the thread that
        # starts it, for the tracker's sake) would undo the block in Dask's loop thread
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
    came: list[int] = []
    handler = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield lambda: bool(came)
    finally:
        # take a pending one off the pending set without waiting (it is recorded): another
        # thread with SIGINT unblocked may take it first, and then a wait would never end
        if signal.sigtimedwait({signal.SIGINT}, 0) is not None:
            came.append(signal.SIGINT)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, handler)


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """Dask's loggers (and tornado's, asyncio's, bokeh's) silent while the block
    runs; as they were afterwards. For closing a cluster after a Ctrl-C, whose
    warnings (lost tasks, closed connections) are what an interrupt means."""
    roots = ("distributed", "tornado", "asyncio", "bokeh")
    names = {n for n in list(logging.root.manager.loggerDict) if n.split(".")[0] in roots}
    loggers = [logging.getLogger(n) for n in names | set(roots)]
    saved = [(logger, logger.disabled) for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, disabled in saved:
            logger.disabled = disabled


def quiet_worker(dask_worker: Any = None) -> None:
    """Run on each worker after a Ctrl-C: its loggers quiet while it is closed."""
    for name in list(logging.root.manager.loggerDict):
        if name.split(".")[0] in ("distributed", "tornado", "asyncio"):
            logging.getLogger(name).disabled = True


@contextlib.contextmanager
def sigint_quiets(quiet: contextlib.ExitStack) -> Iterator[None]:
    """While the block runs, a SIGINT first silences Dask's logs (into ``quiet``),
    then raises KeyboardInterrupt as usual: Dask's threads log what the interrupt
    undoes (cancelled gathers, lost tasks) from the moment it arrives. Where Python
    drops the KeyboardInterrupt (raised in a gc callback or a ``__del__``, it is
    only reported as "Exception ignored"), SIGINT is sent again, so the run stops
    all the same, without that report."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    quieted: list[bool] = []
    report = sys.unraisablehook

    def interrupt(signum: int, frame: Any) -> None:
        if not quieted:
            quieted.append(True)
            quiet.enter_context(quiet_logs())
        raise KeyboardInterrupt

    def dropped(unraisable: Any) -> None:
        if issubclass(unraisable.exc_type, KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # again, until it gets through
            return
        report(unraisable)

    signal.signal(signal.SIGINT, interrupt)
    sys.unraisablehook = dropped
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.unraisablehook = report


@contextlib.contextmanager
def local_client(start: Callable[[], Any]) -> Iterator[Any]:
    """A ``distributed.Client`` on the local cluster that ``start()`` returns
    (:func:`src_dask.cluster`: loopback by default, worker processes that do not
    take SIGINT), closed with its cluster when the block ends. A Ctrl-C silences
    Dask's logs until the cluster is closed, so the interrupt shows as one line (the
    command line's); a Ctrl-C while the cluster closes waits for the close (then
    interrupts)."""
    from distributed import Client

    local = start()
    client = None
    quiet = contextlib.ExitStack()
    with quiet:
        try:
            with sigint_quiets(quiet):
                client = Client(local)
                yield client
        except KeyboardInterrupt:
            quiet.enter_context(quiet_logs())
            with contextlib.suppress(Exception):
                client.run(quiet_worker)  # type: ignore[union-attr]
            raise
        finally:
            with sigint_deferred() as came:
                if client is not None:
                    client.close()
                local.close()
            came_while_closing = came()
    if came_while_closing:
        raise KeyboardInterrupt


def forget(err: BaseException) -> None:
    """Free what an interrupt left (the frames of its traceback and what they held)
    with Dask's and asyncio's logs quiet: a Dask client's tasks freed with them
    would otherwise log "Task exception was never retrieved" after the one line
    that says the run was interrupted."""
    quiet: Any = contextlib.nullcontext()
    if "distributed" in sys.modules:
        quiet = quiet_logs()
    with quiet:
        seen: set[int] = set()
        while err is not None and id(err) not in seen:
            seen.add(id(err))
            err.__traceback__ = None  # frees its frames, and what they held, now
            err = err.__context__ or err.__cause__  # type: ignore[assignment]
        if "distributed" in sys.modules:
            import gc

            gc.collect()


def dask_setup(worker: Any) -> None:
    """Preload of the workers src_dask starts (:func:`src_dask.cluster` names this
    module; Dask calls it as the worker starts): in a worker process of its own (not
    in the client's process), ignore SIGINT.
    A second line behind :func:`sigint_deferred`, for worker processes started
    from threads that did not inherit its mask (a cluster on an event loop that
    was running before)."""
    import multiprocessing

    if (multiprocessing.parent_process() is not None
            and threading.current_thread() is threading.main_thread()):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
