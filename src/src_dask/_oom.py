"""Out-of-memory halving: a step that does not fit is computed in halves.

Dask's ``retries=`` would re-run a task unchanged, so the split belongs
inside the task. Every step of the sweep whose output has an axis of
independent rows is computed through :func:`halving`: pass 1's chains and
pass 2's sketch pieces along the sketch columns, the projected core along its
rows (the rows of ``S`` it is made from), the environment update along the
rows of ``S_{j-1}`` (those of η). A step that raises an out-of-memory error
(CuPy, RMM, cuBLAS/cuSOLVER workspaces, or ``MemoryError``) frees what it can
— the pools' cached blocks and, on a dask-cuda worker, stored data spilled
from the device to host memory — and is computed again in two halves,
recursively down to one row; the halves are written into one output, so the
result is unchanged. The size that worked is remembered in the worker
process for each kind of step of the run, so later tasks start from it
instead of failing again. A row that does not fit beside other tasks' is tried
again in turn, one row of the worker at a time, and failing that its task gives
its memory back to run again later (:func:`_row_in_turn`). Only one row that
does not fit with no other task running is an error, which names the site, the
step and the memory one row needs. :func:`events` counts what all this cost.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from . import _pinned

log = logging.getLogger("src_dask")

#: (run token, kind of step) -> the most rows a piece of that step has fitted in
_FITS: dict[tuple[str, str], int] = {}

#: What the out-of-memory handling did in this process (:func:`events`).
_EVENTS: dict[str, float] = {}
_EVENTS_LOCK = threading.Lock()


def _count(event: str, amount: float = 1) -> None:
    with _EVENTS_LOCK:
        _EVENTS[event] = _EVENTS.get(event, 0) + amount


def events(reset: bool = False) -> dict[str, float]:
    """What the out-of-memory handling did in this process so far, by kind (see
    :func:`src_dask.diagnostics.memory_events`); ``reset`` starts the counts again."""
    with _EVENTS_LOCK:
        out = dict(_EVENTS)
        if reset:
            _EVENTS.clear()
    return out

#: What a row is, by kind of step (for the messages).
_UNITS = {"pass 1": "sketch column", "sketch": "sketch column",
          "projection": "row of the projected core", "update": "row of the environment"}


def is_oom(err: BaseException) -> bool:
    if isinstance(err, MemoryError):  # cupy's OutOfMemoryError and RMM's are MemoryErrors
        return True
    text = str(err)
    return "ALLOC_FAILED" in text or "out of memory" in text.lower()


def _free_cached(xp: Any, need: int) -> None:
    """Give memory back before a smaller attempt: what tasks that gave theirs back
    still hold (:func:`_collect_garbage`), the pools' cached blocks and, on a GPU,
    ``need`` bytes of stored data spilled to host memory (:func:`_spill_device_data`)."""
    _collect_garbage()
    if xp.__name__ == "cupy":
        xp.get_default_memory_pool().free_all_blocks()
        xp.get_default_pinned_memory_pool().free_all_blocks()
        _pinned.free_blocks()
        _spill_device_data(need)


def _spill_device_data(need: int) -> int:
    """Spill the least recently used data a dask-cuda worker keeps on its device to
    host memory, at least ``need`` bytes (what the failed attempt wanted); the bytes
    moved (0 outside such a worker).

    dask-cuda spills stored data only when a new result takes the device buffer
    past its limit, so a task's temporaries can meet a device whose pool is full
    of data the worker would gladly move. The inputs of running tasks go last:
    the tasks hold them, so moving one frees its memory only as its task ends,
    and a task that wants it meanwhile brings a second copy to the device. Only
    what the attempt needs is moved: what is spilled comes back over the host link
    when it is used. A value that cannot be moved (serialising an array that is not
    contiguous needs a device copy, which a full pool refuses) stays where it is,
    and the next is tried. zict's buffers are thread-safe (zict >= 3)."""
    worker = _worker()
    buffer = getattr(getattr(worker, "data", None), "device_buffer", None)
    fast = getattr(buffer, "fast", None)
    if fast is None or not getattr(buffer, "n", None):
        return 0
    moved, in_use, order = 0, _in_use(worker), list(getattr(fast, "order", ()))
    # least recently used first, the running tasks' inputs after all others
    for key in [k for k in order if k not in in_use] + [k for k in order if k in in_use]:
        if moved >= need:
            break
        try:
            with _handles_oom():  # a device copy it needs fails at once: next key
                evicted = fast.evict(key)
        except KeyError:  # gone meanwhile (used, deleted or spilled by another thread)
            continue
        except Exception as err:  # this value cannot move now: leave it in place
            log.info("could not spill %s from the device: %s: %s", key, type(err).__name__,
                     err)
            continue
        weight = evicted[2]
        del evicted  # the device copy goes with the last reference here
        moved += int(weight)
    if moved:
        _count("spilled_bytes", moved)
        log.info("spilled %.3g GB of stored data from the device to host memory", moved / 1e9)
    return moved


