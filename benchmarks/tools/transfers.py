# ruff: noqa: T201
"""What the transfers between Dask workers did during a timed call, and whether the
workers' and the scheduler's event loops kept up: the instruments of
``bench_stack.py``'s ``transfers`` record field.

Before each call :meth:`TransferWatch.reset` (``best_of``'s ``setup``, untimed)
installs on every worker, once, and then clears:

- larger transfer logs: distributed keeps ``Worker.transfer_incoming_log`` and
  ``transfer_outgoing_log`` (one dict per ``gather_dep`` / ``get_data``: ``start``,
  ``stop``, ``duration``, ``who``, ``keys`` {key: nbytes}, ``total``,
  ``bandwidth``), and the worker state machine's transition log, in deques of
  ``distributed.admin.low-level-log-length`` (1000) entries; these become deques of
  :data:`MAXLEN`, emptied before each call so that warm-up transfers do not count;
- a wrapper of ``Worker._update_metrics_received_data`` that adds to each incoming
  entry the tasks on that worker waiting for its keys (Dask's own ``cause``, which
  the task stream charges the transfer to, is any dependent, done or not), its
  start on the worker's own clock, the received values' types and which serializer
  family each leaf has ("cuda": a device-frame serializer, which UCX sends GPU to
  GPU; "dask": numpy's zero-copy host frames, or CuPy through host memory;
  "pickle": whole objects pickled, CuPy arrays copied to the host on the way);
- a wrapper of the worker's connection pool's ``connect`` (how long getting a comm
  to the peer took, and whether one was already open);
- an event-loop watch (a tornado ``PeriodicCallback`` every :data:`TICK_S`; a tick
  later than :data:`STALL_S` is a stall, kept with its time), on the workers and on
  the scheduler; distributed's own tick digest (``digests_max`` /
  ``digests_total["tick-duration"]``, every ``distributed.admin.tick.interval``)
  is read too. ``Worker.digests`` (t-digests) need crick, which is not installed,
  so percentiles come from the watch.

After the timed calls :meth:`TransferWatch.collect` reads all of it back (the last
call's, with ``repeats`` > 1) and :func:`summarise` matches each incoming transfer
with the sender's outgoing entry (same keys), the receiver's transition log (when
its keys went to ``fetch`` and ``flight``), the pool's connects, the loops'
stalls and the task stream (what computed on either worker meanwhile, and when the
first waiting task started). Spans within a worker and between the two ends of a
transfer (``wait``, ``launch``, ``connect``, ``request``, ``dependent_after``) are
on the workers' own clocks (one host here: the same clock); against the task
stream and the other loops, on the scheduler's (the logs' times carry the workers'
``scheduler_delay``, an estimate that moves by milliseconds).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, deque
from pathlib import Path
from typing import Any

#: Entries each instrumented log keeps (distributed's default is 1000).
MAXLEN = 200_000
#: The event-loop watch's period, and the lateness that counts as a stall.
TICK_S, STALL_S = 0.01, 0.05
#: Stalls each loop keeps (the longest are reported, with what computed meanwhile).
MAX_STALLS = 100_000


# -- on the workers and the scheduler (by client.run / run_on_scheduler) --------------
class _LoopWatch:
    """A tornado callback every ``interval`` s on the current event loop; records the
    gaps between its ticks, and every gap over :data:`STALL_S` with its time."""

    def __init__(self, server: Any, interval: float = TICK_S) -> None:
        from tornado.ioloop import PeriodicCallback

        self.server = server
        self.interval = interval
        self.pc = PeriodicCallback(self.tick, interval * 1000)
        self.reset()

    def reset(self) -> None:
        from distributed.metrics import time

        self.last = self.t0 = time()
        self.n, self.total, self.max = 0, 0.0, 0.0
        self.stalls: list[tuple[float, float]] = []
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
            delay = getattr(self.server, "scheduler_delay", 0.0) or 0.0
            self.stalls.append((now - gap + delay, now + delay))

    def read(self) -> dict[str, Any]:
        self.pc.stop()
        return {"interval_s": self.interval, "ticks": self.n, "total_s": self.total,
                "max_s": self.max, "stalls": list(self.stalls),
                "t0": self.t0 + (getattr(self.server, "scheduler_delay", 0.0) or 0.0)}


def _serial_family(t: type) -> str:
    from distributed.protocol.cuda import cuda_serialize
    from distributed.protocol.serialize import dask_serialize

    for name, dispatch in (("cuda", cuda_serialize), ("dask", dask_serialize)):
        try:
            dispatch.dispatch(t)
        except TypeError:
            continue
        return name
    return "pickle"


def _serial_bytes(x: Any, out: dict[str, int], iterate: bool | None = True) -> None:
    """Add ``x``'s bytes to ``out`` by the serializer family distributed would pick for
    each leaf (``get_data`` serializes each value with ``iterate_collection=True``;
    nested collections are iterated only when their first element has a dask
    serializer, else pickled whole)."""
    from dask.sizeof import sizeof
    from distributed.protocol.serialize import check_dask_serializable

    t = type(x)
    if t in (list, tuple, set, dict):
        if iterate is None:
            iterate = check_dask_serializable(x)
        if iterate:
            for v in (x.values() if t is dict else x):
                _serial_bytes(v, out, None)
            return
        out["pickle"] = out.get("pickle", 0) + int(sizeof(x))
        return
    family = _serial_family(t)
    out[family] = out.get(family, 0) + int(sizeof(x))


def _signature(x: Any, depth: int = 0) -> str:
    """``cupy.ndarray``, ``tuple[cupy.ndarray,numpy.ndarray]``, ..."""
    t = type(x)
    if t in (list, tuple, set, dict) and depth < 2:
        items = list(x.values() if t is dict else x)[:8]
        return f"{t.__name__}[{','.join(sorted({_signature(i, depth + 1) for i in items}))}]"
    return f"{t.__module__.split('.')[0]}.{t.__name__}"


def _instrument(dask_worker: Any) -> dict[str, Any]:
    st: dict[str, Any] = {"connects": []}
    dask_worker.transfer_incoming_log = deque(maxlen=MAXLEN)
    dask_worker.transfer_outgoing_log = deque(maxlen=MAXLEN)
    dask_worker.state.log = deque(maxlen=MAXLEN)

    pool, connects = dask_worker.rpc, st["connects"]
    connect = pool.connect

    async def timed_connect(addr, timeout=None):
        from distributed.metrics import time

        reused = any(not c.closed() for c in pool.available.get(addr, ()))
        t0 = time()
        comm = await connect(addr, timeout=timeout)
        connects.append((t0, time(), addr, reused))  # this worker's clock
        return comm

    pool.connect = timed_connect
    received = dask_worker._update_metrics_received_data

    def noted_received(*args, **kwargs):
        received(*args, **kwargs)
        try:  # the entry just appended: add its cause and the values' types
            entry = dask_worker.transfer_incoming_log[-1]
            data, cause = kwargs.get("data", {}), kwargs.get("cause")
            serial: dict[str, int] = {}
            for v in data.values():
                _serial_bytes(v, serial)
            entry["serial"] = serial
            entry["types"] = sorted({_signature(v) for v in data.values()})
            entry["cause"] = getattr(cause, "key", None)
            entry["raw_start"] = kwargs.get("start")  # this worker's clock
            # the tasks here that wait for these keys (Dask's cause is any dependent)
            tasks = dask_worker.state.tasks
            entry["waiting"] = list({d.key: None for k in data if k in tasks
                                     for d in tasks[k].dependents if d.state == "waiting"})[:8]
        except Exception as err:  # never break the worker for a measurement
            st["note_error"] = repr(err)

    dask_worker._update_metrics_received_data = noted_received
    st["loop"] = _LoopWatch(dask_worker)
    return st


def _worker_reset(dask_worker) -> None:
    """Install the instruments (first call), then clear them."""
    st = getattr(dask_worker, "_bench_transfers", None)
    if st is None:
        st = dask_worker._bench_transfers = _instrument(dask_worker)
    dask_worker.transfer_incoming_log.clear()
    dask_worker.transfer_outgoing_log.clear()
    dask_worker.state.log.clear()
    st["connects"].clear()
    st["loop"].reset()
    dask_worker.digests_max["tick-duration"] = 0
    st["ticks0"] = (dask_worker._tick_counter, dask_worker.digests_total["tick-duration"])


def _worker_collect(dask_worker) -> dict[str, Any]:
    """What the instruments saw since the last reset."""
    st = dask_worker._bench_transfers
    delay = dask_worker.scheduler_delay
    log = dask_worker.state.log
    states = [(e[0], e[3], e[-1]) for e in log  # this worker's clock
              if len(e) == 7 and e[3] in ("fetch", "flight", "executing")
              and isinstance(e[4], dict)]
    ticks = dask_worker._tick_counter - st["ticks0"][0]
    tick_total = dask_worker.digests_total["tick-duration"] - st["ticks0"][1]
    ws = dask_worker.state
    return {
        "config": _comm_config(), "threads": ws.nthreads,
        "name": str(dask_worker.name), "delay": delay,
        "incoming": [dict(e) for e in dask_worker.transfer_incoming_log],
        "outgoing": [dict(e) for e in dask_worker.transfer_outgoing_log],
        "states": states, "busy_replies": sum(1 for e in log if e[0] == "gather-dep-busy"),
        "logs_full": [len(x) == MAXLEN for x in (log, dask_worker.transfer_incoming_log,
                                                 dask_worker.transfer_outgoing_log)],
        "connects": list(st["connects"]), "loop": st["loop"].read(),
        "note_error": st.get("note_error"),
        "distributed_tick": {"ticks": ticks, "max_s": dask_worker.digests_max["tick-duration"],
                             "mean_s": tick_total / ticks if ticks else None},
        "limits": {"incoming_count": ws.transfer_incoming_count_limit,
                   "incoming_bytes": ws.transfer_incoming_bytes_limit,
                   "message_bytes": ws.transfer_message_bytes_limit,
                   "outgoing_count": dask_worker.transfer_outgoing_count_limit},
    }


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


def _scheduler_reset(dask_scheduler) -> None:
    watch = getattr(dask_scheduler, "_bench_loop", None)
    if watch is None:
        watch = dask_scheduler._bench_loop = _LoopWatch(dask_scheduler)
    watch.reset()


def _scheduler_collect(dask_scheduler) -> dict[str, Any]:
    return {"loop": dask_scheduler._bench_loop.read()}


# -- in the client ---------------------------------------------------------------------
class TransferWatch:
    """The instruments of this module on ``client``'s cluster: :meth:`reset` before
    each call, :meth:`collect` after the last."""

    def __init__(self, client) -> None:
        self.client = client
        self.failed: str | None = None

    def reset(self) -> None:
        try:
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


def label(key: Any) -> str:
    """A key's step, as the profile names them, and for tuple keys the first word
    after the name: ``pass1``, ``pass2.fetch``, ``pass2.sketch``, ``load``,
    ``load.copy``, ``src_read``, ..."""
    from dask.utils import key_split

    step = key_split(key).split("_site")[0]
    if isinstance(key, (tuple, list)):
        word = next((k for k in key[1:] if isinstance(k, str)), None)
        if word is not None:
            step = f"{step}.{word}"
    return step


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _overlap(intervals: list[tuple[float, float]], a: float, b: float) -> float:
    """Seconds of [a, b] covered by ``intervals`` (disjoint, sorted)."""
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in intervals if x < b and y > a)


def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def summarise(workers: dict[str, dict[str, Any]], scheduler: dict[str, Any],
              stream: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ``transfers`` record field and the list of every transfer (see the module's
    docstring); ``workers`` by address from :func:`_worker_collect`."""
    names = {addr: f"w{w['name']}" if w["name"].isdigit() else w["name"]
             for addr, w in workers.items()}
    t0 = min([w["loop"]["t0"] for w in workers.values()] + [scheduler["loop"]["t0"]])
    # the task stream: compute intervals per worker, each task's compute start
    computing: dict[str, list[tuple[float, float]]] = {}
    running: dict[str, list[tuple[float, float, str]]] = {}
    started: dict[tuple[str, Any], float] = {}
    for task in stream:
        w, key = task.get("worker"), _hashable(task["key"])
        for ss in task.get("startstops", ()):
            if ss["action"] == "compute":
                computing.setdefault(w, []).append((ss["start"], ss["stop"]))
                running.setdefault(w, []).append((ss["start"], ss["stop"], label(key)))
                started[w, key] = min(started.get((w, key), ss["start"]), ss["start"])
    computing = {w: _union(v) for w, v in computing.items()}
    stalls = {addr: _union([tuple(s) for s in w["loop"]["stalls"]])
              for addr, w in workers.items()}
    # the senders' entries, by (sender, receiver, keys)
    outgoing = {}
    for addr, w in workers.items():
        for e in w["outgoing"]:
            outgoing[addr, e["who"], frozenset(map(_hashable, e["keys"]))] = e
    detail: list[dict[str, Any]] = []
    for addr, w in workers.items():
        states: dict[Any, list[tuple[str, float]]] = {}
        for key, state, t in w["states"]:
            states.setdefault(_hashable(key), []).append((state, t))
        incoming = sorted(w["incoming"], key=lambda e: e["start"])
        for e in incoming:
            keys = {_hashable(k): n or 0 for k, n in e["keys"].items()}
            start, stop, who = e["start"], e["stop"], e["who"]
            # this worker's clock (the log's times are shifted by its estimate of the
            # scheduler's, which moves by milliseconds between heartbeats)
            asked = e.get("raw_start") or start - w["delay"]
            done = asked + (stop - start)
            big = max(keys, key=keys.get) if keys else None
            waiting = [_hashable(k) for k in e.get("waiting", ())]
            cause = waiting[0] if waiting else _hashable(e.get("cause"))
            t = {"to": names.get(addr, addr), "from": names.get(who, who),
                 "key": label(big) if big is not None else "?",
                 "dependent": label(cause) if cause is not None else "?",
                 "keys": len(keys), "bytes": e["total"], "at_s": _r(start - t0),
                 "duration_s": _r(e["duration"], 6), "gbps": _r(e["bandwidth"] / 1e9)}
            fetched = [min((tt for s, tt in states.get(k, ()) if s == "fetch" and tt <= asked),
                           default=None) for k in keys]
            flown = [max((tt for s, tt in states.get(k, ()) if s == "flight" and tt <= asked),
                         default=None) for k in keys]
            if fetched and None not in fetched:
                t["wait_s"] = _r(asked - min(fetched), 6)
            if flown and None not in flown:
                t["launch_s"] = _r(asked - max(flown), 6)
            conns = [c for c in w["connects"] if c[2] == who and asked <= c[0] <= done]
            if conns:
                t["connect_s"] = _r(conns[0][1] - conns[0][0], 6)
                t["new_comm"] = not conns[0][3]
            out = outgoing.get((who, addr, frozenset(keys)))
            if out is not None:
                # on the workers' own clocks (one host: the same clock), not shifted by
                # their estimates of the scheduler's, which move by milliseconds
                sent = out["middle"] - (out["stop"] - out["start"]) / 2
                t["request_s"] = _r(sent - asked, 6)
                t["send_s"] = _r(out["duration"], 6)
            t["recv_stall_s"] = _r(_overlap(stalls.get(addr, []), start, stop), 6)
            t["send_stall_s"] = _r(_overlap(stalls.get(who, []), start, stop), 6)
            t["recv_busy_s"] = _r(_overlap(computing.get(addr, []), start, stop), 6)
            t["send_busy_s"] = _r(_overlap(computing.get(who, []), start, stop), 6)
            t["concurrent"] = sum(1 for o in incoming
                                  if o is not e and o["start"] < stop and o["stop"] > start)
            # the first of the tasks waiting for it to start executing (this worker's
            # clock; else the task stream's compute start, on the scheduler's)
            after = [min((tt for s, tt in states.get(k, ()) if s == "executing"), default=None)
                     for k in waiting or [cause]]
            after = [a - done for a in after if a is not None and a >= asked] or [
                started[addr, k] - stop for k in waiting or [cause] if (addr, k) in started]
            if after:
                t["dependent_after_s"] = _r(min(after), 6)
            t["serial"] = e.get("serial", {})
            t["types"] = e.get("types", [])
            detail.append(t)
    groups: dict[str, list[dict[str, Any]]] = {}
    for t in detail:
        groups.setdefault(f"{t['key']} > {t['dependent']}", []).append(t)
    summary = {name: _group(ts) for name, ts in
               sorted(groups.items(), key=lambda kv: -sum(t["duration_s"] for t in kv[1]))}
    loops = {names[a]: _loop(w["loop"], t0, running.get(a, []), w["distributed_tick"])
             for a, w in sorted(workers.items(), key=lambda aw: names[aw[0]])}
    loops["scheduler"] = _loop(scheduler["loop"], t0, [], None)
    return {
        "what": "the last timed call's incoming transfers on every worker, grouped by the "
                "transferred key's step > the dependent's step (benchmarks/tools/transfers.py)",
        "n": len(detail), "bytes": sum(t["bytes"] for t in detail),
        "duration_s": _r(sum(t["duration_s"] for t in detail)),
        "by_prefix": summary, "event_loop": loops,
        "slowest": sorted(detail, key=lambda t: -t["duration_s"])[:12],
        "workers": {names[a]: {
            "address": a, "threads": w["threads"], "busy_replies": w["busy_replies"],
            "limits": w["limits"], "config": w["config"],
            "connects": len([c for c in w["connects"] if c[2] in workers]),
            "new_comms": len([c for c in w["connects"] if c[2] in workers and not c[3]]),
            "logs_full": w["logs_full"], "note_error": w["note_error"]}
            for a, w in sorted(workers.items(), key=lambda aw: names[aw[0]])},
    }, detail


