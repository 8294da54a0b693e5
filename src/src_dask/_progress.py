"""Progress bars, run logs and Dask's performance report for one ``src`` run.

:func:`watch` wraps the single ``dask.compute`` of :func:`src_dask.src`. It
never touches the graph, so the result is the same with or without it, and
it sends the scheduler no graph of its own (a run stays one ``update_graph``):

* on Dask's local schedulers (no client) a :class:`dask.callbacks.Callback`
  counts finished tasks in its ``posttask`` hook, in the calling thread;
* on a ``distributed`` cluster a diagnostics stream — the scheduler's
  ``feed`` handler, which ``distributed.progress`` uses too — installs a small
  scheduler plugin that counts this run's tasks as they reach memory and
  reports the counts every 0.2 s. The plugin is installed before the graph is
  sent, so no task is missed; the stream's functions are pickled by value, so
  the scheduler needs dask and distributed but not ``src_dask``.

Tasks are counted by prefix (``pass1_site7``, see :mod:`._graph`), which
is how the bar knows the pass and the site: pass 1 (the sketch) sweeps left
to right, pass 2 (projection and QR) right to left, and an oversampled run
rounds left to right in a third pass. The bar is text on a stream (stderr by
default; redrawn in place on a terminal, a line per pass and every 10 s
otherwise, e.g. in a batch log) or, in a Jupyter kernel, an ipywidgets bar
(an updating HTML display without ipywidgets).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
import math
import os
import shutil
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, TextIO

import numpy as np
from dask.callbacks import Callback
from dask.utils import format_bytes, key_split

from ._graph import keys as graph_keys

log = logging.getLogger("src_dask")

#: The sweeps in the order they run: name, label, direction over the sites.
_PASSES = (("pass1", "sketch", 1), ("pass2", "projection/QR", -1), ("round", "rounding", 1))


# -- option checks ---------------------------------------------------------------
def check_progress(progress: Any) -> bool | TextIO:
    """``progress`` of :func:`src`: a bool or a text stream (anything with ``write``)."""
    if isinstance(progress, bool) or callable(getattr(progress, "write", None)):
        return progress
    raise TypeError("progress: expected True, False or a text stream (an object with a "
                    f"write method), got {type(progress).__name__}")


def check_report(report: Any, client: Any) -> str | None:
    """``performance_report`` of :func:`src`: None or a path to an HTML file that can be
    written, on a distributed client (the report is made by the scheduler)."""
    if report is None:
        return None
    if not isinstance(report, str | os.PathLike):
        raise TypeError("performance_report: expected a path to an HTML file (str or "
                        f"os.PathLike), got {type(report).__name__}")
    path = os.fspath(report)
    if not path:
        raise ValueError("performance_report: the path is empty")
    if client is None:
        raise ValueError(
            "performance_report needs a distributed Client (Dask's HTML report is made by "
            "its scheduler); pass client=, e.g. `with distributed.Client() as client:`, "
            "or use progress=True on the local scheduler")
    parent = os.path.dirname(os.path.abspath(path))
    if "://" not in path and not os.path.isdir(parent):
        raise ValueError(f"performance_report: the folder {parent} does not exist")
    try:
        drawable = client.run_on_scheduler(has_bokeh)
    except Exception:  # noqa: BLE001 - a scheduler that cannot run it: warned at the end
        drawable = True
    if not drawable:
        raise ValueError("performance_report needs bokeh where the Dask scheduler runs (it "
                         "draws the report): install bokeh there, or leave the report out")
    return path


def has_bokeh() -> bool:
    """Whether bokeh, which Dask's performance report is drawn with, imports here."""
    import importlib.util

    return importlib.util.find_spec("bokeh") is not None