def _in_use(worker: Any) -> set[Any]:
    """The keys of the inputs of the tasks ``worker`` runs now (read from another
    thread than the event loop that changes them, so tried again if they change)."""
    executing = getattr(getattr(worker, "state", None), "executing", None)
    for _ in range(3):
        try:
            return {dep.key for ts in list(executing or ()) for dep in ts.dependencies}
        except RuntimeError:  # changed size while read
            continue
    return set()


#: The dask-cuda worker of this process whose allocations spill on failure
#: (:func:`spill_on_allocation_failure`), for the allocations that happen where
#: ``distributed.get_worker`` knows no worker: on the worker's event loop, as
#: dask-cuda brings a spilled input back to the device before a task starts.
_WORKER: Any = None


def _worker() -> Any:
    """The Dask worker running this task, else this process's dask-cuda worker."""
    try:
        from distributed import get_worker

        return get_worker()
    except (ImportError, ValueError):
        return _WORKER() if _WORKER is not None else None


def spill_on_allocation_failure(dask_worker: Any) -> bool:
    """Have every RMM allocation on this dask-cuda worker that meets a full device
    (or a full pool) spill stored data to host memory and try again, before it raises.

    :func:`halving` spills and retries the steps it wraps, but not what happens
    outside them: a block of inputs copied to the device, and above all dask-cuda
    bringing a spilled input back to the device before a task starts (in the
    worker, before any of src_dask's code runs). On a device whose pool is full
    of stored data those raise ``MemoryError`` and fail the run, though the
    worker would gladly move that data (a D_M=1000 stack in a 4 GB pool did). So
    the worker's RMM resource is wrapped in RMM's ``FailureCallbackResourceAdaptor``,
    whose callback spills the least recently used stored data
    (:func:`_spill_device_data`) and asks RMM to try again while there was some
    to spill, then waits for the running tasks to free memory
    (:func:`_wait_for_tasks`, up to ``WAIT_S``); then the error comes as before.
    An adaptor that counts allocations (``_COUNTING``) stays on top. Once a process
    (the resources' chain is looked through); False where there is no RMM or no
    dask-cuda device buffer."""
    global _WORKER
    buffer = getattr(getattr(dask_worker, "data", None), "device_buffer", None)
    if getattr(buffer, "fast", None) is None:
        return False
    _WORKER = weakref.ref(dask_worker)
    try:
        return _wrap_resource()
    except Exception as err:  # a resource this does not know: runs go on without it
        log.warning("could not have RMM spill stored data before an allocation fails: "
                    "%s: %s", type(err).__name__, err)
        return False


