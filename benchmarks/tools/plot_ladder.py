# ruff: noqa: T201
"""A PNG of bench_memory_ladder.py records: time against the GPU memory a worker may
use (its RMM pool's cap; the uncapped rung at the device's memory), one line per
stack, rungs that did not finish marked at the top.

    python benchmarks/tools/plot_ladder.py benchmarks/results/memory_ladder_dm*.json
    (writes benchmarks/results/memory_ladder.png; --out elsewhere)
"""

from __future__ import annotations

import json
from pathlib import Path

from harness import RESULTS, parser

GB = 10**9


def lines(records: list[dict]) -> dict[str, list[dict]]:
    """Per stack (``D_M=…/χ_out=…``, the record's date), its rungs by memory: ``memory``
    in GB (the cap, or the device's for the uncapped rung), ``seconds`` (None: it did
    not finish), ``over`` (time over the uncapped rung)."""
    out: dict[str, list[dict]] = {}
    for rec in sorted(records, key=lambda r: r["date"]):
        whole = rec["device"].get("memory_bytes", 141 * GB) / GB  # the uncapped rung's
        name = (f"D_M={rec['problem']['dm']}/χ_out={rec['problem']['chi_out']} "
                f"({rec['date'][:16]}Z)")
        rungs = []
        for run in rec["runs"].values():
            rungs.append({"memory": run.get("cap_GB") or whole,
                          "seconds": run.get("seconds"),
                          "over": run.get("time_over_first")})
        out[name] = sorted(rungs, key=lambda r: r["memory"])
    return out


def main(argv: list[str] | None = None) -> Path:
    p = parser(__doc__)
    p.add_argument("records", nargs="+", type=Path, help="bench_memory_ladder.py records")
    p.add_argument("--out", type=Path, default=RESULTS / "memory_ladder.png")
    args = p.parse_args(argv)
    groups = lines([json.loads(path.read_text()) for path in args.records])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    top = max((r["seconds"] or 0) for rungs in groups.values() for r in rungs) * 1.3 or 1
    for name, rungs in groups.items():
        done = [r for r in rungs if r["seconds"] is not None]
        ax.plot([r["memory"] for r in done], [r["seconds"] for r in done], "o-", label=name)
        for r in rungs:
            if r["seconds"] is None:
                ax.plot([r["memory"]], [top], "x", color="black")
                ax.annotate("did not finish", (r["memory"], top), textcoords="offset points",
                            xytext=(4, -12), fontsize=8)
    ax.set_xscale("log", base=2)
    ticks = sorted({r["memory"] for rungs in groups.values() for r in rungs})
    ax.set_xticks(ticks, [f"{t:.0f}" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("GPU memory a worker may use (GB, the RMM pool's cap)")
    ax.set_ylabel("time of src (s)")
    ax.set_title("src_dask on one H200 with its memory capped")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()