# -- the run log -----------------------------------------------------------------
def describe(stack: Any, plan: Any, client: Any) -> str:
    """One line on a run for the INFO log: product, sizes, sketch, device, where."""
    inputs = sum(math.prod(c.shape) * np.dtype(c.dtype).itemsize
                 for f in stack.factors for c in f.train)
    envs = sum(plan.sketch * math.prod(stack.left_bonds(j)) for j in range(1, stack.n))
    blocks = len(plan.blocks)
    if client is None:
        import dask

        where = f"Dask's local scheduler ({dask.config.get('scheduler', None) or 'threads'})"
    else:
        nthreads = client.nthreads()
        where = (f"{len(nthreads)} workers ({sum(nthreads.values())} threads) at "
                 f"{client.scheduler.address}")
    return (f"{stack.describe()}, inputs {format_bytes(inputs)}; chi_out {plan.chi_out}, sketch "
            f"{plan.sketch} in {blocks} block{'s' * (blocks > 1)} of {plan.chunk}, "
            f"environments {format_bytes(envs * stack.dtype.itemsize)}"
            + (f", tasks sized to {format_bytes(plan.task_bytes)} each"
               if getattr(plan, "task_bytes", None) else "")
            + f"; on the {plan.device.upper()}, {where}")


def _seconds(t: float) -> str:
    return f"{t:.1f} s" if t < 60 else f"{int(t // 60)} min {int(t % 60):02d} s"


# -- counting tasks ----------------------------------------------------------------
class Tally:
    """The tasks of one run by prefix: how many in all, how many done; and so where
    the run is (which pass, which site)."""

    def __init__(self, keys: Iterable[Any], token: str) -> None:
        self.token, self.suffix = token, "-" + token
        # the final list of cores is not a step (on a cluster it is not even run)
        self.total = Counter(p for k in keys if graph_keys.is_of_run(k, token)
                             and (p := key_split(k)) != graph_keys.RESULT)
        self.done: Counter[str] = Counter()
        self.started = time.perf_counter()
        steps = [step for p in self.total if (step := graph_keys.step_of(p))]
        self.sites = 1 + max((site for _, site in steps), default=-1)
        self.passes = 3 if any(step == "round" for step, _ in steps) else 2

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def counts(self) -> tuple[int, int]:
        """(tasks done, tasks in all)."""
        done = sum(min(self.done[p], n) for p, n in self.total.items())
        return done, sum(self.total.values())

    def where(self) -> str:
        """The pass and the site the run is at, e.g. ``pass 2 of 2 (projection/QR), site
        31 -> 0``: the first unfinished site in the sweep's direction, then the last one."""
        for number, (step, label, direction) in enumerate(_PASSES, 1):
            pending = [at[1] for p, n in self.total.items()
                       if (at := graph_keys.step_of(p)) and at[0] == step and self.done[p] < n]
            if pending:
                first, last = (min(pending), self.sites - 1) if direction > 0 else \
                    (max(pending), 0)
                return f"pass {number} of {self.passes} ({label}), site {first} -> {last}"
        return "writing the result"

    def line(self, state: str = "running", width: int = 20) -> str:
        """The progress bar as one line of text, ``state`` running, done or failed."""
        done, total = self.counts()
        if state == "done":
            done, head = total, f"done: {self.passes} passes over {self.sites} sites"
        elif state == "failed":
            head = f"failed at {self.where()}"
        else:
            head = self.where()
        frac = done / total if total else 1.0
        bar = f" [{'#' * int(width * frac):.<{width}}]" if width else ""
        return (f"src_dask {head} | {done}/{total} tasks{bar} {int(100 * frac):3d}%"
                f" | {_seconds(self.elapsed)}")


# -- displays ----------------------------------------------------------------------
class Display(Protocol):
    """Where the bar is drawn; ``update`` may be called from another thread."""

    def update(self, tally: Tally) -> None: ...

    def close(self, tally: Tally, state: str) -> None: ...