def membership_without_loading(dask_worker: Any) -> bool:
    """Have ``key in dask_worker.data`` answered from dask-cuda's stores, without
    loading the value; whether the worker's data was changed so.

    dask-cuda's ``DeviceHostFile`` defines no ``__contains__``, so Python's mapping
    answers it through ``__getitem__``: a value spilled to host memory or disk is
    brought back to the device only to be told present, and a value on the device
    becomes the most recently used. distributed asks on the worker's event loop for
    every key it releases, so a run that spills copies what it spilled back to the
    device on the loop, where a full pool stops the loop or, once no task runs to
    free memory, closes the worker (a D_M=1000 stack in a 3 GB pool lost its worker
    so). The data's class is given a subclass whose ``__contains__`` asks the stores
    ``__getitem__`` reads, in its order; a class that answers it already is left."""
    data = getattr(dask_worker, "data", None)
    cls = type(data)
    if (cls.__name__ != "DeviceHostFile" or "__contains__" in vars(cls)
            or not all(hasattr(data, a) for a in ("others", "device_keys", "host_buffer"))):
        return False
    if cls not in _ANSWERING:
        _ANSWERING[cls] = type(cls.__name__, (cls,), {"__contains__": _contains,
                                                       "__module__": cls.__module__})
    data.__class__ = _ANSWERING[cls]
    return True


#: dask-cuda's data classes, by the subclass that answers membership (see above).
_ANSWERING: dict[type, type] = {}


def _contains(self: Any, key: Any) -> bool:
    return key in self.others or key in self.device_keys or key in self.host_buffer


def _wrap_resource() -> bool:
    try:
        import rmm
    except ImportError:
        return False
    mr = rmm.mr.get_current_device_resource()
    chain = [mr]
    while hasattr(chain[-1], "get_upstream"):
        chain.append(chain[-1].get_upstream())
    if any(isinstance(r, rmm.mr.FailureCallbackResourceAdaptor) for r in chain):
        return True  # wrapped already (by this function, or by its owner's choice)
    counting = next((kind for kind in (getattr(rmm.mr, name, None) for name in _COUNTING)
                     if kind is not None and isinstance(mr, kind)), None)
    inner = mr.get_upstream() if counting else mr
    wrapped = rmm.mr.FailureCallbackResourceAdaptor(inner, _spill_for)
    rmm.mr.set_current_device_resource(counting(wrapped) if counting else wrapped)
    log.info("RMM allocations on this worker spill stored data before they fail")
    return True


#: RMM adaptors that count what passes through them: they stay on top, where their
#: owners (dask-cuda's ``rmm_track_allocations``, ``rmm.statistics``) read them.
_COUNTING = ("TrackingResourceAdaptor", "StatisticsResourceAdaptor")


def _spill_for(nbytes: int) -> bool:
    """RMM's failure callback: free what tasks that gave their memory back still hold
    (:func:`_collect_garbage`), or spill ``nbytes`` of stored data, or else wait for
    the running tasks to free some (:func:`_wait_for_tasks`); whether to try again."""
    try:
        if (_collect_garbage() or _spill_device_data(nbytes) > 0
                or _wait_for_tasks(nbytes) or _collect_garbage(at_once=True)):
            return True
        if not getattr(_THREAD, "splits", 0):  # the error goes on: say what holds memory
            log.warning("an allocation of %.1f MiB fails on the device: %s",
                        nbytes / 2**20, _holders())
        return False
    except Exception:  # an exception must not cross into RMM's C++: the error raises
        log.exception("spilling stored data for an allocation of %d bytes failed", nbytes)
        return False


def _holders() -> str:
    """What holds device memory on this worker now, in words: the stored data on the
    device, the running tasks' inputs among it, and the tasks' threads."""
    worker = _worker()
    fast = getattr(getattr(getattr(worker, "data", None), "device_buffer", None), "fast", None)
    weights = dict(getattr(fast, "weights", None) or {})
    in_use = _in_use(worker)
    held = sum(w for k, w in weights.items() if k in in_use)
    waits = list(_WAITING.values())
    return (f"{sum(weights.values()) / 2**30:.2f} GiB of stored data on it ({len(weights)} "
            f"values, {held / 2**30:.2f} GiB of them inputs of running tasks); "
            f"{len(getattr(worker, 'active_threads', None) or {})} tasks running, "
            f"{waits.count('sleeping')} of them waiting holding temporaries, "
            f"{waits.count('queued')} queued; {len(_GIVEN_BACK)} given back and not yet "
            f"collected")


#: Per thread: how deep it is in steps that handle their own out-of-memory errors
#: (``splits``), and the allocation it waits for (``wait``: start, last try, delay).
_THREAD = threading.local()


