# ruff: noqa: T201
"""What the transfers between Dask workers did during a timed call, and whether the
workers' and the scheduler's event loops kept up: the ``transfers`` field of
``bench_stack.py``'s record, read from distributed's public diagnostics.

A cluster whose transfers are watched starts under :data:`LOG_CONFIG`: distributed
keeps ``Worker.transfer_incoming_log`` and ``transfer_outgoing_log`` (one dict per
``gather_dep`` / ``get_data``: ``start``, ``stop``, ``duration``, ``who``, ``keys``
{key: nbytes}, ``total``, ``bandwidth``) and the worker state machine's transition log
(``WorkerState.log``) in deques of Dask config ``distributed.admin.low-level-log-length``
entries (1000 by default, :data:`MAXLEN` under :data:`LOG_CONFIG`; workers started
outside take it from their environment,
``DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH``). Before each call
:meth:`TransferWatch.reset` (``best_of``'s ``setup``, untimed) registers, once, a
:class:`WatchWorker` plugin on every worker and a :class:`WatchScheduler` plugin on the
scheduler (``Client.register_plugin``), and has them mark where the logs stand, so that
warm-up transfers do not count, and restart their event-loop watch (a tornado
``PeriodicCallback`` every :data:`TICK_S`; a tick later than :data:`STALL_S` is a stall,
kept with its time). (``Worker.digests`` would give percentiles but need crick.) The
plugins are read back through the public ``Worker.plugins`` and ``Scheduler.plugins``.

After the timed calls :meth:`TransferWatch.collect` reads it all back (the last
call's, with ``repeats`` > 1) and :func:`summarise` matches each incoming transfer
with the task that caused it (the task stream's ``transfer`` action, which
distributed writes with the log entry's start and stop), the sender's outgoing entry
(same keys), the receiver's transition log (when its keys went to ``fetch`` and
``flight``), the loops' stalls and what computed on either worker meanwhile. Spans
within a worker and between the two ends of a transfer (``wait``, ``launch``,
``request``, ``dependent_after``) are on the workers' own clocks (one host here: the
same clock); against the task stream and the other loops, on the scheduler's (the
logs' times carry the workers' ``scheduler_delay``, an estimate that moves by
milliseconds).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from tools.timeline import covered, merge

#: Entries each log of a watched cluster keeps (distributed's default is 1000).
MAXLEN = 200_000
#: The Dask config a watched cluster starts under (its workers' and scheduler's logs).
LOG_CONFIG = {"distributed.admin.low-level-log-length": MAXLEN}
#: The event-loop watch's period, and the lateness that counts as a stall.
TICK_S, STALL_S = 0.01, 0.05
#: Stalls each loop keeps (the longest are reported, with what computed meanwhile).
MAX_STALLS = 100_000


# -- on the workers and the scheduler (plugins, read by client.run / run_on_scheduler) -----
class _LoopWatch:
    """A tornado callback every ``interval`` s on the current event loop; records the
    gaps between its ticks, and every gap over :data:`STALL_S` with its time.

    With ``stacks`` (a worker: its own process), each tick also re-arms faulthandler's
    watchdog, a C thread that needs no GIL: a loop late by 1.6 :data:`STALL_S` has
    every thread's Python stack written down while it is stalled (what the loop
    waits in, what the other threads run), summed up by :func:`_stall_stacks`."""

    def __init__(self, server: Any, interval: float = TICK_S, stacks: bool = False) -> None:
        import tempfile

        from tornado.ioloop import PeriodicCallback

        self.server = server
        self.interval = interval
        self.stacks = tempfile.TemporaryFile("w+") if stacks else None
        self.pc = PeriodicCallback(self.tick, interval * 1000)
        self.reset()

    def _delay(self) -> float:
        return getattr(self.server, "scheduler_delay", 0.0) or 0.0

    def reset(self) -> None:
        from distributed.metrics import time

        self.last = self.t0 = time()
        self.n, self.total, self.max = 0, 0.0, 0.0
        self.stalls: list[tuple[float, float]] = []
        if self.stacks is not None:
            self.stacks.seek(0)
            self.stacks.truncate()
        if not self.pc.is_running():
            self.pc.start()

    def tick(self) -> None:
        from distributed.metrics import time

        now = time()
        gap, self.last = now - self.last, now
        self.n += 1
        self.total += gap
        self.max = max(self.max, gap)
        if gap > STALL_S and len(self.stalls) < MAX_STALLS:
            self.stalls.append((now - gap + self._delay(), now + self._delay()))
        if self.stacks is not None:
            import faulthandler

            faulthandler.dump_traceback_later(1.6 * STALL_S, file=self.stacks)

    def stop(self) -> None:
        self.pc.stop()
        if self.stacks is not None:
            import faulthandler

            faulthandler.cancel_dump_traceback_later()

    def read(self) -> dict[str, Any]:
        self.stop()
        out = {"interval_s": self.interval, "ticks": self.n, "total_s": self.total,
               "max_s": self.max, "stalls": list(self.stalls), "t0": self.t0 + self._delay()}
        if self.stacks is not None:
            self.stacks.seek(0)
            out["stall_stacks"] = _stall_stacks(self.stacks.read())
        return out


def _stall_stacks(text: str, top: int = 12) -> dict[str, Any]:
    """faulthandler's dumps, summed up: how many, and the most frequent top frames of
    the event loop's thread and of the others (``file:line function``, three deep)."""
    import re
    from collections import Counter

    loop, others = Counter(), Counter()
    dumps = [d for d in text.split("Timeout (") if d.strip()]
    for dump in dumps:
        for thread in re.split(r"\n(?=Thread 0x|Current thread 0x)", dump)[1:]:
            frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', thread)
            if frames:
                where = " < ".join(f"{Path(f).name}:{n} {fn}" for f, n, fn in frames[:3])
                on_loop = any(fn == "run_forever" for _, _, fn in frames)
                (loop if on_loop else others)[where] += 1
    return {"dumps": len(dumps), "loop": loop.most_common(top), "others": others.most_common(top)}