class TextDisplay:
    """The bar on a text stream: redrawn in place (``\\r``) on a terminal, at most 10
    times a second; elsewhere (a log file, a pipe) a new line when the pass changes
    and at most every ``every`` seconds, so batch logs stay short."""

    def __init__(self, stream: TextIO, every: float = 10.0) -> None:
        self.stream = stream
        try:
            self.tty = bool(stream.isatty())
        except Exception:  # noqa: BLE001 - no isatty, a closed or broken stream: not a terminal
            self.tty = False
        self.every = 0.1 if self.tty else every
        self.lock = threading.Lock()
        self.last, self.last_pass, self.width, self.closed = -math.inf, None, 0, False

    def _write(self, tally: Tally, state: str) -> None:
        if self.tty:  # one row of the terminal, or "\r" cannot redraw it
            columns = shutil.get_terminal_size().columns - 1
            text = next((t for w in (20, 10, 0) if len(t := tally.line(state, w)) <= columns),
                        tally.line(state, 0)[:columns])
            self.stream.write("\r" + text.ljust(self.width))
            self.width = len(text)
        else:
            self.stream.write(tally.line(state) + "\n")
        self.stream.flush()

    def update(self, tally: Tally) -> None:
        now = time.perf_counter()
        if now - self.last < min(self.every, 0.1):
            return  # cheap exit for the many tasks of a fast run
        where = tally.where()
        step = where.split(",")[0]
        with self.lock:
            if self.closed or (now - self.last < self.every and step == self.last_pass):
                return
            self.last, self.last_pass = now, step
            self._write(tally, "running")

    def close(self, tally: Tally, state: str) -> None:
        with self.lock:
            self.closed = True
            self._write(tally, state)
            if self.tty:
                self.stream.write("\n")
                self.stream.flush()


class NotebookDisplay:
    """The bar in a Jupyter notebook: an ipywidgets progress bar and label, or
    without ipywidgets an HTML ``<progress>`` display updated in place."""

    def __init__(self) -> None:
        from IPython.display import HTML, DisplayHandle, display

        self.html = HTML
        self.lock = threading.Lock()
        self.last, self.closed = -math.inf, False
        try:
            import ipywidgets
        except ImportError:
            self.bar = None
            self.handle = DisplayHandle()
            self.handle.display(HTML(""))
        else:
            self.bar = ipywidgets.IntProgress(min=0, max=1, bar_style="info")
            self.label = ipywidgets.HTML()
            display(ipywidgets.HBox([self.bar, self.label]))

    def _draw(self, tally: Tally, state: str) -> None:
        done, total = tally.counts()
        done = total if state == "done" else done
        text = html.escape(tally.line(state).split(" | ", 1)[0].removeprefix("src_dask "))
        text = f"<code>src_dask</code> {text} &middot; {done}/{total} tasks &middot; " \
               f"{_seconds(tally.elapsed)}"
        if self.bar is None:
            self.handle.update(self.html(
                f'<progress value="{done}" max="{max(total, 1)}" style="width: 30ex"></progress> '
                f"{text}"))
            return
        self.bar.max, self.bar.value, self.label.value = max(total, 1), done, text
        if state != "running":
            self.bar.bar_style = "success" if state == "done" else "danger"

    def update(self, tally: Tally) -> None:
        now = time.perf_counter()
        with self.lock:
            if self.closed or now - self.last < 0.2:
                return
            self.last = now
            self._draw(tally, "running")

    def close(self, tally: Tally, state: str) -> None:
        with self.lock:
            self.closed = True
            self._draw(tally, state)


class Advisory:
    """A display whose failures never reach the run: the first exception it raises
    (a full disk, a closed stream, a broken widget) drops the bar with one WARNING
    on the ``src_dask`` log, and every later call does nothing.

    ``update`` is called inside Dask's callbacks (local schedulers) and in the
    client's event loop (:class:`ClusterWatcher`), ``close`` at the end of the run:
    an exception in any of them would abort the run or replace its result or error.
    """

    def __init__(self, display: Display) -> None:
        self.display = display
        self.lock = threading.Lock()
        self.broken = False

    def _call(self, method: str, *args: Any) -> None:
        if self.broken:
            return
        try:
            getattr(self.display, method)(*args)
        except Exception as err:  # noqa: BLE001 - the bar is advisory, the run goes on
            with self.lock:
                if self.broken:
                    return
                self.broken = True
            what = ("write to the progress stream" if isinstance(self.display, TextDisplay)
                    else "draw the progress bar")
            log.warning("progress: cannot %s (%s: %s); continuing without it", what,
                        type(err).__name__, err)

    def update(self, tally: Tally) -> None:
        self._call("update", tally)

    def close(self, tally: Tally, state: str) -> None:
        self._call("close", tally, state)