@contextlib.contextmanager
def _handles_oom(handles: bool = True) -> Iterator[None]:
    """Allocations in this block fail at once when nothing is left to spill: the
    caller cuts its work smaller or waits itself (:func:`halving`, :func:`waiting`)."""
    depth = getattr(_THREAD, "splits", 0)
    _THREAD.splits = depth + int(handles)
    try:
        yield
    finally:
        _THREAD.splits = depth


#: Threads that wait for device memory now, by thread id: "sleeping" between tries
#: of an allocation (holding what their step allocated before it), "queued" for
#: their row's turn or between tries of a copy (holding no temporaries).
_WAITING: dict[int, str] = {}


@contextlib.contextmanager
def _marked(state: str) -> Iterator[None]:
    me = threading.get_ident()
    _WAITING[me] = state
    try:
        yield
    finally:
        _WAITING.pop(me, None)


def _sleep(seconds: float, state: str) -> None:
    """Sleep waiting for memory, marked ``state`` for the other threads, and counted."""
    with _marked(state):
        time.sleep(seconds)
    _count("waited_s", seconds)


def _others_running(row: str | None = None) -> bool:
    """Whether a task runs on this worker in another thread that may free memory for
    this one (a finished task's inputs and result go only as the worker's event loop
    takes them). For a row's first try (``row="first"``) only a task that works
    counts: if every other one waits for memory too, none will free any, and the
    rows take turns instead. For the row whose turn it is (``"turn"``) a task that
    waits holding temporaries counts too: it gives them up to queue for its own
    turn. For anything else, any other task."""
    active = getattr(_worker(), "active_threads", None) or {}
    me = threading.get_ident()
    for ident in list(active):
        waits = _WAITING.get(ident)
        if ident != me and (row is None or waits is None
                            or (row == "turn" and waits == "sleeping")):
            return True
    return False


def _wait_for_tasks(nbytes: int) -> bool:
    """Sleep a little (5 ms, doubling to 0.1 s) and say "try again", for up to
    ``WAIT_S`` per allocation and while other tasks run on the worker; False at
    once inside :func:`_handles_oom`.

    An allocation that meets a pool full of the running tasks' temporaries, with
    no stored data left to spill, gets memory as those tasks finish or halve. The
    one that matters is dask-cuda bringing a spilled input back to the device for
    the next task, which happens on the worker's event loop before any src_dask
    code runs and so cannot be cut or retried by it (a D_M=1000 stack in a 4 GB
    pool failed there, 244 MiB refused at 3.59 of 3.73 GiB). The loop stops
    meanwhile, which also holds back the next task's start. A new allocation is
    one of another size, or one that comes more than a second after this thread's
    last try. A row of :func:`halving` waits only while another task may free
    memory for it (:func:`_others_running`)."""
    if getattr(_THREAD, "splits", 0) or not _others_running(getattr(_THREAD, "row", None)):
        return False
    now = time.monotonic()
    start, last, delay, size = getattr(_THREAD, "wait", None) or (now, now, 0.005, nbytes)
    if now - last > 1.0 or size != nbytes:
        start, delay = now, 0.005
        log.debug("an allocation of %.1f MiB waits for running tasks to free device "
                  "memory", nbytes / 2**20, stack_info=True)
    if now - start >= WAIT_S:
        _THREAD.wait = None
        return False
    _sleep(delay, "sleeping")
    _THREAD.wait = (start, time.monotonic(), min(2 * delay, 0.1), nbytes)
    return True


def halving(compute: Callable[[int, int], Any], rows: int, *, xp: Any, run: str, step: str,
            site: int, bytes_per_row: int, axis: int = 0, add_to: Any | None = None) -> Any:
    """``compute(0, rows)``, or the same computed in pieces of rows if it does not fit.

    ``compute(a, b)`` makes rows ``a:b`` of the output along ``axis``; ``step`` is
    the kind of step (a key of ``_UNITS``): the size that fits is shared by every
    step of that kind in the run ``run``. Pieces are written into one output buffer
    as they come, so a split step needs its inputs and output plus one piece's
    temporaries. ``add_to``: pieces are added in place into this array, which is then
    the result (a running sum the caller owns, never a task's input): no output is
    allocated.
    """
    out = _Output(xp, rows, axis, add_to)
    _in_pieces(compute, 0, rows, out, (run, step), site, bytes_per_row)
    return out.array


