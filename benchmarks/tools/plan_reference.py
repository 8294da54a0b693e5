# ruff: noqa: T201
"""Memory plans of the reference stacks on described GPU machines.

``src_dask.plan`` asks the workers of a running cluster what they have; this script
gives the same plan for a described machine (GPUs, device memory, host memory, disk)
so that a run can be sized before the machine is lent — the four-H200 machine for
the seed's reference size D_M=4000/χ_out=2000 above all. For each stack and GPU
count it prints the plan and whether it fits: device peak within the device limit,
what spills within the host's memory, the inputs and a store within the disk.

    python benchmarks/tools/plan_reference.py                      # 1, 2, 4 x H200
    python benchmarks/tools/plan_reference.py --gpus 4 --dm 4000 --chi-out 2000 --json out.json

The inputs are the lazy trains of ``src_dask.problems.stack`` (nothing is drawn).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import sys

import dask

import src_dask
from src_dask.diagnostics import GPU_WORKER_RSS, described_plan

#: The GPU machines of docs/design.md §6 (H200: 139 GiB usable of 141 GB).
MACHINES = {1: (139 * 2**30, 128 * 2**30, 64 * 2**30),
            2: (139 * 2**30, 256 * 2**30, 128 * 2**30),
            4: (139 * 2**30, 512 * 2**30, 235 * 2**30)}
REFERENCE = [(1000, 500), (2000, 1000), (4000, 2000)]


def plan_for(gpus: int, dm: int, chi_out: int, device_memory: int,
             host_memory: int) -> src_dask.RunPlan:
    """The plan of the lazy D_M stack on ``gpus`` GPU workers of ``device_memory``
    each, with ``src_dask.cluster``'s defaults and the host's memory shared."""
    trains = src_dask.problems.stack(50, dm).values()
    return described_plan(*trains, chi_out=chi_out, gpus=gpus, device_memory=device_memory,
                          host_memory=host_memory)


def verdict(p: src_dask.RunPlan, device_memory: int, host_memory: int, disk: int) -> dict:
    """Whether the plan fits the machine, and by how much: the device's data (up to
    dask-cuda's limit) and tasks within the device less its headroom."""
    spill_to_disk = max(0, p.spilled * p.workers - host_memory + p.workers * GPU_WORKER_RSS)
    usable = (1 - dask.config.get("src_dask.device-headroom")) * device_memory
    return {"device_peak_fits": p.peak_device <= usable,
            "spilled_to_host_GB": p.spilled * p.workers / 1e9,
            "spills_to_disk_GB": spill_to_disk / 1e9,
            "inputs_fit_disk": p.input_bytes <= disk,
            "store_fits_disk_beside_inputs": p.input_bytes + p.store_bytes <= disk}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--dm", type=int, help="only this D_M (with --chi-out)")
    ap.add_argument("--chi-out", type=int)
    ap.add_argument("--json", help="write the plans and verdicts here")
    args = ap.parse_args(argv)
    sizes = [(args.dm, args.chi_out or args.dm // 2)] if args.dm else REFERENCE
    records = []
    for dm, chi in sizes:
        for gpus in args.gpus:
            device, host, disk = MACHINES.get(gpus, MACHINES[4])
            p = plan_for(gpus, dm, chi, device, host)
            fits = verdict(p, device, host, disk)
            print(f"\n== D_M={dm}, chi_out={chi}, {gpus} GPU{'s' * (gpus > 1)} "
                  f"(host {host / 2**30:.0f} GiB, disk {disk / 2**30:.0f} GiB)")
            print(p)
            print("  fits: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else
                                         f"{k} {v}" for k, v in fits.items()))
            gemm = 53.6e12  # complex128 GEMM of one H200 (docs/design.md §6.1)
            print(f"  FLOP floor at {gemm / 1e12:.0f} TFLOP/s per GPU: "
                  f"{p.total_flops / (gemm * gpus):.0f} s")
            records.append({"dm": dm, "chi_out": chi, "gpus": gpus,
                            "plan": dataclasses.asdict(p), "fits": fits})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(["python benchmarks/tools/plan_reference.py",
                                            *(argv or sys.argv[1:])]),
                       "date": datetime.date.today().isoformat(),
                       "note": "a plan for described machines, computed on a CPU: no run",
                       "machines_GiB": {g: [x / 2**30 for x in m] for g, m in MACHINES.items()},
                       "records": records}, f, indent=1)
    return 0 if all(math.isfinite(r["plan"]["peak_host"]) for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