def display_for(progress: bool | TextIO) -> Display | None:
    """The display ``progress`` asks for: True is a notebook bar in a Jupyter kernel,
    else text on stderr; a stream gets text. Failures to draw it are :class:`Advisory`."""
    if progress is False:
        return None
    if progress is True:
        from distributed.utils import is_kernel

        return _advisory(NotebookDisplay if is_kernel() else lambda: TextDisplay(sys.stderr))
    return _advisory(lambda: TextDisplay(progress))


def _advisory(make: Any) -> Display | None:
    """``make()`` as an :class:`Advisory` display; None (no bar, one WARNING) if even
    making it fails (e.g. a notebook display that cannot be shown)."""
    try:
        return Advisory(make())
    except Exception as err:  # noqa: BLE001 - the bar is advisory, the run goes on
        log.warning("progress: cannot show the progress bar (%s: %s); continuing without it",
                    type(err).__name__, err)
        return None


# -- watchers ----------------------------------------------------------------------
class LocalWatcher(Callback):
    """Counts this run's finished tasks on Dask's local schedulers (``posttask`` runs in
    the thread that called ``dask.compute``)."""

    def __init__(self, tally: Tally, display: Display) -> None:
        super().__init__()
        self.tally, self.display = tally, display

    def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
        if graph_keys.is_of_run(key, self.tally.token):
            self.tally.done[key_split(key)] += 1
            self.display.update(self.tally)


def _scheduler_side(token: str) -> tuple[Any, Any, Any]:
    """``setup``, ``function`` and ``teardown`` of the scheduler's ``feed`` handler.

    Local functions and a local class, so they are pickled by value: the
    scheduler runs them without importing ``src_dask``.
    """
    from distributed.diagnostics.plugin import SchedulerPlugin

    name, suffix = f"src-dask-progress-{token}", "-" + token

    class Count(SchedulerPlugin):
        """Tasks of the run that reached memory, by prefix (a recomputed task once)."""

        def __init__(self) -> None:
            self.seen: set = set()
            self.done: dict[str, int] = {}

        def transition(self, key: Any, start: str, finish: str, *args: Any,
                       **kwargs: Any) -> None:
            head = key[0] if isinstance(key, tuple) else key
            if finish == "memory" and isinstance(head, str) and head.endswith(suffix) \
                    and key not in self.seen:
                self.seen.add(key)
                prefix = key_split(key)
                self.done[prefix] = self.done.get(prefix, 0) + 1

    def setup(scheduler: Any) -> Count:
        plugin = Count()
        scheduler.add_plugin(plugin, name=name)
        return plugin

    def function(scheduler: Any, plugin: Count) -> dict[str, int]:
        return dict(plugin.done)

    def teardown(scheduler: Any, plugin: Count) -> None:
        scheduler.plugins.pop(name, None)

    return setup, function, teardown


class ClusterWatcher:
    """Counts this run's finished tasks on a distributed cluster through a ``feed``
    stream from the scheduler (see the module docstring); a context manager.

    Entering waits (at most ``wait`` seconds) until the scheduler-side counter is
    installed; a scheduler that cannot run it only costs the bar, with a warning on
    the log.
    """

    def __init__(self, client: Any, tally: Tally, display: Display, interval: float = 0.2,
                 wait: float = 10.0) -> None:
        self.client, self.tally, self.display = client, tally, display
        self.interval, self.wait = interval, wait
        self.ready = threading.Event()
        self.future: Any = None

    async def _listen(self) -> None:
        from distributed.core import CommClosedError, clean_exception, connect
        from distributed.protocol.pickle import dumps

        setup, function, teardown = _scheduler_side(self.tally.suffix[1:])
        comm = None
        try:
            comm = await connect(self.client.scheduler.address, **self.client.connection_args)
            await comm.write({"op": "feed", "setup": dumps(setup), "function": dumps(function),
                              "teardown": dumps(teardown), "interval": self.interval})
            while True:
                done = await comm.read()
                if "status" in done:  # the scheduler could not run the stream
                    raise clean_exception(**done)[1]
                self.tally.done = Counter(done)
                self.ready.set()
                self.display.update(self.tally)
        except CommClosedError:
            pass
        except Exception as err:  # noqa: BLE001 - the bar is optional, the run goes on
            log.warning("progress: cannot follow the run on the scheduler (%s); no progress "
                        "bar", err)
        finally:
            self.ready.set()
            if comm is not None:
                comm.abort()

    def __enter__(self) -> ClusterWatcher:
        self.future = asyncio.run_coroutine_threadsafe(self._listen(),
                                                       self.client.loop.asyncio_loop)
        if not self.ready.wait(self.wait):
            log.warning("progress: the scheduler did not answer in %.0f s; the bar may "
                        "miss early tasks", self.wait)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.future.cancel()  # aborts the comm; the scheduler then removes its counter


