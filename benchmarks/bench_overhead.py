# ruff: noqa: T201
"""Per-call overhead of src_dask: a small MPO·MPS whose GEMMs take next to no time, so
what is measured is Python and scheduling (graph build, tasks, hops between tasks).

    A   = quimb.tensor.MPO_rand(L, bond_dim=4)          # L = 50 by default
    psi = quimb.tensor.MPS_rand_state(L, bond_dim=chi)  # chi = 8 by default
    src_dask.apply(A, psi, chi, seed=0)

on Dask's synchronous and threaded schedulers and with a ``Client`` of an in-process
one-worker ``LocalCluster`` (2 threads): a run this small is one task there
(``src_dask.one-task-flops``); ``client_graph_1x2`` is the same call as a graph of many
tasks, where every dependent task waits for a round trip through the scheduler, and
its breakdown (:func:`breakdown`) says where that time goes. Prints the best and all
of ``--repeats`` calls per scheduler (after one warm-up call) and writes the record
(benchmarks/results/overhead_<device>.json; the device is where src_dask runs NumPy
inputs: the GPU where there is one).

    python benchmarks/bench_overhead.py
    python benchmarks/bench_overhead.py --L 20 --repeats 3 --out /tmp/overhead.json
    python benchmarks/bench_overhead.py --quick   # L=12, 2 repeats
"""

from __future__ import annotations

from typing import Any

from device import Device
from harness import Config, Record, execute_benchmark, parser, print_table
from problems import mpo_mps, mpo_mps_spec
from timing import best_of, runs_text


def parse_args(argv: list[str] | None = None):
    p = parser(__doc__, quick="L=12, 2 repeats", repeats=(9, 2), seed=42,
               out="overhead_<device>.json")
    p.sized("--L", type=int, full=50, quick=12, help="sites")
    p.add_argument("--chi", type=int, default=8, help="MPS bond and chi_out (default 8)")
    return p.parse_args(argv)


def run(args, record: Record, device: Device) -> None:
    """The calls on each scheduler and the many-task call's breakdown, into ``record``."""
    import dask
    from distributed import Client, LocalCluster

    import src_dask

    A, psi = mpo_mps(args.L, args.chi, 4, args.seed)

    def call(client=None):
        return lambda: src_dask.apply(A, psi, args.chi, seed=0, client=client)

    results = record["results"] = {}
    for scheduler in ("sync", "threads"):
        with dask.config.set(scheduler=scheduler):
            results[scheduler] = best_of(call(), args.repeats)[0]
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        results["client_inprocess_1x2"] = best_of(call(client), args.repeats)[0]
        # the same call as a graph of many tasks (what a larger run is), taken apart
        with dask.config.set({"src_dask.one-task-flops": 0}):
            results["client_graph_1x2"] = best_of(call(client), args.repeats)[0]
            record["graph_breakdown"] = breakdown(A, psi, args.chi, client)


def report(record: Record) -> None:
    print_table(["scheduler", "best s", "all calls s"],
                [[name, f"{r['best_s']:.3f}", runs_text(r["times_s"])]
                 for name, r in record["results"].items()],
                [f"one warm-up call, then {record['repeats']}; MPO·MPS L="
                 f"{record['problem']['L']}, chi={record['problem']['chi']}"], align="lrl")
    print("a client call as a graph of many tasks, taken apart (s):",
          ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in record["graph_breakdown"].items()))


def breakdown(A: Any, psi: Any, chi: int, client: Any, threads: int = 2) -> dict[str, Any]:
    """Where a client call's time goes, from public calls and the task stream:
    ``plan`` (``src_dask.plan``: the workers asked, the plan and the graph laid out,
    what ``src`` does before it submits), ``call`` (the whole ``src``), ``to_first``
    (from the call to the first task's start: plan, graph, submission),
    ``tasks_span`` (first start to last end), ``compute`` (the tasks' own compute
    seconds, summed), ``idle`` (thread-seconds of the worker's ``threads`` without a
    task within the span: waits for the scheduler's round trips between dependent
    tasks), ``after_last`` (the last task's end to the call's return: the result
    gathered), ``compute_by_step`` (the compute seconds of each step, ``pass2 qr``…)
    and ``bytes_between_workers`` (by step: what the workers sent each other)."""
    import time

    from distributed import get_task_stream

    import src_dask

    t0 = time.perf_counter()
    src_dask.plan(A, psi, chi_out=chi, client=client)
    planning = time.perf_counter() - t0
    client.run(_clear_transfers)
    with get_task_stream(client=client) as stream:
        wall0, t0 = time.time(), time.perf_counter()
        src_dask.apply(A, psi, chi, seed=0, client=client)
        call, wall1 = time.perf_counter() - t0, time.time()
    spans = [(ss["start"], ss["stop"], t["key"]) for t in stream.data
             for ss in t.get("startstops", ()) if ss["action"] == "compute"]
    first, last = min(s for s, _, _ in spans), max(e for _, e, _ in spans)
    compute = sum(e - s for s, e, _ in spans)
    by_step: dict[str, float] = {}
    for s, e, key in spans:
        by_step[_step(key)] = by_step.get(_step(key), 0.0) + e - s
    crossed: dict[str, float] = {}
    for keys in client.run(_transfers).values():
        for key, nbytes in keys:
            crossed[_step(key)] = crossed.get(_step(key), 0.0) + nbytes
    return {"tasks": len(stream.data), "plan": planning, "call": call,
            "to_first": first - wall0, "tasks_span": last - first, "compute": compute,
            "idle": max(0.0, threads * (last - first) - compute), "after_last": wall1 - last,
            "compute_by_step": by_step, "bytes_between_workers": crossed}


def _step(key: Any) -> str:
    """A task's step without its site and token (``pass2_site7-…, "qr"`` → ``pass2 qr``)."""
    import re

    name = key if isinstance(key, str) else key[0]
    step = re.sub(r"_site\d+", "", name.split("-")[0])
    if step == "src_after":  # a signal that a step has run (its step's name follows)
        return step
    parts = [p for p in (key[1:] if isinstance(key, tuple) else ()) if isinstance(p, str)]
    return " ".join([step, *parts[:1]])


def _clear_transfers(dask_worker: Any) -> None:
    dask_worker.transfer_incoming_log.clear()


def _transfers(dask_worker: Any) -> list[tuple[Any, int]]:
    """The keys this worker received from others since :func:`_clear_transfers`, with
    their bytes."""
    return [(k, n) for log in dask_worker.transfer_incoming_log
            for k, n in log["keys"].items()]


CONFIG = Config(
    measures="per-call overhead of src_dask on a small MPO·MPS",
    name=lambda args, device: f"overhead_{device.name}.json",
    # NumPy inputs: src_dask runs them on the GPU where there is one
    device=lambda args: Device(), run=run, report=report,
    fields=lambda args: {"problem": {**mpo_mps_spec(args.L, args.chi, 4, args.seed),
                                     "chi": args.chi, "mpo_bond": 4, "dtype": "complex128"},
                         "repeats": args.repeats})


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return execute_benchmark(CONFIG, parse_args(argv))


if __name__ == "__main__":
    main()
