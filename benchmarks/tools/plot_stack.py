# ruff: noqa: T201
"""A PNG of bench_stack.py records: each run's wall time split into pass 1 and the rest
(quimb's src, where a record timed it, as one grey bar; the peer src-method's runs
split by the pass times it logs), against the time target and
the FLOP floor (the record's ``flops``, in its ``flop_convention``) at the GEMM rate
of its run.

    python benchmarks/tools/plot_stack.py benchmarks/results/stack_gpu_*.json
    (writes benchmarks/results/stack_gpu.png; --out elsewhere)
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from harness import RESULTS, parser
from problems import STACK_TARGETS

#: The time target per (D_M, chi_out) of the GPU runs.
TARGET_S = {(dm, chi): t.bound for (device, dm, chi), targets in STACK_TARGETS.items()
            for t in targets if device == "gpu" and t.what == "best_s"}


def bars(records: list[dict]) -> dict[tuple[int, int], list[dict]]:
    """Per problem size, one bar per timed run: label, pass 1, the rest, the FLOP floor
    on the GPUs it used, how many, whether it is quimb's."""
    out: dict[tuple[int, int], list[dict]] = {}
    for rec in sorted(records, key=lambda r: r["date"]):
        size = (rec["problem"]["dm"], rec["problem"]["chi_out"])
        floor = rec["flops"]["total"] / (rec["gemm_complex128"]["tflops"] * 1e12)
        when = f"{rec['date'][5:10]} {rec['date'][11:16]}Z"
        where = rec["device"].get("gpu", rec["cpu_model"])
        quimb = rec.get("quimb", {})
        if "best_s" in quimb:
            out.setdefault(size, []).append({"label": f"{when} quimb src", "pass1": 0.0,
                                             "total": quimb["best_s"], "floor": floor,
                                             "quimb": True, "where": where, "gpus": 1})
        for run in rec["runs"].values():
            if "best_s" not in run:
                continue
            pass1 = run.get("profile", {}).get("pass1_span_s", 0.0)
            if run.get("peer") == "src-method":  # the peer project, pass 1 from its log
                gpus = f"{run['devices']} GPU" + ("s" if run["devices"] > 1 else "")
                out.setdefault(size, []).append({
                    "label": f"{when} src-method {gpus}", "pass1": min(pass1, run["best_s"]),
                    "total": run["best_s"], "floor": floor / run["devices"], "quimb": False,
                    "peer": True, "where": where, "gpus": run["devices"]})
                continue
            if run["workers"] == 1:
                link = ""
            elif "started outside" in run["cluster"]:  # --scheduler-file: as under Slurm
                link = " Slurm-style"
            else:
                link = " ucx" if "'ucx'" in run["cluster"] else " tcp"
            gpus = f"{run['workers']} GPU" + ("s" if run["workers"] > 1 else "")
            label = f"{when} {gpus}{link}{_variant(run)}"
            # workers standing in for GPUs on one share its GEMM rate
            devices = 1 if "sharing one GPU" in run["cluster"] else run["workers"]
            out.setdefault(size, []).append({"label": label, "pass1": min(pass1, run["best_s"]),
                                             "total": run["best_s"], "floor": floor / devices,
                                             "quimb": False, "where": where, "gpus": devices})
    return out


def _variant(run: dict) -> str:
    """What set the run apart: inputs kept for pass 2 or read again, 8 threads."""
    keep = run.get("keep_inputs")
    if isinstance(keep, dict):  # {"option": auto|yes|no, "decision": src_dask's log line}
        keep = "kept" in (keep.get("decision") or "") or keep.get("option") == "yes"
    words = [" kept" if keep else ""]
    if "threads_per_worker=8" in run.get("cluster", ""):
        words.append(" 8 threads")
    return "".join(words)


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = bars(records)
    height = 1.2 + 0.55 * sum(map(len, groups.values()))
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, height), squeeze=False)
    for ax, (size, runs) in zip(axes[:, 0], sorted(groups.items()), strict=True):
        y = range(len(runs))
        ax.barh(y, [r["pass1"] for r in runs], color="tab:blue", label="pass 1")
        ax.barh(y, [r["total"] - r["pass1"] for r in runs], left=[r["pass1"] for r in runs],
                color=["0.6" if r["quimb"] else "tab:green" if r.get("peer") else "tab:orange"
                       for r in runs],
                label="pass 2 and the rest (grey: quimb's whole run; green: src-method)")
        ax.set_yticks(list(y), [r["label"] for r in runs])
        for (gpus, floor), style in zip(sorted({(r["gpus"], r["floor"]) for r in runs}),
                                        (":", "-.", "--", "-"), strict=False):
            ax.axvline(floor, color="k", ls=style, lw=1,
                       label=f"FLOP floor at the GEMM rate, {gpus} GPU" + "s" * (gpus > 1))
        if size in TARGET_S:
            ax.axvline(TARGET_S[size], color="tab:red", ls="--", label="target")
        longest = max(r["total"] for r in runs)
        limit = min(4 * TARGET_S.get(size, longest), 1.3 * longest)
        ax.set_xlim(0, limit)
        for i, r in enumerate(runs):  # the time written at the end of the bar (or the axis)
            ax.text(min(r["total"], limit) * 0.99, i, f"{r['total']:.1f} s",
                    ha="right" if r["total"] > limit * 0.8 else "left", va="center",
                    fontsize=7)
        ax.set_title(f"stack N·V·M·U, D_M={size[0]}, chi_out={size[1]}, complex128, "
                     f"{runs[-1]['where']}", fontsize=9)
        ax.set_xlabel("seconds")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    conventions = sorted({r.get("flop_convention", "") for r in records})
    fig.text(0.01, 0.005, textwrap.fill("FLOPs: " + "; ".join(conventions), 160), fontsize=6)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__)
    p.add_argument("records", nargs="+", type=Path, help="bench_stack.py records (JSON)")
    p.add_argument("--out", type=Path, default=RESULTS / "stack_gpu.png",
                   help="the PNG (default benchmarks/results/stack_gpu.png)")
    args = p.parse_args(argv)
    plot([json.loads(r.read_text()) for r in args.records], args.out)


if __name__ == "__main__":
    main()