# -- the run -----------------------------------------------------------------------
@contextlib.contextmanager
def watch(graph: Any, client: Any, progress: bool | TextIO = False,
          report: str | None = None, summary: str = "") -> Iterator[None]:
    """Around the ``dask.compute`` of ``graph``: the progress bar, Dask's performance
    report (``report``, a path; needs ``client``) and the closing INFO log line.

    A report that cannot be written warns instead of raising: the run's result is
    worth more than its report.
    """
    display = display_for(progress)
    tally = Tally(graph.dask.keys(), graph_keys.token_of(graph.key)) if display else None
    with contextlib.ExitStack() as stack:
        stack.enter_context(groups_page_errors_dropped())
        if report is not None:
            stack.enter_context(_performance_report(client, report, summary))
        if display is not None:
            stack.enter_context(LocalWatcher(tally, display) if client is None
                                else ClusterWatcher(client, tally, display))
        started = time.perf_counter()
        try:
            yield
        except BaseException as err:
            log.info("src: failed after %s (%s)", _seconds(time.perf_counter() - started),
                     type(err).__name__)
            if display is not None:
                stack.callback(display.close, tally, "failed")
            raise
        log.info("src: done in %s", _seconds(time.perf_counter() - started))
        if display is not None:
            stack.callback(display.close, tally, "done")


class _GroupsPageBug(logging.Filter):
    """Drops the records of one known failure of distributed's dashboard: its "Groups"
    page (``/groups``) fails while a graph runs, with a ``KeyError`` in
    ``TaskGroupGraph.update_layout`` (a task group whose dependency it has not laid
    out; a plain ``dask.array`` computation does it too, and
    ``tests/test_progress.py::test_distributeds_groups_page_fails_during_a_run`` keeps
    the reproducer). The page still answers 500; only the traceback, which the
    scheduler of a ``LocalCluster`` prints into the user's terminal at every refresh,
    is left out. Any other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        info = record.exc_info
        if not info or not isinstance(info[1], KeyError):
            return True
        tb = info[2]
        while tb is not None:
            if tb.tb_frame.f_code.co_name == "update_layout":
                return False
            tb = tb.tb_next
        return True


#: The loggers that print that failure: distributed's ``log_errors`` and tornado's.
_GROUPS_LOGGERS = ("distributed.dashboard.components.scheduler", "tornado.application")


@contextlib.contextmanager
def groups_page_errors_dropped() -> Iterator[None]:
    """While a run goes: :class:`_GroupsPageBug` on the loggers that print it."""
    bug = _GroupsPageBug()
    loggers = [logging.getLogger(name) for name in _GROUPS_LOGGERS]
    for logger in loggers:
        logger.addFilter(bug)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(bug)


@contextlib.contextmanager
def _performance_report(client: Any, path: str, summary: str) -> Iterator[None]:
    """``distributed.performance_report`` on ``client`` (not only on the default client),
    with the run's summary as its "calling code", and Bokeh's JavaScript inline: the
    file opens without the network (compute nodes are often offline; by default the
    report loads Bokeh from a CDN and is blank without it)."""
    from distributed import performance_report

    report = performance_report(filename=path, mode="inline")
    with client.as_current():
        client.sync(report.__aenter__)
    try:
        yield
    finally:
        try:
            with client.as_current():
                client.sync(report.__aexit__, None, None, None,
                            code=f"# src_dask.src\n# {summary}\n")
        except Exception as err:  # noqa: BLE001 - keep the result, say what went wrong
            warnings.warn(f"performance_report: could not write {path}: {err}",
                          RuntimeWarning, stacklevel=4)
        else:
            log.info("src: performance report written to %s", path)
