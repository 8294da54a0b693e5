# ruff: noqa: T201
"""MPO·MPS on the GPU against the CPU, in one run: times and agreement of the results.

An MPO (bond 4, phys 2) times an MPS (bond chi at every cut, as in the reference
problem of docs/design.md §5), complex128, chi_out = chi, drawn without quimb
(``problems.mpo_mps_trains``). Times ``src_dask.apply`` with ``src_dask.device =
"gpu"`` (one warm-up, then the best of ``--repeats``) and ``"cpu"`` (once), and the
largest relative difference between the two results, core by core (the sketch
depends only on the seed). Writes benchmarks/results/gpu_reference_chi<chi>.json.

    python benchmarks/gpu_reference.py [--chi 1000] [--sites 50] [--out result.json]
"""

from __future__ import annotations

from typing import Any

from accuracy import core_difference
from device import Device
from harness import Config, Record, execute_benchmark, parser, print_table
from problems import mpo_mps_trains
from timing import best_of, runs_text


def parse_args(argv: list[str] | None = None):
    p = parser(__doc__, repeats=2, seed=0, out="gpu_reference_chi<chi>.json")
    p.add_argument("--chi", type=int, default=1000, help="MPS bond and chi_out (default 1000)")
    p.add_argument("--sites", type=int, default=50, help="sites (default 50)")
    return p.parse_args(argv)


def run(args, record: Record, device: Device) -> None:
    """src_dask on the GPU (warm-up, best of ``--repeats``) and once on the CPU."""
    import dask

    import src_dask

    a, x = mpo_mps_trains(args.sites, args.chi, args.seed)
    results = {}
    for where, repeats, warmup in (("gpu", args.repeats, True), ("cpu", 1, False)):
        with dask.config.set({"src_dask.device": where}):
            record[where], results[where] = best_of(
                lambda: src_dask.apply(a, x, args.chi, seed=args.seed), repeats, warmup=warmup)
    record["core_diff_gpu_vs_cpu"] = core_difference(results["cpu"], results["gpu"])


def report(record: Record) -> None:
    print_table(["device", "best s", "runs s"],
                [[d, f"{record[d]['best_s']:.3f}", runs_text(record[d]["times_s"])]
                 for d in ("gpu", "cpu")],
                [f"largest relative core difference, GPU against CPU: "
                 f"{record['core_diff_gpu_vs_cpu']:.2e}"], align="lrl")


CONFIG = Config(
    measures="MPO·MPS by src_dask on the GPU against the CPU",
    name=lambda args, device: f"gpu_reference_chi{args.chi}.json",
    device=lambda args: Device("gpu"), run=run, report=report,
    fields=lambda args: {"problem": f"MPO(L={args.sites}, D=4, phys 2) x MPS(chi={args.chi}), "
                                    f"complex128, seed {args.seed} (problems.mpo_mps_trains)",
                         "chi_out": args.chi})


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return execute_benchmark(CONFIG, parse_args(argv))


if __name__ == "__main__":
    main()
