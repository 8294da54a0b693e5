# ruff: noqa: T201
"""Pass 2's critical path, site by site, from a run's task timeline.

``bench_stack.py --transfer-detail DIR`` writes every task of a timed run (its key,
worker and the start and stop of each action) to ``DIR/tasks_<run>.json``. Pass 2 is
a chain of sites, so its time is the sum of the sites' periods (the start of site
``j``'s first projection to that of site ``j-1``; the last site, whose projection
needs no environment and may run during pass 1, is left out); this script splits
each period into what the workers computed and what they waited for:

- ``period``: the site's time on the critical path;
- ``busy wN``: the share of the period worker ``N`` had a task computing (the union
  of its compute intervals, so tasks running side by side count once);
- ``gather``: from the last sketch piece done to the first QR started (the all-gather
  of the sketch when pass 2 is split; a local step on one worker);
- ``shares``: from the last share of ``S_{j-1}`` done to the first projection of site
  ``j-1`` started (the reduce-scatter of split pass 2);
- ``qr``: the QR task itself (on one worker: the whole fused site).

Medians over the sites are printed first, then the sites themselves (``--sites``).
When pass 2 is split, a second table follows each worker's own chain through a site
(medians over sites and workers): its steps' spans (``project``, ``sketch``, ``qr``,
``update``: first start to last end of the step's tasks on that worker) and the gaps
between them (``>sketch``, ``>qr``, ``>update``, ``>next``: one step's last end to the
next one's first start there): the waits for the scheduler's round trip and for data.
Pass 1 is summed up by its pace: the time between the ends of consecutive sites' last
block.

    python benchmarks/tools/timeline.py DIR/tasks_w2_memory.json
    python benchmarks/tools/timeline.py DIR/tasks_w1_memory.json DIR/tasks_w2_memory.json --sites 5
    python benchmarks/tools/timeline.py benchmarks/results/x2_tasks/dm1000_w2_memory.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

_KEY = re.compile(r"\('(pass1|pass2)_site(\d+)-\w+',?\s*'?(\w*)'?")


def merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``intervals`` as disjoint intervals, sorted."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def covered(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of [lo, hi) covered by ``intervals`` (overlapping ones counted once)."""
    return sum(max(0.0, min(hi, b) - max(lo, a)) for a, b in merge(intervals)
               if a < hi and b > lo)