class _Output:
    """The step's result, allocated when its first piece arrives, or the array the
    pieces are added into."""

    def __init__(self, xp: Any, rows: int, axis: int, add_to: Any | None = None):
        self.xp, self.rows, self.axis, self.array = xp, rows, axis, add_to
        self.adding = add_to is not None
        self.given_back: BaseException | None = None  # the task's Reschedule

    def put(self, a: int, b: int, part: Any) -> None:
        if self.adding:
            self.array[(slice(None),) * self.axis + (slice(a, b),)] += part
            return
        if a == 0 and b == self.rows:
            self.array = part
            return
        if self.array is None:
            shape = list(part.shape)
            shape[self.axis] = self.rows
            self.array = self.xp.empty(tuple(shape), dtype=part.dtype)
        self.array[(slice(None),) * self.axis + (slice(a, b),)] = part


def _in_pieces(compute, a: int, b: int, out: _Output, key: tuple[str, str], site: int,
               per_row: int) -> None:
    """Rows a:b in pieces of the size that fits so far (re-read before each piece:
    a failure here, or in a concurrent task of the run, shrinks it)."""
    lo = a
    while lo < b:
        hi = min(b, lo + _FITS.get(key, b - a))
        _attempt(compute, lo, hi, out, key, site, per_row)
        lo = hi


def _attempt(compute, a: int, b: int, out: _Output, key: tuple[str, str], site: int,
             per_row: int) -> None:
    try:
        with _handles_oom(b - a > 1), _marking("first" if b - a == 1 else None,
                                                b - a < out.rows):
            part = compute(a, b)  # one row left: its allocations wait instead
        out.put(a, b, part)
        return
    except Exception as err:
        if not is_oom(err):
            raise
    # Out of the except clause: the failed attempt's temporaries, which its
    # traceback holds on to, are released before the pool is emptied.
    _free_cached(out.xp, per_row * (b - a))
    if b - a == 1:
        _row_in_turn(compute, a, out, key, site, per_row)
        return
    _count("halved")
    half = (b - a + 1) // 2
    before = _FITS.get(key)
    _FITS[key] = min(before or half, half)
    if _FITS[key] != before:  # one line each time a kind of step gets smaller
        log.warning("site %d, %s: out of %s on %d %ss (about %.1f MiB); computing it in "
                    "pieces of %d from now on", site, _step_name(key[1]), _memory(out.xp),
                    b - a, _UNITS.get(key[1], "row"), per_row * (b - a) / 2**20, _FITS[key])
    _in_pieces(compute, a, b, out, key, site, per_row)


@contextlib.contextmanager
def _marking(row: str | None, piece: bool) -> Iterator[None]:
    """Mark this thread's work as a row of :func:`halving` (``row``: its first try or
    its turn, for :func:`_others_running`) and as a piece of a step cut smaller
    (:func:`in_piece`)."""
    before = getattr(_THREAD, "row", None), getattr(_THREAD, "piece", False)
    _THREAD.row, _THREAD.piece = row, piece
    try:
        yield
    finally:
        _THREAD.row, _THREAD.piece = before


def in_piece() -> bool:
    """Whether this thread computes a piece of a step that :func:`halving` cut smaller
    than it is. Its complex products are then made natively, not as three real ones
    (``_kernels.product_way``): those split both operands into planes, and one of them
    (a core, a projected core) does not shrink with the rows, so every piece would
    split it again, holding memory the piece's count leaves out."""
    return getattr(_THREAD, "piece", False)


#: One row at a time is tried again after it did not fit beside the others.
_TURN = threading.Lock()

#: How often a task whose row does not fit gives its memory back to run again later.
RESCHEDULES = 8
_RESCHEDULED: dict[Any, int] = {}