def _since(log: Any, mark: Any) -> tuple[list[Any], bool]:
    """The entries of ``log`` after ``mark`` (the entry that was last at the reset; None:
    the log was empty then), and whether some of them may be gone (``mark`` itself
    dropped off the deque's far end, or an unmarked log at its full length)."""
    entries = list(log)
    if mark is None:
        return entries, len(entries) == log.maxlen
    for i in range(len(entries) - 1, -1, -1):
        if entries[i] is mark:
            return entries[i + 1:], False
    return entries, True


class WatchWorker(WorkerPlugin):
    """On each worker: where its transfer and transition logs stood at the last
    :meth:`reset`, and the event-loop watch; :meth:`collect` reads what came since
    (nothing of the worker's is replaced or cleared)."""

    name = "bench-transfer-watch"
    idempotent = True

    def setup(self, worker: Any) -> None:
        self.worker = worker
        self.loop = _LoopWatch(worker, stacks=True)
        self.marks: tuple[Any, Any, Any] = (None, None, None)

    def teardown(self, worker: Any) -> None:
        self.loop.stop()

    def _logs(self) -> tuple[Any, Any, Any]:
        w = self.worker
        return w.state.log, w.transfer_incoming_log, w.transfer_outgoing_log

    def reset(self) -> None:
        self.marks = tuple(log[-1] if log else None for log in self._logs())
        self.loop.reset()

    def collect(self) -> dict[str, Any]:
        """What the logs and the watch hold since the last reset."""
        dask_worker, ws = self.worker, self.worker.state
        (log, log_full), (incoming, in_full), (outgoing, out_full) = (
            _since(x, m) for x, m in zip(self._logs(), self.marks, strict=True))
        states = [(e[0], e[3], e[-1]) for e in log  # this worker's clock
                  if len(e) == 7 and e[3] in ("fetch", "flight", "executing")
                  and isinstance(e[4], dict)]
        return {
            "config": _comm_config(), "threads": ws.nthreads, "name": str(dask_worker.name),
            "delay": dask_worker.scheduler_delay,
            "incoming": [dict(e) for e in incoming], "outgoing": [dict(e) for e in outgoing],
            "states": states, "busy_replies": sum(1 for e in log if e[0] == "gather-dep-busy"),
            "logs_full": [log_full, in_full, out_full], "log_maxlen": ws.log.maxlen,
            "loop": self.loop.read(),
            "limits": {"incoming_count": ws.transfer_incoming_count_limit,
                       "incoming_bytes": ws.transfer_incoming_bytes_limit,
                       "message_bytes": ws.transfer_message_bytes_limit,
                       "outgoing_count": dask_worker.transfer_outgoing_count_limit},
        }


