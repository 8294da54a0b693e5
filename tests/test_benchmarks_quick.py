"""The benchmark scripts run end to end at their ``--quick`` sizes (the GPU when there is one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(BENCH / script), "--quick", *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_bench_cpu_quick(tmp_path):
    out = tmp_path / "cpu.json"
    _run("bench_cpu.py", "--no-cluster", "--out", str(out))
    record = json.loads(out.read_text())
    assert record["flops"]["total"] > 0
    assert record["errors"]["src_dask_threads"]["rel_error"] < 0.5


def test_bench_mpo_mps_quick(tmp_path):
    out = tmp_path / "mpo_mps.json"
    stdout = _run("bench_mpo_mps.py", "--out", str(out))
    record = json.loads(out.read_text())
    assert set(record["results"]) == {"16", "32"}
    for res in record["results"].values():
        runs = res["runs"]
        # each compared pair back to back, zipup last
        assert list(runs) == ["quimb_src", "src_dask", "quimb_src_oversample",
                              "src_dask_oversample", "quimb_zipup"]
        assert runs["quimb_src"]["ratio_to_quimb_src"] == 1
        for method, e in runs.items():
            assert e["best_s"] > 0 and e["memory"]["peak_host_rss_bytes"] > 0
            assert e["spilled_bytes"] == 0
            assert (e["tflops"] is None) == (method == "quimb_zipup")
        # same algorithm, different sketches: errors agree within a factor
        assert 0.5 < runs["src_dask"]["error_ratio_to_quimb"] < 2
        assert runs["src_dask_oversample"]["rel_error"] < runs["src_dask"]["rel_error"]
    assert ("wrote" in stdout and out.with_suffix(".png").exists()) or "no plot" in stdout


def test_bench_stack_quick(tmp_path):
    out = tmp_path / "stack.json"
    _run("bench_stack.py", "--workdir", str(tmp_path / "work"), "--out", str(out))
    record = json.loads(out.read_text())
    assert record["flops"]["total"] > 0 and record["quimb"]["best_s"] > 0
    assert list(record["runs"]) == ["w1_memory", "w1_store", "w2_memory", "w2_store"]
    for e in record["runs"].values():
        assert e["best_s"] > 0 and e["ratio_to_quimb"] > 0
        assert e["spilled"]["total_bytes"] == 0
        assert e["core_diff_vs_first"] < 1e-10  # the sketch depends on the seed alone
    assert not (tmp_path / "work" / "store_w1").exists()  # run stores are removed


def test_bench_transfer_best_picks_the_fastest_link(tmp_path):
    """``bench_transfer.py --best`` (which the 2-GPU runs of gpu_issue5.sh use) names the
    fastest protocol and allocator, and falls back to tcp/async without a record."""
    record = tmp_path / "transfer.json"
    record.write_text(json.dumps({"runs": [
        {"protocol": "tcp", "rmm": "async", "best_GBps": 1.0},
        {"protocol": "ucx", "rmm": "pool", "best_GBps": 40.0},
        {"protocol": "ucx", "rmm": "async", "error": "RuntimeError()"}]}))

    def best(path: Path) -> str:
        done = subprocess.run([sys.executable, str(BENCH / "bench_transfer.py"), "--best",
                               str(path)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip()

    assert best(record) == "ucx pool"
    assert best(tmp_path / "missing.json") == "tcp async"


def test_plot_stack_draws_the_recorded_runs(tmp_path):
    """``plot_stack.py`` turns bench_stack records into one bar per run and size (wall
    time split at the end of pass 1, the FLOP floor at the run's GEMM rate), and into a
    PNG where matplotlib is installed."""
    import importlib.util

    sys.path.insert(0, str(BENCH))
    try:
        import plot_stack
    finally:
        sys.path.remove(str(BENCH))
    paths = sorted((BENCH / "results").glob("stack_gpu_dm*.json"))
    records = [json.loads(p.read_text()) for p in paths]
    groups = plot_stack.bars(records)
    assert set(groups) == {(r["problem"]["dm"], r["problem"]["chi_out"]) for r in records}
    ours = sum("best_s" in run for r in records for run in r["runs"].values())
    quimb = sum("best_s" in r.get("quimb", {}) for r in records)
    assert quimb >= 1  # the records hold quimb's time on the stack (the ratio's peer)
    assert sum(map(len, groups.values())) == ours + quimb
    assert sum(bar["quimb"] for runs in groups.values() for bar in runs) == quimb
    for runs in groups.values():
        for bar in runs:
            assert 0 < bar["floor"] < bar["total"]
            # quimb's run is one bar; ours is split at the end of pass 1
            assert bar["pass1"] == 0 if bar["quimb"] else 0 < bar["pass1"] <= bar["total"]
    if importlib.util.find_spec("matplotlib") is None:
        return
    out = tmp_path / "stack.png"
    done = subprocess.run([sys.executable, str(BENCH / "plot_stack.py"), *map(str, paths),
                           "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_overhead_quick(tmp_path):
    out = tmp_path / "overhead.json"
    stdout = _run("bench_overhead.py", "--out", str(out))
    record = json.loads(out.read_text())
    assert set(record["results"]) == {"sync", "threads", "client_inprocess_1x2"}
    for r in record["results"].values():
        assert len(r["times_s"]) == 2 and 0 < r["best_s"] == min(r["times_s"])
    assert "client_inprocess_1x2" in stdout