def _group(ts: list[dict[str, Any]]) -> dict[str, Any]:
    dur = [t["duration_s"] for t in ts]
    bw = [t["gbps"] for t in ts]
    total = sum(dur) or 1e-12

    def med(field: str) -> float | None:
        return _r(_med([t[field] for t in ts if field in t]), 6)

    def share(field: str) -> float:
        return _r(sum(t.get(field, 0.0) for t in ts) / total, 3)

    serial: dict[str, int] = {}
    for t in ts:
        for k, v in t["serial"].items():
            serial[k] = serial.get(k, 0) + v
    waits = [t["wait_s"] for t in ts if "wait_s" in t]
    after = [t["dependent_after_s"] for t in ts if "dependent_after_s" in t]
    return {
        "n": len(ts), "bytes": sum(t["bytes"] for t in ts), "total_s": _r(sum(dur)),
        "median_s": _r(_med(dur), 6), "max_s": _r(max(dur), 6),
        "median_gbps": _r(_med(bw)), "min_gbps": _r(min(bw)), "max_gbps": _r(max(bw)),
        "median_wait_s": med("wait_s"), "max_wait_s": _r(max(waits), 6) if waits else None,
        "median_launch_s": med("launch_s"), "median_request_s": med("request_s"),
        "median_send_s": med("send_s"),
        "connect_s": _r(sum(t.get("connect_s", 0.0) for t in ts), 6),
        "new_comms": sum(1 for t in ts if t.get("new_comm")),
        "recv_stall_share": share("recv_stall_s"), "send_stall_share": share("send_stall_s"),
        "recv_busy_share": share("recv_busy_s"), "send_busy_share": share("send_busy_s"),
        "mean_concurrent": _r(statistics.mean(t["concurrent"] for t in ts), 2),
        "median_dependent_after_s": _r(_med(after), 6),
        "max_dependent_after_s": _r(max(after), 6) if after else None,
        "serial_bytes": serial,
        "types": dict(Counter(x for t in ts for x in t["types"]).most_common()),
        "routes": dict(Counter(f"{t['from']}->{t['to']}" for t in ts).most_common()),
    }