class WatchScheduler(SchedulerPlugin):
    """On the scheduler: its event-loop watch."""

    name = "bench-transfer-watch"
    idempotent = True

    async def start(self, scheduler: Any) -> None:
        self.loop = _LoopWatch(scheduler)

    async def close(self) -> None:
        self.loop.stop()


def _worker_reset(dask_worker: Any) -> None:
    dask_worker.plugins[WatchWorker.name].reset()


def _worker_collect(dask_worker: Any) -> dict[str, Any]:
    return dask_worker.plugins[WatchWorker.name].collect()


def _scheduler_reset(dask_scheduler: Any) -> None:
    dask_scheduler.plugins[WatchScheduler.name].loop.reset()


def _scheduler_collect(dask_scheduler: Any) -> dict[str, Any]:
    return {"loop": dask_scheduler.plugins[WatchScheduler.name].loop.read()}


def _comm_config() -> dict[str, Any]:
    """What shapes a worker's transfers besides the code: its GIL switch interval, the
    UCX settings of Dask's config and the UCX/Dask variables of its environment."""
    import os
    import sys

    import dask

    return {"switch_interval_s": sys.getswitchinterval(),
            "ucx": {k: dask.config.get(k, None) for k in ("distributed.comm.ucx",
                                                          "distributed-ucxx")},
            "env": {k: v for k, v in os.environ.items() if k.startswith(("UCX", "DASK_"))}}


