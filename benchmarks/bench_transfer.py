# ruff: noqa: T201
"""How fast a CuPy block moves between the two GPU workers of ``src_dask.cluster(gpus=2)``.

Moves a 1 GiB CuPy array from worker 0 to worker 1 for each ``--protocol`` and RMM
allocator (``async``: ``src_dask.cluster``'s default stream-ordered pool; ``pool``: a
classic RMM pool, which dask-cuda's UCX notes recommend because CUDA IPC maps each
allocation once per pair of processes), prints a table and writes the record
(benchmarks/results/transfer_gpu.json). This is the rate at which pass 2 on several
GPUs moves sums of ``S`` and blocks of ``C_j``. ``--best`` prints the protocol and
allocator of the fastest run of a record (gpu_run.sh's 2-GPU part uses it).

    python benchmarks/bench_transfer.py --protocol tcp ucx --rmm async pool
    python benchmarks/bench_transfer.py --best benchmarks/results/transfer_gpu.json
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from harness import Record, cell, output_path, parser, print_table


def _make(nbytes: int):
    import cupy

    x = cupy.ones(nbytes // 16, dtype="complex128")
    cupy.cuda.Device().synchronize()
    return x


def _touch(x) -> float:
    import cupy

    value = float(x[-1].real.get())
    cupy.cuda.Device().synchronize()
    return value


def _peer_access() -> dict:
    import cupy

    n = cupy.cuda.runtime.getDeviceCount()
    return {f"{a}->{b}": bool(cupy.cuda.runtime.deviceCanAccessPeer(a, b))
            for a in range(n) for b in range(n) if a != b}


def measure(protocol: str, rmm: str, nbytes: int, repeats: int) -> dict:
    from clusters import rmm_options
    from distributed import Client, wait

    import src_dask

    with src_dask.cluster(gpus=2, protocol=protocol, **rmm_options(rmm)) as cluster, \
            Client(cluster) as client:
        w0, w1 = sorted(client.scheduler_info()["workers"])
        times = []
        for r in range(repeats):
            x = client.submit(_make, nbytes + r * 16, workers=[w0], pure=False)
            wait(x)
            t0 = time.perf_counter()
            client.submit(_touch, x, workers=[w1], allow_other_workers=False).result()
            times.append(time.perf_counter() - t0)
            del x
        return {"protocol": protocol, "rmm": rmm, "bytes": nbytes, "seconds": times,
                "best_GBps": nbytes / min(times) / 1e9}


def best(path: Path) -> str:
    """``"PROTOCOL RMM"`` of the fastest run recorded in ``path`` (``tcp async`` if none)."""
    try:
        runs = [r for r in json.loads(path.read_text())["runs"] if "best_GBps" in r]
    except (OSError, ValueError, KeyError):
        runs = []
    top = max(runs, key=lambda r: r["best_GBps"], default={})
    return f"{top.get('protocol', 'tcp')} {top.get('rmm', 'async')}"


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__, repeats=3, out="transfer_gpu.json")
    p.add_argument("--best", type=Path, metavar="JSON",
                   help="only print the protocol and allocator of the fastest run in JSON")
    p.add_argument("--protocol", nargs="+", default=["tcp", "ucx"])
    p.add_argument("--rmm", nargs="+", choices=("async", "pool"), default=["async"])
    p.add_argument("--gib", type=float, default=1.0)
    args = p.parse_args(argv)
    if args.best:
        print(best(args.best))
        return
    from device import Device

    record = Record("CuPy block from one GPU worker to another", Device("gpu", cluster=True),
                    peer_access=_peer_access(), runs=[])
    print(record.header())
    for protocol in args.protocol:
        for rmm in args.rmm:
            try:
                record["runs"].append(measure(protocol, rmm, int(args.gib * 2**30),
                                              args.repeats))
            except Exception as e:  # noqa: BLE001 - one failing still reports the others
                record["runs"].append({"protocol": protocol, "rmm": rmm, "error": repr(e)})
    print_table(["protocol", "rmm", "best GB/s", "seconds", "error"],
                [[r["protocol"], r["rmm"], cell(r.get("best_GBps"), ".2f"),
                  " ".join(f"{t:.3f}" for t in r.get("seconds", [])), r.get("error", "")]
                 for r in record["runs"]],
                [f"{args.gib} GiB from worker 0 to worker 1; peer access: "
                 f"{record['peer_access']}"], align="llrll")
    record.write(output_path(args.out, "transfer_gpu.json"))


if __name__ == "__main__":
    main()