def _loop(loop: dict[str, Any], t0: float, running: list[tuple[float, float, str]],
          tick: dict[str, Any] | None) -> dict[str, Any]:
    stalls = sorted(loop["stalls"], key=lambda s: s[0] - s[1])
    out = {"ticks": loop["ticks"], "interval_s": loop["interval_s"],
           "mean_s": _r(loop["total_s"] / loop["ticks"], 6) if loop["ticks"] else None,
           "max_s": _r(loop["max_s"], 6), "stalls": len(stalls),
           "stalled_s": _r(sum(b - a for a, b in stalls)),
           "longest": [{"at_s": _r(a - t0), "s": _r(b - a), "computing": sorted(
               {lab for x, y, lab in running if x < b and y > a})} for a, b in stalls[:5]]}
    if tick is not None:
        out["distributed_tick"] = {k: _r(v, 6) if isinstance(v, float) else v
                                   for k, v in tick.items()}
    return out


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
    head = (f"{key}: {tr['n']} transfers, {tr['bytes'] / 1e9:.3f} GB, "
            f"{tr['duration_s']:.3f} s summed")
    if not tr["n"]:
        print(f"\n{head}; event loops ({TICK_S * 1e3:.0f} ms watch): {loops}")
        return

    def ms(x: float | None) -> str:
        return cell(None if x is None else x * 1e3, ".1f")

    def pct(a: float, b: float) -> str:
        return f"{a:.0%}/{b:.0%}"

    rows = [[name, g["n"], f"{g['bytes'] / 1e9:.3f}", ms(g["median_s"]), ms(g["max_s"]),
             f"{g['median_gbps']:.2f}", f"{g['min_gbps']:.3f}", ms(g["median_wait_s"]),
             ms(g["median_request_s"]), ms(g["median_send_s"]),
             ms(g["median_dependent_after_s"]),
             pct(g["recv_stall_share"], g["send_stall_share"]),
             pct(g["recv_busy_share"], g["send_busy_share"]),
             ",".join(k for k, v in sorted(g["serial_bytes"].items(), key=lambda kv: -kv[1])
                      if v)]
            for name, g in tr["by_prefix"].items()]
    print(f"\n{head}")
    print_table(["key > dependent", "n", "GB", "med ms", "max ms", "med GB/s", "min GB/s",
                 "wait ms", "req ms", "send ms", "dep ms", "stall r/s", "busy r/s", "serial"],
                rows,
                ["medians of wait: the keys' fetch state to the transfer's start (receiver); "
                 "req: the receiver's start to the sender's get_data start; send: the "
                 "sender's duration; dep: the transfer's end to its dependent's start. "
                 "stall r/s: share of the transfers' time the receiver's / sender's event "
                 f"loop was stalled > {STALL_S * 1e3:.0f} ms; busy r/s: share with a task "
                 "computing on the receiver / sender; serial: the leaves' serializer "
                 "families by bytes",
                 f"event loops ({TICK_S * 1e3:.0f} ms watch): {loops}"],
                align="l" + "r" * 12 + "l")


def write_detail(directory: Path | None, key: str, detail: list[dict[str, Any]],
                 stream: list[dict[str, Any]] | None = None) -> None:
    """Every transfer of a run to ``directory/transfers_<run>.json``, and every task
    (its key, worker and the start and stop of each of its actions, seconds from
    the first) to ``directory/tasks_<run>.json`` (with ``--transfer-detail``): the
    timeline from which a site's critical path is read."""
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