# -- in the client ---------------------------------------------------------------------
class TransferWatch:
    """The instruments of this module on ``client``'s cluster: :meth:`reset` before
    each call, :meth:`collect` after the last."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.failed: str | None = None
        self.calls = 0  # resets so far: calls watched

    def reset(self) -> None:
        self.calls += 1
        try:
            self.client.register_plugin(WatchWorker())  # once: then ignored (idempotent)
            self.client.register_plugin(WatchScheduler())
            self.client.run(_worker_reset)
            self.client.run_on_scheduler(_scheduler_reset)
        except Exception as err:  # the timing goes on without its diagnosis
            self.failed = f"reset: {type(err).__name__}: {err}"

    def collect(self, stream: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict]]:
        """(summary, every transfer) of the last call; ``stream``: its task stream."""
        if self.failed:
            return {"failed": self.failed}, []
        try:
            workers = self.client.run(_worker_collect)
            scheduler = self.client.run_on_scheduler(_scheduler_collect)
            return summarise(workers, scheduler, stream)
        except Exception as err:  # the timing stands without its diagnosis
            return {"failed": f"{type(err).__name__}: {err}"}, []


def stall_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """Of :meth:`TransferWatch.collect`'s summary, each event loop's stalls and the
    seconds they lasted (``{"w0": {"stalls": 3, "stalled_s": 0.4}, "scheduler": ...}``)."""
    return {name: {"stalls": loop.get("stalls"), "stalled_s": loop.get("stalled_s")}
            for name, loop in summary.get("event_loop", {}).items()}


def label(key: Any) -> str:
    """A key's step, as the profile names them, and for tuple keys the first word
    after the name: ``pass1``, ``pass2.fetch``, ``pass2.sketch``, ``load``, ..."""
    from dask.utils import key_split

    step = key_split(key).split("_site")[0]
    if isinstance(key, (tuple, list)):
        word = next((k for k in key[1:] if isinstance(k, str)), None)
        if word is not None:
            step = f"{step}.{word}"
    return step


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key


def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None else round(x, nd)


def _read_stream(stream: list[dict[str, Any]]) -> dict[str, Any]:
    """From the task stream: each worker's compute intervals (merged, and labelled),
    each task's compute start, and the task each transfer was for (its ``transfer``
    action: worker, start, stop and source)."""
    computing: dict[str, list[tuple[float, float]]] = {}
    running: dict[str, list[tuple[float, float, str]]] = {}
    started: dict[tuple[str, Any], float] = {}
    cause: dict[tuple[Any, ...], Any] = {}
    for task in stream:
        w, key = task.get("worker"), _hashable(task["key"])
        for ss in task.get("startstops", ()):
            if ss["action"] == "compute":
                computing.setdefault(w, []).append((ss["start"], ss["stop"]))
                running.setdefault(w, []).append((ss["start"], ss["stop"], label(key)))
                started[w, key] = min(started.get((w, key), ss["start"]), ss["start"])
            elif ss["action"] == "transfer":
                cause[w, ss.get("source"), ss["start"], ss["stop"]] = key
    return {"computing": {w: merge(v) for w, v in computing.items()}, "running": running,
            "started": started, "cause": cause}


def _first(states: dict[Any, list[tuple[str, float]]], keys: Any, state: str, pick: Any,
           before: float | None = None) -> float | None:
    """``pick`` (min or max) of the times ``keys`` went to ``state`` (up to ``before``);
    None when one of them never did."""
    times = [pick((t for s, t in states.get(k, ()) if s == state
                   and (before is None or t <= before)), default=None) for k in keys]
    return None if not times or None in times else pick(times)


def _transfer(e: dict[str, Any], addr: str, w: dict[str, Any], ctx: dict[str, Any],
              states: dict[Any, list[tuple[str, float]]]) -> dict[str, Any]:
    """One incoming transfer of worker ``addr``, with its waits, its sender's side and
    what computed and stalled meanwhile."""
    names, stream, stalls = ctx["names"], ctx["stream"], ctx["stalls"]
    keys = {_hashable(k): n or 0 for k, n in e["keys"].items()}
    start, stop, who = e["start"], e["stop"], e["who"]
    asked = start - w["delay"]  # this worker's clock
    done = asked + (stop - start)
    big = max(keys, key=keys.get) if keys else None
    cause = stream["cause"].get((addr, who, start, stop))
    t: dict[str, Any] = {
        "to": names.get(addr, addr), "from": names.get(who, who),
        "key": label(big) if big is not None else "?",
        "dependent": label(cause) if cause is not None else "?", "keys": len(keys),
        "bytes": e["total"], "at_s": _r(start - ctx["t0"], 4), "duration_s": _r(e["duration"]),
        "gbps": _r(e["bandwidth"] / 1e9, 4)}
    fetched = _first(states, keys, "fetch", min, asked)
    flown = _first(states, keys, "flight", max, asked)
    if fetched is not None:
        t["wait_s"] = _r(asked - fetched)
    if flown is not None:
        t["launch_s"] = _r(asked - flown)
    out = ctx["outgoing"].get((who, addr, frozenset(keys)))
    if out is not None:  # on the workers' own clocks (one host: the same clock)
        t["request_s"] = _r(out["middle"] - (out["stop"] - out["start"]) / 2 - asked)
        t["send_s"] = _r(out["duration"])
    for end, worker in (("recv", addr), ("send", who)):
        t[f"{end}_stall_s"] = _r(covered(stalls.get(worker, []), start, stop))
        t[f"{end}_busy_s"] = _r(covered(stream["computing"].get(worker, []), start, stop))
    t["concurrent"] = sum(1 for o in w["incoming"]
                          if o is not e and o["start"] < stop and o["stop"] > start)
    if cause is not None:  # its dependent's start (this worker's clock; else the stream's)
        ran = _first(states, [cause], "executing", min)
        after = ran - done if ran is not None and ran >= asked else None
        if after is None and (addr, cause) in stream["started"]:
            after = stream["started"][addr, cause] - stop
        if after is not None:
            t["dependent_after_s"] = _r(after)
    return t


def summarise(workers: dict[str, dict[str, Any]], scheduler: dict[str, Any],
              stream: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ``transfers`` record field and the list of every transfer (see the module's
    docstring); ``workers`` by address from :func:`_worker_collect`."""
    names = {addr: f"w{w['name']}" if w["name"].isdigit() else w["name"]
             for addr, w in workers.items()}
    ctx = {"names": names, "stream": _read_stream(stream),
           "t0": min([w["loop"]["t0"] for w in workers.values()] + [scheduler["loop"]["t0"]]),
           "stalls": {a: merge([tuple(s) for s in w["loop"]["stalls"]])
                      for a, w in workers.items()},
           "outgoing": {(a, e["who"], frozenset(map(_hashable, e["keys"]))): e
                        for a, w in workers.items() for e in w["outgoing"]}}
    detail = []
    for addr, w in workers.items():
        states: dict[Any, list[tuple[str, float]]] = {}
        for key, state, t in w["states"]:
            states.setdefault(_hashable(key), []).append((state, t))
        detail += [_transfer(e, addr, w, ctx, states)
                   for e in sorted(w["incoming"], key=lambda e: e["start"])]
    groups: dict[str, list[dict[str, Any]]] = {}
    for t in detail:
        groups.setdefault(f"{t['key']} > {t['dependent']}", []).append(t)
    by_name = sorted(workers.items(), key=lambda aw: names[aw[0]])
    loops = {names[a]: _loop(w["loop"], ctx["t0"], ctx["stream"]["running"].get(a, []))
             for a, w in by_name}
    loops["scheduler"] = _loop(scheduler["loop"], ctx["t0"], [])
    return {
        "what": "the last timed call's incoming transfers on every worker, grouped by the "
                "transferred key's step > the dependent's step (benchmarks/tools/transfers.py)",
        "n": len(detail), "bytes": sum(t["bytes"] for t in detail),
        "duration_s": _r(sum(t["duration_s"] for t in detail), 4),
        "by_prefix": {name: _group(ts) for name, ts in
                      sorted(groups.items(), key=lambda kv: -sum(t["duration_s"] for t in kv[1]))},
        "event_loop": loops, "slowest": sorted(detail, key=lambda t: -t["duration_s"])[:12],
        "workers": {names[a]: {"address": a, "threads": w["threads"],
                               "busy_replies": w["busy_replies"], "limits": w["limits"],
                               "config": w["config"], "logs_full": w["logs_full"],
                               "log_maxlen": w.get("log_maxlen")}
                    for a, w in by_name},
    }, detail