def _row_in_turn(compute, a: int, out: _Output, key: tuple[str, str], site: int,
                 per_row: int) -> None:
    """Row ``a`` again, after it did not fit: in turn with the other rows that did
    not, so that the rows' temporaries are not all half allocated at once, each
    waiting for the others' (a D_M=1000 stack in a 3 GB pool stopped so, four
    threads each holding part of a row). Its allocations wait while another task
    works or holds temporaries. A row that still does not fit while other tasks run
    gives back all that its task holds (its inputs and output so far) and Dask runs
    the task again later (``distributed.Reschedule``, up to ``RESCHEDULES`` times a
    task); with no other task running, it does not fit at all: ``MemoryError``
    naming the site, the step and what a row needs."""
    with _marked("queued"):
        _TURN.acquire()
    _count("turns")
    try:
        with _marking("turn", out.rows > 1):
            part = compute(a, a + 1)
        out.put(a, a + 1, part)  # the first row allocates the whole output
        return
    except Exception as err:
        if not is_oom(err):
            raise
        task = _worker_task()
        tries = RESCHEDULES + 1
        if task is not None and _others_running():
            tries = _RESCHEDULED[task] = _RESCHEDULED.get(task, 0) + 1
        if tries > RESCHEDULES:
            raise MemoryError(
                f"site {site}, {_step_name(key[1])}: one {_UNITS.get(key[1], 'row')} does "
                f"not fit in {_memory(out.xp)}; it needs about {per_row / 2**20:.1f} MiB "
                f"with its temporaries ({_remedy(out.xp)})") from err
    finally:
        _TURN.release()
    # Out of the except clause, so that the out-of-memory error (and the row's
    # temporaries its traceback holds) does not go along as the context.
    _count("rescheduled")
    log.warning("site %d, %s: one %s does not fit beside the other tasks; the task gives "
                "its memory back and runs again later (%d of %d)", site, _step_name(key[1]),
                _UNITS.get(key[1], "row"), tries, RESCHEDULES)
    raise _give_back(out)


def _give_back(out: _Output) -> BaseException:
    """The ``distributed.Reschedule`` that ends a task to run it again later, its
    output dropped and the task recorded as holding memory until its frames go
    (:data:`_GIVEN_BACK`)."""
    from distributed import Reschedule

    out.array = None
    out.given_back = Reschedule()
    _GIVEN_BACK.add(out)
    return out.given_back


#: The outputs of tasks that gave their memory back (``Reschedule``), while their
#: frames live: the frames of the exception's traceback hold the task's inputs and
#: temporaries until distributed's event loop has taken the exception, and after
#: that too, for distributed keeps the exception in a frame of its own traceback, a
#: reference cycle, which Python's collector frees by count of objects, not of
#: device bytes (a D_M=1000 stack in a 3 GB pool failed so, its pool full with no
#: task running). :func:`_collect_garbage` frees them when memory is short.
_GIVEN_BACK: weakref.WeakSet[Any] = weakref.WeakSet()
_COLLECTED = [0.0]  # when it last collected


def _collect_garbage(at_once: bool = False) -> bool:
    """Whether the memory of a task that gave it back (:data:`_GIVEN_BACK`) came
    free: the finished frames of its exception are cleared of their variables, at
    once, and what a reference cycle still holds is collected. Clearing needs no
    event loop: an allocation on distributed's loop (an input copied back to the
    device) that waited for the loop to take the exceptions would wait for itself
    (a D_M=1000 stack in a 3 GB pool failed so, two tasks given back and none
    running). It runs only while a task has given back, and (but ``at_once``,
    before an allocation fails for good) at most every 0.2 s."""
    now = time.monotonic()
    if not _GIVEN_BACK or (not at_once and now - _COLLECTED[0] < 0.2):
        return False
    _COLLECTED[0] = now
    pending = set(map(id, _GIVEN_BACK))
    _clear_given_back_frames()
    if pending & set(map(id, _GIVEN_BACK)):
        gc.collect()
    freed = len(pending - set(map(id, _GIVEN_BACK)))
    if freed:
        log.info("freed what %d task(s) that gave their memory back still held", freed)
    return freed > 0


#: Frames that clearing would not just empty but close (a generator's, a coroutine's).
_SUSPENDABLE = (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
                | inspect.CO_ITERABLE_COROUTINE)


