# ruff: noqa: T201
"""The src-method stack N·V·M·U read from Zarr: src_dask on 1 and 2 workers, with and
without a run store, against quimb's src on the whole stack and against the peer
project src-method on 1 or 2 GPUs.

The problem (docs/design.md §5, ``src_dask.problems.stack``): four random MPOs of 50
sites, physical legs 4 x 4, bonds 4, 4, D_M, 4, complex128, compressed by
``src_dask.src(N, V, M, U, chi_out=chi_out)``. The script writes the inputs under
``--workdir`` with ``src_dask.save`` chunk by chunk (reused when the spec matches),
measures the GEMM rate, times quimb's ``tensor_network_1d_compress(method="src")`` in
this process where the stack fits (``--quimb``), then for each number of workers and
mode (environments in the cluster, or in a run store) starts a cluster
(``clusters.py``; ``--scheduler-file``: workers started outside, as under Slurm),
warms it on a tiny stack and times ``src_dask.src`` on the opened trains; then, with
``--src-method-devices N``, src-method on N GPUs on the inputs read into host memory
(``tools/peers.py``). Per run the record holds the time, FLOPs (``src_dask.plan``'s)
and rates, ratios (to quimb, 2 workers to 1, ours to src-method: the targets bound
them), peak memory, bytes spilled, where the time went, the plan, the core difference
from the first run and the last call's transfers (``tools/transfers.py``). It is
written after every run (benchmarks/results/stack_<device>_dm<D_M>.json).

    python benchmarks/bench_stack.py                           # D_M=1000, chi_out=500
    python benchmarks/bench_stack.py --dm 2000 --chi-out 1000 --modes memory
    python benchmarks/bench_stack.py --quick --workdir /tmp/x  # 6 sites, D_M=16, chi_out=8
    python benchmarks/bench_stack.py --modes memory --quimb no --workers 1 2 \
        --protocol ucx --rmm pool --src-method-devices 2 --transfer-detail /tmp/out
    python benchmarks/bench_stack.py --modes memory --quimb no --workers 2 --merge \
        --scheduler-file sched.json   # workers started as under Slurm: run w2_memory_schedfile
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import clusters
from accuracy import core_difference
from device import Device, run_gemm
from flops import PLAN_CONVENTION, PLAN_LEGEND, plan_flops, rates
from harness import (
    Config,
    Record,
    cell,
    check_targets,
    earlier_record,
    execute_benchmark,
    gb,
    parser,
    print_table,
    print_targets,
)
from problems import (
    STACK_TARGETS,
    free_bytes,
    generate_inputs,
    open_inputs,
    stack_spec,
    stack_trains,
)
from stack_runs import run_config, time_quimb
from timing import profile_text
from tools.peers import is_peer, peer_ratios, time_peers
from tools.transfers import print_transfers

#: Results larger than this are not kept on the client to compare runs' cores.
COMPARE_MAX_BYTES = 8 * 10**9


def parse_args(argv: list[str] | None = None):
    p = parser(__doc__, quick="6 sites, D_M=16, chi_out=8", device=True, repeats=1, seed=0,
               gemm=True, out="stack_<device>_dm<D_M>.json",
               merge="the other runs (and the quimb timing, if this run has none)")
    p.sized("--sites", type=int, full=50, quick=6, help="sites")
    p.sized("--dm", type=int, full=1000, quick=16, help="bond of M")
    p.sized("--chi-out", type=int, full=500, quick=8, help="bond of the result")
    p.add_argument("--phys", type=int, default=4, help="physical legs (phys x phys)")
    p.add_argument("--chunk", type=int, default=None, help="sketch columns per block "
                   "(src_dask's default: one block per worker thread, none over 256 MiB)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--modes", nargs="+", choices=("memory", "store"),
                   default=["memory", "store"],
                   help="memory: environments in the cluster; store: in a run store on disk")
    p.add_argument("--full-warmup", action="store_true",
                   help="an untimed full-size run first (default: only a tiny warm-up stack)")
    p.add_argument("--quimb", choices=("auto", "yes", "no"), default="auto",
                   help="time quimb's src on the stack (auto: where it fits in memory)")
    p.add_argument("--keep-inputs", choices=("auto", "yes", "no"), default="auto",
                   help="the Dask config src_dask.keep-inputs: read the Zarr inputs once and "
                        "keep them for pass 2 (yes), read them in each pass (no), or let "
                        "src_dask decide from their size and the worker's memory (auto)")
    p.add_argument("--src-method-devices", type=int, nargs="+", default=[], metavar="N",
                   help="time the peer project src-method on N GPUs (each N given; "
                        "simulated devices with --device cpu), after src_dask's runs, on "
                        "the same inputs read into host memory (default: not run)")
    p.add_argument("--transfer-detail", type=Path, default=None, metavar="DIR",
                   help="write every transfer of each configuration's last timed call to "
                        "DIR/transfers_w<workers>_<mode>.json (the record keeps a summary "
                        "per key prefix and the slowest 12)")
    p.add_argument("--report", type=Path, default=None, metavar="PATH.html",
                   help="write Dask's performance report of each configuration's timed call "
                        "(PATH_w<workers>_<mode>.html): task stream, transfers, profile")
    clusters.add_options(p)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/src_dask_bench"),
                   help="inputs, run stores and worker spill space")
    p.add_argument("--regenerate", action="store_true", help="write the inputs anew")
    p.add_argument("--no-compare", action="store_true",
                   help="do not compare the runs' cores with the first run's")
    return p.parse_args(argv)


def report(record: dict[str, Any]) -> None:
    rows: list[Any] = []
    for key, e in [("quimb", record["quimb"]), *record["runs"].items()]:
        if "best_s" not in e:
            rows.append(f"{key}: {' '.join(f'{k}: {v}' for k, v in e.items())}")
            continue
        mem, diff = e["memory"], e.get("core_diff_vs_first")
        if is_peer(key):
            diff = next((v for k, v in e.items() if k.startswith("core_diff_vs_")), None)
        rows.append([key, f"{e['best_s']:.3f}", cell(e.get("ratio_to_quimb"), ".3f"),
                     f"{e['tflops'] * 1e3:.1f}",
                     f"{e['fraction_of_gemm']:.1%}", gb(mem["peak_host_rss_bytes"]),
                     gb(mem["peak_device_used_bytes"], mem["baseline_device_used_bytes"]),
                     gb(e.get("spilled", {}).get("total_bytes")),
                     cell(diff, ".1e"),
                     e.get("cluster", "this process")])
    gemm = record["gemm_complex128"]
    legend = [PLAN_LEGEND, f"{record['flops']['total']:.3e} flop; GEMM complex128 {gemm['n']}^3 on "
              f"the {gemm['device'].upper()}: {gemm['tflops']:.3f} TFLOP/s. host GB: peak RSS "
              "of this process and the workers; device GB: peak device-wide use above the "
              "baseline"]
    legend += [f"{key}: {profile_text(e['profile'])}" for key, e in record["runs"].items()
               if e.get("profile") and not is_peer(key)]
    legend += [peer_text(key, e) for key, e in record["runs"].items()
               if is_peer(key) and "best_s" in e]
    if record.get("ratios"):
        legend.append("ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in record["ratios"].items()))
    print_table(["run", "best s", "/quimb", "GFLOP/s", "of GEMM", "host GB", "device GB",
                 "spilled GB", "core diff", "cluster"], rows, legend, align="lrrrrrrrrl")
    print_targets(record.get("targets", []))
    for key, e in record["runs"].items():
        if e.get("transfers") and not is_peer(key):
            print_transfers(key, e["transfers"])


def peer_text(key: str, e: dict[str, Any]) -> str:
    """One line on a src-method run: its passes (from its log), the inputs' read, and
    its cores against ours and against its other runs."""
    prof = e.get("profile", {})
    words = [f"{key}: pass 1 {prof.get('pass1_span_s', 0):.1f} s, pass 2 "
             f"{prof.get('pass2_span_s', 0):.1f} s (src-method's log); inputs read in "
             f"{e.get('load_s', 0):.1f} s, not timed"]
    vs = e.get("vs_src_dask", {})
    if "rel_distance" in vs:
        words.append(f"against {vs['run']} (other sketches): distance "
                     f"{vs['rel_distance']:.2e}")
    words += [f"{k.removeprefix('core_diff_vs_')} core diff {v:.1e}" for k, v in e.items()
              if k.startswith("core_diff_vs_")]
    return "; ".join(words)


def fields(args) -> dict[str, Any]:
    """The problem, its sizes and FLOPs (``src_dask.plan``'s), the options."""
    sp = stack_spec(args.sites, args.dm, args.phys, args.seed)
    flops = plan_flops(*stack_trains(sp), chi_out=args.chi_out)
    return {"problem": {**sp, "dm": args.dm, "chi_out": args.chi_out, "chunk": args.chunk},
            "sizes": {"inputs_bytes": flops["input_bytes"],
                      "environments_bytes": flops["env_bytes"],
                      "result_bytes_at_most": args.sites * args.chi_out**2 * args.phys**2 * 16},
            "flops": flops, "flop_convention": PLAN_CONVENTION, "repeats": args.repeats,
            "full_warmup": args.full_warmup}


def run(args, record: Record, device: Device) -> None:
    """The inputs, the GEMM rate, quimb, every configuration (workers, mode) and the
    peers, into ``record`` (written after every run)."""
    sp, flops, envs = record["problem"], record["flops"], record["sizes"]["environments_bytes"]
    earlier = earlier_record(args.merge, record.path)
    record["runs"] = earlier.get("runs", {})
    print(f"stack: {args.sites} sites, bonds {list(sp['bonds'].values())}, phys {args.phys}x"
          f"{args.phys}, chi_out {args.chi_out}: {flops['total']:.3e} flop; environments "
          f"{envs / 1e9:.2f} GB (in the cluster without a store, on disk with one)")
    args.workdir.mkdir(parents=True, exist_ok=True)
    record["generation"] = generate_inputs(sp, args.workdir, args.regenerate)
    trains = open_inputs(sp, args.workdir)
    gemm = record["gemm_complex128"] = run_gemm(args.gemm_n, args.quick, device)
    record["quimb"] = quimb = time_quimb(record, earlier, trains, args, device, envs, gemm)
    found = STACK_TARGETS.get((device.name, args.dm, args.chi_out), ())
    compare = not args.no_compare and record["sizes"]["result_bytes_at_most"] <= COMPARE_MAX_BYTES
    first = first_key = None

    def add(key: str, entry: dict[str, Any]) -> None:
        if "best_s" in entry:
            entry.update(flops=flops["total"], **rates(flops["total"], entry["best_s"], gemm))
            if "best_s" in quimb:
                entry["ratio_to_quimb"] = entry["best_s"] / quimb["best_s"]
        record["runs"][key] = entry
        record["ratios"] = peer_ratios(record["runs"])
        ours = {k: e for k, e in record["runs"].items() if not is_peer(k)}
        record["targets"] = check_targets(found, ours)
        record.save()

    for n_workers in args.workers:
        for mode in args.modes:
            key = f"w{n_workers}_{mode}" + ("_schedfile" if args.scheduler_file else "")
            if mode == "store" and free_bytes(args.workdir) < 1.1 * envs:
                add(key, {"skipped": f"the run store needs about {1.1 * envs / 1e9:.1f} GB; "
                                     f"{free_bytes(args.workdir) / 1e9:.1f} GB free"})
                print(f"{key}: skipped, {record['runs'][key]['skipped']}")
                continue
            entry, result = run_config(trains, n_workers, mode, args, device, keep=compare)
            if compare:
                first, first_key = (result, key) if first is None else (first, first_key)
                entry["core_diff_vs_first"] = core_difference(first, result)
            add(key, entry)
            print(f"{key}: best {entry['best_s']:.3f} s ({entry['cluster']}; started in "
                  f"{entry['cluster_startup_s']:.1f} s, not counted)", flush=True)
    if args.src_method_devices:
        for key, entry in time_peers(trains, args, device, first, first_key,
                                     keep=compare).items():
            add(key, entry)


CONFIG = Config(
    measures="the stack N·V·M·U from Zarr by SRC: src_dask on 1 and 2 workers against quimb "
             "src and src-method",
    name=lambda args, device: f"stack_{device.name}_dm{args.dm}.json",
    device=lambda args: Device(args.device, cluster=True), run=run, report=report,
    fields=fields)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return execute_benchmark(CONFIG, parse_args(argv))


if __name__ == "__main__":
    main()