def _group(ts: list[dict[str, Any]]) -> dict[str, Any]:
    dur, bw = [t["duration_s"] for t in ts], [t["gbps"] for t in ts]
    total = sum(dur) or 1e-12

    def med(field: str) -> float | None:
        return _r(_med([t[field] for t in ts if field in t]))

    def top(field: str) -> float | None:
        return _r(max((t[field] for t in ts if field in t), default=None))

    def share(field: str) -> float | None:
        return _r(sum(t.get(field, 0.0) for t in ts) / total, 3)

    return {
        "n": len(ts), "bytes": sum(t["bytes"] for t in ts), "total_s": _r(sum(dur), 4),
        "median_s": _r(_med(dur)), "max_s": _r(max(dur)), "median_gbps": _r(_med(bw), 4),
        "min_gbps": _r(min(bw), 4), "max_gbps": _r(max(bw), 4),
        "median_wait_s": med("wait_s"), "max_wait_s": top("wait_s"),
        "median_launch_s": med("launch_s"), "median_request_s": med("request_s"),
        "median_send_s": med("send_s"),
        **{f"{x}_share": share(f"{x}_s") for x in ("recv_stall", "send_stall", "recv_busy",
                                                    "send_busy")},
        "mean_concurrent": _r(statistics.mean(t["concurrent"] for t in ts), 2),
        "median_dependent_after_s": med("dependent_after_s"),
        "max_dependent_after_s": top("dependent_after_s"),
        "routes": dict(Counter(f"{t['from']}->{t['to']}" for t in ts).most_common()),
    }


def _loop(loop: dict[str, Any], t0: float,
          running: list[tuple[float, float, str]]) -> dict[str, Any]:
    stalls = sorted(loop["stalls"], key=lambda s: s[0] - s[1])
    return {"ticks": loop["ticks"], "interval_s": loop["interval_s"],
            "mean_s": _r(loop["total_s"] / loop["ticks"]) if loop["ticks"] else None,
            "max_s": _r(loop["max_s"]), "stalls": len(stalls),
            "stalled_s": _r(sum(b - a for a, b in stalls), 4),
            "longest": [{"at_s": _r(a - t0, 4), "s": _r(b - a, 4), "computing": sorted(
                {lab for x, y, lab in running if x < b and y > a})} for a, b in stalls[:5]],
            **({"stall_stacks": loop["stall_stacks"]} if "stall_stacks" in loop else {})}