def _clear_given_back_frames() -> None:
    """Clear the variables of the frames that the given-back tasks' exceptions hold,
    those of plain functions that have finished (one still running, its thread
    unwinding, is left for a later call; a generator's or coroutine's is left alone,
    for clearing it would close it)."""
    for out in list(_GIVEN_BACK):
        tb = out.given_back.__traceback__  # set by _give_back, which adds it here
        while tb is not None:
            if not tb.tb_frame.f_code.co_flags & _SUSPENDABLE:
                with contextlib.suppress(RuntimeError):  # still running
                    tb.tb_frame.clear()
            tb = tb.tb_next


def _worker_task() -> Any:
    """The key of the task this thread runs on a Dask worker, else None."""
    try:
        from distributed import get_worker

        return get_worker().get_current_task()
    except (ImportError, ValueError, AttributeError):
        return None


#: Seconds an allocation that has no rows to split waits in all for memory to come
#: free (:func:`waiting`, :func:`_wait_for_tasks`): other tasks' temporaries go as
#: those finish or halve.
WAIT_S = 30.0


def waiting(compute: Callable[[], Any], *, xp: Any, nbytes: int, site: int, what: str) -> Any:
    """``compute()``, tried again while it runs out of memory, for up to ``WAIT_S``.

    For what has no rows to split: a block of inputs copied to the device. There a
    pool may be full for a moment of the running tasks' temporaries (four threads'
    steps trying pieces that :func:`halving` then cuts), which no spilling frees but
    which go as those tasks finish or halve (a D_M=1000 stack in a 4 GB pool failed
    that way in its first second, its inputs' copy refused 244 MiB). Each attempt
    frees the pools' cached blocks and spills ``nbytes`` of stored data first, then
    waits a little longer (10 ms, doubling up to 0.5 s); past ``WAIT_S`` the
    out-of-memory error names the site."""
    delay, deadline = 0.01, time.monotonic() + WAIT_S
    while True:
        try:
            with _handles_oom():
                return compute()
        except Exception as err:
            if not is_oom(err):
                raise
            if time.monotonic() >= deadline:
                raise MemoryError(
                    f"site {site}, {what}: out of {_memory(xp)} for {nbytes / 2**20:.1f} MiB "
                    f"after {WAIT_S:g} s of waiting for other tasks to free some "
                    f"({_remedy(xp)})") from err
        _free_cached(xp, nbytes)  # out of the except clause: the attempt's memory is gone
        _sleep(delay, "queued")
        delay = min(2 * delay, 0.5)


def _step_name(step: str) -> str:
    return step if step.startswith("pass") else f"pass 2's {step}"


def naming_the_site(kernel: Callable[..., Any], *, site: int, step: str) -> Callable[..., Any]:
    """``kernel`` whose out-of-memory errors say which site and step ran out, and
    what to change: for the one step that has no rows to split, the QR of the
    sketch (``chi_out + oversample`` columns by the output's rows and legs)."""
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return kernel(*args, **kwargs)
        except Exception as err:
            if not is_oom(err):
                raise
            xp = _namespace(args)
            raise MemoryError(
                f"site {site}, {step}: out of {_memory(xp)} ({err}); this step is one "
                f"piece: {_remedy(xp)}") from err
    return run


def _memory(xp: Any) -> str:
    return "device memory" if getattr(xp, "__name__", "") == "cupy" else "host memory"


def _remedy(xp: Any) -> str:
    if getattr(xp, "__name__", "") == "cupy":
        return ("give each GPU worker more free device memory (dask-cuda's "
                "device_memory_limit, fewer tasks per GPU, a larger GPU) or sketch fewer "
                "columns (chi_out + oversample)")
    return ("give each worker more memory (memory_limit / --memory-limit, fewer threads "
            "per worker) or sketch fewer columns (chi_out + oversample)")


def _namespace(args: tuple[Any, ...]) -> Any:
    """``numpy`` or ``cupy``: that of the first array among a kernel's arguments."""
    import numpy as np

    for a in args:
        for x in (a if isinstance(a, (list, tuple)) else [a]):
            if type(x).__module__.startswith("cupy"):
                import cupy

                return cupy
    return np