def analyse(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The sites of pass 2 (``sites``: one dict per site, right to left) and pass 1's
    pace, from the rows of a ``tasks_<run>.json``."""
    workers = sorted({r["worker"] for r in rows if r.get("worker")})
    index = {w: i for i, w in enumerate(workers)}
    compute: dict[int, list[tuple[float, float]]] = defaultdict(list)
    steps: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    per_worker: dict[tuple[int, str, int], list[tuple[float, float]]] = defaultdict(list)
    pass1_end: dict[int, float] = {}
    for r in rows:
        w = index.get(r.get("worker"))
        spans = [(a, b) for action, a, b in r["actions"] if action == "compute"]
        if w is not None:
            compute[w].extend(spans)
        m = _KEY.match(r["key"])
        if not m or not spans:
            continue
        site = int(m[2])
        if m[1] == "pass1":
            pass1_end[site] = max(pass1_end.get(site, -math.inf), max(b for _, b in spans))
        else:
            steps[site, m[3]].extend(spans)
            if w is not None:
                per_worker[site, m[3], w].extend(spans)
    starts = {j: min(a for a, _ in steps[j, "project"]) for j in {s for s, _ in steps}
              if steps.get((j, "project"))}
    sites = []
    # the last site's projection needs no environment (S = 1) and may run during
    # pass 1: its "period" would hold pass 1's tail, so the chain starts at the next
    order = sorted(starts, reverse=True)[1:]
    for j, nxt in zip(order, order[1:], strict=False):
        lo, hi = starts[j], starts[nxt]
        site: dict[str, Any] = {"site": j, "period_s": hi - lo}
        for w in range(len(workers)):
            site[f"busy_w{w}"] = covered(compute[w], lo, hi) / (hi - lo) if hi > lo else 0.0
        sketches, qrs, shares = steps.get((j, "sketch")), steps.get((j, "qr")), \
            steps.get((j, "update"))
        if sketches and qrs:
            site["gather_s"] = min(a for a, _ in qrs) - max(b for _, b in sketches)
        if qrs:
            site["qr_s"] = max(b - a for a, b in qrs)
        if shares:
            site["shares_s"] = hi - max(b for _, b in shares)
        sites.append(site)
    ends = [pass1_end[j] for j in sorted(pass1_end)]
    pace = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    return {"workers": workers, "sites": sites, "chain": _chain(order, workers, per_worker),
            "pass2_s": sum(s["period_s"] for s in sites),
            "pass1_pace_s": statistics.median(pace) if pace else None}


CHAIN = ("project", ">sketch", "sketch", ">qr", "qr", ">update", "update", ">next")


def _chain(order: list[int], workers: list[str],
           per_worker: dict[tuple[int, str, int], list[tuple[float, float]]]
           ) -> dict[str, float]:
    """Each worker's steps through a site of split pass 2 and the gaps between them
    (:data:`CHAIN`, seconds), medians over the sites and workers that have them all."""
    values: dict[str, list[float]] = defaultdict(list)
    for j, nxt in zip(order, order[1:], strict=False):
        for w in range(len(workers)):
            spans = {step: per_worker.get((j, step, w)) for step in CHAIN[::2]}
            spans["next"] = per_worker.get((nxt, "project", w))
            if not all(spans.values()):
                continue
            first = {k: min(a for a, _ in v) for k, v in spans.items()}
            last = {k: max(b for _, b in v) for k, v in spans.items()}
            steps = [*CHAIN[::2], "next"]
            for step, after in zip(steps, steps[1:], strict=False):
                values[step].append(last[step] - first[step])
                values[">" + after].append(first[after] - last[step])
    return {k: statistics.median(values[k]) for k in CHAIN if values.get(k)}


def _medians(sites: list[dict[str, Any]]) -> dict[str, float]:
    names = sorted({k for s in sites for k in s if k != "site"})
    return {k: statistics.median(s[k] for s in sites if k in s) for k in names}


def _row(values: dict[str, Any], names: list[str]) -> str:
    cells = []
    for k in names:
        v = values.get(k)
        if v is None:
            cells.append(f"{'-':>9}")
        elif k.startswith("busy"):
            cells.append(f"{100 * v:8.0f}%")
        else:
            cells.append(f"{1000 * v:7.1f}ms")
    return " ".join(cells)


def report(path: Path, sites_shown: int) -> dict[str, Any]:
    """Print the analysis of one ``tasks_<run>.json``; returns it."""
    path = Path(path)
    text = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text()
    out = analyse(json.loads(text))
    sites = out["sites"]
    print(f"{path}: {len(out['workers'])} workers, pass 2 {len(sites)} sites, "
          f"{out['pass2_s']:.2f} s from the first site's projection to the last's"
          + (f"; pass 1 one site every {1000 * out['pass1_pace_s']:.1f} ms"
             if out["pass1_pace_s"] is not None else ""))
    if not sites:
        return out
    names = ["period_s", *[f"busy_w{w}" for w in range(len(out["workers"]))],
             "gather_s", "qr_s", "shares_s"]
    header = " ".join(f"{n.removesuffix('_s'):>9}" for n in names)
    print(f"{'':>8} {header}")
    print(f"{'median':>8} {_row(_medians(sites), names)}")
    for s in sites[:sites_shown]:
        print(f"{'site ' + str(s['site']):>8} {_row(s, names)}")
    out["medians"] = _medians(sites)
    if out["chain"]:
        names = [k for k in CHAIN if k in out["chain"]]
        print(f"{'':>8} " + " ".join(f"{n:>9}" for n in names))
        print(f"{'worker':>8} " + " ".join(f"{1000 * out['chain'][n]:7.1f}ms" for n in names))
    return out


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[1:]))
    p.add_argument("tasks", nargs="*", type=Path, help="tasks_<run>.json files")
    p.add_argument("--sites", type=int, default=3, help="sites shown one by one (default 3)")
    p.add_argument("--quick", action="store_true", help="analyse nothing (the scripts' "
                   "common smoke-test option)")
    args = p.parse_args(argv)
    return [report(path, args.sites) for path in args.tasks]


if __name__ == "__main__":
    main()