# -- printing and files ------------------------------------------------------------------
def print_transfers(key: str, tr: dict[str, Any]) -> None:
    """The table of one run's ``transfers`` field and its event-loop lines."""
    from harness import cell, print_table

    if "failed" in tr:
        print(f"\n{key}: transfers not read: {tr['failed']}")
        return
    loops = "; ".join(
        f"{name} {lp['ticks']} ticks, mean {cell(lp['mean_s'] and lp['mean_s'] * 1e3, '.1f')} "
        f"max {lp['max_s'] * 1e3:.0f} ms, {lp['stalls']} stalls > {STALL_S * 1e3:.0f} ms "
        f"({lp['stalled_s']:.2f} s)" for name, lp in tr["event_loop"].items())
    for name, lp in tr["event_loop"].items():
        stacks = lp.get("stall_stacks")
        if stacks and stacks["dumps"]:
            print(f"\n{key}: {name}'s loop stalled past {1.6 * STALL_S * 1e3:.0f} ms "
                  f"{stacks['dumps']} times; its thread was in:")
            print("\n".join(f"  {n:4d}  {where}" for where, n in stacks["loop"][:6]))
            print("  the other threads were in:")
            print("\n".join(f"  {n:4d}  {where}" for where, n in stacks["others"][:8]))
    head = (f"{key}: {tr['n']} transfers, {tr['bytes'] / 1e9:.3f} GB, "
            f"{tr['duration_s']:.3f} s summed")
    if not tr["n"]:
        print(f"\n{head}; event loops ({TICK_S * 1e3:.0f} ms watch): {loops}")
        return

    def ms(x: float | None) -> str:
        return cell(None if x is None else x * 1e3, ".1f")

    rows = [[name, g["n"], f"{g['bytes'] / 1e9:.3f}", ms(g["median_s"]), ms(g["max_s"]),
             f"{g['median_gbps']:.2f}", f"{g['min_gbps']:.3f}", ms(g["median_wait_s"]),
             ms(g["median_request_s"]), ms(g["median_send_s"]),
             ms(g["median_dependent_after_s"]),
             f"{g['recv_stall_share']:.0%}/{g['send_stall_share']:.0%}",
             f"{g['recv_busy_share']:.0%}/{g['send_busy_share']:.0%}"]
            for name, g in tr["by_prefix"].items()]
    print(f"\n{head}")
    print_table(["key > dependent", "n", "GB", "med ms", "max ms", "med GB/s", "min GB/s",
                 "wait ms", "req ms", "send ms", "dep ms", "stall r/s", "busy r/s"], rows,
                ["medians of wait: the keys' fetch state to the transfer's start (receiver); "
                 "req: the receiver's start to the sender's get_data start; send: the "
                 "sender's duration; dep: the transfer's end to its dependent's start. "
                 "stall r/s: share of the transfers' time the receiver's / sender's event "
                 f"loop was stalled > {STALL_S * 1e3:.0f} ms; busy r/s: share with a task "
                 "computing on the receiver / sender",
                 f"event loops ({TICK_S * 1e3:.0f} ms watch): {loops}"])


def write_detail(directory: Path | None, key: str, detail: list[dict[str, Any]],
                 stream: list[dict[str, Any]] | None = None) -> None:
    """Every transfer of a run to ``directory/transfers_<run>.json``, and every task
    (its key, worker and the start and stop of each of its actions, seconds from
    the first) to ``directory/tasks_<run>.json`` (with ``--transfer-detail``): the
    timeline ``tools/timeline.py`` reads a site's critical path from."""
    if directory is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"transfers_{key}.json"
    path.write_text(json.dumps(detail, indent=0, default=str))
    print(f"{key}: {len(detail)} transfers written to {path}")
    if stream:
        t0 = min(s["start"] for t in stream for s in t.get("startstops", ()))
        rows = [{"key": str(t["key"]), "worker": t.get("worker"),
                 "actions": [[s["action"], round(s["start"] - t0, 6), round(s["stop"] - t0, 6)]
                             for s in t.get("startstops", ())]}
                for t in stream]
        (directory / f"tasks_{key}.json").write_text(json.dumps(rows, indent=0))
