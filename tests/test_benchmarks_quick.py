"""The benchmark scripts run end to end at their ``--quick`` sizes (the GPU when there is
one), in this process (their imports are paid once); every script answers ``--help``."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = ("bench_cpu", "bench_mpo_mps", "bench_stack", "bench_overhead", "gpu_reference",
           "bench_memory_ladder", "tools.bench_transfer", "tools.plan_reference",
           "tools.plot_stack", "tools.profile_gpu", "tools.profile_kernels", "tools.timeline",
           "tools.plot_ladder")
#: What every table with a percentage of the GEMM rate states under it.
FLOP_LEGEND = "FLOPs: complex multiply-add = 8 flop"


@pytest.fixture(autouse=True)
def _bench_path(monkeypatch):
    """The scripts import their shared modules (harness, flops, ...) by name; cluster
    workers started by a script get this path too."""
    monkeypatch.syspath_prepend(str(BENCH))


def _main(script: str, *args: str, capsys) -> tuple[object, str]:
    """``script``'s ``main(["--quick", *args])``: its return value and what it printed."""
    result = importlib.import_module(script).main(["--quick", *args])
    return result, capsys.readouterr().out


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_answers_help(script, capsys):
    module = importlib.import_module(script)
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and module.__doc__.splitlines()[0] in out


def test_gpu_run_sh_parses_and_refuses_unknown_parts(tmp_path):
    script = BENCH / "gpu_run.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    done = subprocess.run(["bash", str(script)], cwd=BENCH.parent, capture_output=True,
                          text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), "PART": "nope"})
    assert done.returncode == 2 and "PART entries must be among" in done.stderr


def test_no_script_writes_time_stamped_names():
    """Records are overwritten in place (git keeps their history): no file name is built
    from the clock, and the old history folder is gone."""
    assert not (BENCH / "results" / "history").exists()
    assert not [p for p in (BENCH / "results").iterdir() if re.search(r"_\d{4}Z\.", p.name)]
    for path in [*BENCH.glob("*.py"), *BENCH.glob("tools/*.py"), *BENCH.glob("*.sh")]:
        text = path.read_text()
        assert "strftime" not in text and "%H%MZ" not in text, path


def test_bench_cpu_quick(tmp_path, capsys):
    out = tmp_path / "cpu.json"
    _main("bench_cpu", "--no-cluster", "--out", str(out), capsys=capsys)
    record = json.loads(out.read_text())
    assert record["flops"]["total"] > 0 and record["git"]["commit"]
    assert record["errors"]["src_dask_threads"]["rel_error"] < 0.5
    assert record["errors"]["dense_check"]["src_dask_threads"] == pytest.approx(
        record["errors"]["src_dask_threads"]["rel_error"], rel=1e-6)


def test_bench_mpo_mps_quick(tmp_path, capsys):
    out = tmp_path / "mpo_mps.json"
    _, stdout = _main("bench_mpo_mps", "--out", str(out), capsys=capsys)
    record = json.loads(out.read_text())
    assert set(record["results"]) == {"16", "32"}
    assert FLOP_LEGEND in stdout and record["flop_convention"].startswith("complex")
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


@pytest.mark.slow  # seconds of wall time: `make test-slow` (CI runs it too)
def test_bench_stack_quick(tmp_path, capsys):
    """Environments in the cluster on 1 and 2 workers (the same cores: the sketch depends
    on the seed alone), then a run store on 1 worker added by a second run with
    ``--merge``, which reuses the inputs and keeps the first run's quimb timing."""
    out, work = tmp_path / "stack.json", str(tmp_path / "work")
    _, stdout = _main("bench_stack", "--workdir", work, "--out", str(out), "--workers", "1",
                      "2", "--modes", "memory", "--repeats", "2", capsys=capsys)
    first = json.loads(out.read_text())
    assert first["flops"]["total"] > 0 and first["quimb"]["best_s"] > 0
    assert FLOP_LEGEND in stdout and not first["generation"]["reused"]
    _main("bench_stack", "--workdir", work, "--out", str(out), "--workers", "1", "--modes",
          "store", "--quimb", "no", "--merge", capsys=capsys)
    record = json.loads(out.read_text())
    assert record["generation"]["reused"] and record["quimb"] == first["quimb"]
    assert list(record["runs"]) == ["w1_memory", "w2_memory", "w1_store"]
    for e in record["runs"].values():
        assert e["best_s"] > 0 and e["ratio_to_quimb"] > 0
        assert e["spilled"]["total_bytes"] == 0
        assert e["core_diff_vs_first"] < 1e-10
    assert record["runs"]["w1_store"]["store"] and record["runs"]["w2_memory"]["workers"] == 2
    # the transfer watch (plugins) read the last call's transfers from logs as long as
    # the cluster was started with (tools/transfers.py's LOG_CONFIG)
    from tools.transfers import MAXLEN

    watched = record["runs"]["w2_memory"]["transfers"]
    assert "failed" not in watched and set(watched["event_loop"]) == {"w0", "w1", "scheduler"}
    assert {w["log_maxlen"] for w in watched["workers"].values()} == {MAXLEN}
    # and each timed call's event-loop stalls, the last one's as in its transfers
    by_call = record["runs"]["w2_memory"]["stalls_by_call"]
    assert len(by_call) == len(record["runs"]["w2_memory"]["times_s"]) == 2
    assert by_call[-1]["w1"]["stalls"] == watched["event_loop"]["w1"]["stalls"]
    assert not (tmp_path / "work" / "store_w1").exists()  # run stores are removed

    # workers started outside (as under Slurm), found through a scheduler file
    from distributed import Client, LocalCluster

    sched = tmp_path / "scheduler.json"
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        client.write_scheduler_file(str(sched))
        with pytest.raises(SystemExit, match="2 workers there, --workers asked for 1"):
            _main("bench_stack", "--workdir", work, "--out", str(out), "--workers", "1",
                  "--modes", "memory", "--quimb", "no", "--merge", "--scheduler-file",
                  str(sched), capsys=capsys)
        _main("bench_stack", "--workdir", work, "--out", str(out), "--workers", "2",
              "--modes", "memory", "--quimb", "no", "--merge", "--scheduler-file", str(sched),
              capsys=capsys)
    runs = json.loads(out.read_text())["runs"]
    outside = runs["w2_memory_schedfile"]
    assert "started outside" in outside["cluster"] and outside["workers"] == 2
    assert outside["ratio_to_w1"] == outside["best_s"] / runs["w1_memory"]["best_s"]


def test_bench_overhead_quick(tmp_path, capsys):
    out = tmp_path / "overhead.json"
    _, stdout = _main("bench_overhead", "--out", str(out), capsys=capsys)
    record = json.loads(out.read_text())
    assert set(record["results"]) == {"sync", "threads", "client_inprocess_1x2",
                                      "client_graph_1x2"}
    for r in record["results"].values():
        assert len(r["times_s"]) == 2 and 0 < r["best_s"] == min(r["times_s"])
    assert "client_inprocess_1x2" in stdout
    parts = record["graph_breakdown"]
    assert parts["tasks"] > 10  # the graph of many tasks, not the one-task run
    assert 0 < parts["to_first"] < parts["call"] and parts["compute"] > 0


def test_bench_transfer_best_picks_the_fastest_link(tmp_path, capsys):
    """``bench_transfer.py --best`` (which gpu_run.sh's 2-GPU part uses) names the
    fastest protocol and allocator, and falls back to tcp/async without a record."""
    record = tmp_path / "transfer.json"
    record.write_text(json.dumps({"runs": [
        {"protocol": "tcp", "rmm": "async", "best_GBps": 1.0},
        {"protocol": "ucx", "rmm": "pool", "best_GBps": 40.0},
        {"protocol": "ucx", "rmm": "async", "error": "RuntimeError()"}]}))
    bench_transfer = importlib.import_module("tools.bench_transfer")

    def best(path: Path) -> str:
        bench_transfer.main(["--best", str(path)])
        return capsys.readouterr().out.strip()

    assert best(record) == "ucx pool"
    assert best(tmp_path / "missing.json") == "tcp async"


def test_plot_stack_draws_the_recorded_runs(tmp_path):
    """``plot_stack.py`` turns bench_stack records into one bar per run and size (wall
    time split at the end of pass 1, the FLOP floor at the run's GEMM rate), and into a
    PNG where matplotlib is installed."""
    import importlib.util

    plot_stack = importlib.import_module("tools.plot_stack")
    assert plot_stack.TARGET_S == {(1000, 500): 22.0, (2000, 1000): 175.0}
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
    plot_stack.main([*map(str, paths), "--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_reference_prints_plans_and_verdicts(tmp_path, capsys):
    """The plan of a stack on described GPU machines (no GPU needed, nothing drawn)."""
    import json

    from tools.plan_reference import main

    assert main(["--gpus", "1", "2", "--dm", "64", "--chi-out", "32",
                 "--json", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert out.count("SRC plan: MPO·MPO·MPO·MPO") == 2 and "device_peak_fits True" in out
    records = json.loads((tmp_path / "p.json").read_text())["records"]
    assert [r["gpus"] for r in records] == [1, 2]
    # each GPU's data and tasks within the device less its headroom
    assert all(0 < r["plan"]["peak_device"] <= 0.95 * 139 * 2**30 for r in records)
    assert all(r["fits"]["device_peak_fits"] for r in records)


def test_timeline_splits_each_site_into_work_and_waits(tmp_path, capsys):
    """Pass 2's sites from a task timeline: each period from one site's first projection
    to the next's, the workers' busy shares (side-by-side tasks counted once), the wait
    for the sketch pieces before the QR and for the shares before the next projection;
    the last site (projected during pass 1) left out; pass 1's pace."""
    rows, token = [], "0123abcd"

    def task(key, worker, *spans):
        rows.append({"key": key, "worker": worker,
                     "actions": [["transfer", spans[0][0] - 0.1, spans[0][0]]]
                     + [["compute", a, b] for a, b in spans]})

    for j, t in ((3, 0.0), (2, 10.0), (1, 20.0), (0, 30.0)):
        name = f"('pass2_site{j}-{token}'"
        task(f"{name}, 'project', 0)", "a", (t, t + 3))
        task(f"{name}, 'project', 1)", "b", (t, t + 4), (t + 1, t + 2))  # side by side
        if j:
            task(f"{name}, 'sketch', 0)", "a", (t + 3, t + 5))
            task(f"{name}, 'sketch', 1)", "b", (t + 4, t + 6))
            task(f"{name}, 'qr')", "a", (t + 7, t + 8))
            task(f"{name}, 'qr', 1)", "b", (t + 7.5, t + 8.5))
            task(f"{name}, 'update', 0, 0)", "a", (t + 8, t + 9))
            task(f"{name}, 'update', 1, 1)", "b", (t + 8.5, t + 9.5))
    task(f"('pass1_site0-{token}', 0)", "a", (-9, -5))
    task(f"('pass1_site1-{token}', 0)", "a", (-5, -3))
    task(f"('pass1_site1-{token}', 1)", "b", (-5, -2))
    path = tmp_path / "tasks_w2_memory.json"
    path.write_text(json.dumps(rows))
    (out,), stdout = _main("tools.timeline", str(path), capsys=capsys)
    assert [s["site"] for s in out["sites"]] == [2, 1] and out["pass2_s"] == 20.0
    for s in out["sites"]:
        assert s["period_s"] == 10.0 and s["gather_s"] == 1.0 and s["qr_s"] == 1.0
        assert s["shares_s"] == 0.5
        assert abs(s["busy_w0"] - 0.7) < 1e-12 and abs(s["busy_w1"] - 0.8) < 1e-12
    assert out["pass1_pace_s"] == 3.0
    assert "2 workers, pass 2 2 sites" in stdout and "median" in stdout
    # each worker's chain through a site: its steps' spans and the gaps between them
    assert out["chain"] == {"project": 3.5, ">sketch": 0.0, "sketch": 2.0, ">qr": 1.75,
                            "qr": 1.0, ">update": 0.0, "update": 1.0, ">next": 0.75}
    assert ">sketch" in stdout and "worker" in stdout
    # gzip'd timelines (as benchmarks/results/x2_tasks keeps them) read the same
    import gzip

    packed = tmp_path / "tasks_w2_memory.json.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    (again,), _ = _main("tools.timeline", str(packed), capsys=capsys)
    assert again["chain"] == out["chain"] and again["pass2_s"] == out["pass2_s"]


def test_gpu_wheels_pins_what_the_gpu_extra_pins():
    """benchmarks/gpu_wheels.sh (the wheels carried to the GPU machine, which has no
    package index) pins dask, distributed, dask-cuda and distributed-ucxx as
    pyproject.toml's gpu extra does; the scripts and docs name it, not a file outside
    the repository."""
    import tomllib

    root = BENCH.parent
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["gpu"]
    pins = dict(re.match(r"([\w-]+)(?:\[[\w,]+\])?==([\w.*]+)", r).groups() for r in extra
                if "==" in r)
    script = (BENCH / "gpu_wheels.sh").read_text()
    values = dict(re.findall(r"^(\w+)=([\w.]+)", script, re.M))
    assert pins["dask"] == values["DASK"]
    assert pins["dask-cuda"].rstrip(".*") == values["DASK_CUDA"].rsplit(".", 1)[0]
    assert pins["distributed-ucxx-cu13"].rstrip(".*") == values["UCXX"].rsplit(".", 1)[0]
    assert subprocess.run(["bash", "-n", str(BENCH / "gpu_wheels.sh")]).returncode == 0
    for path in [root / "README.md", *(root / "docs").glob("*.md"), *BENCH.glob("*.md"),
                 *BENCH.glob("*.sh"), *BENCH.glob("*.py"), *BENCH.glob("tools/*.py")]:
        assert "shared/tools" not in path.read_text(), path


def test_plot_ladder_draws_one_line_per_stack(tmp_path):
    """``plot_ladder.py`` turns bench_memory_ladder records into one line per stack,
    rungs by the memory a worker may use (the uncapped rung at the device's), and into a
    PNG where matplotlib is installed."""
    import importlib.util

    plot_ladder = importlib.import_module("tools.plot_ladder")
    paths = sorted((BENCH / "results").glob("memory_ladder_dm*.json"))
    records = [json.loads(p.read_text()) for p in paths]
    groups = plot_ladder.lines(records)
    assert len(groups) == len(records) >= 1
    for rec, rungs in zip(sorted(records, key=lambda r: r["date"]), groups.values(),
                          strict=True):
        assert len(rungs) == len(rec["runs"])
        memory = [r["memory"] for r in rungs]
        assert memory == sorted(memory) and memory[-1] > 100  # the uncapped H200 last
        assert rungs[-1]["over"] == 1.0  # the uncapped rung is the reference
        assert all(r["seconds"] is None or r["seconds"] > 0 for r in rungs)
    if importlib.util.find_spec("matplotlib") is None:
        return
    out = tmp_path / "ladder.png"
    plot_ladder.main([*map(str, paths), "--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_benchmarks_import_only_public_src_dask():
    """The benchmarks and their tools use src_dask's public API alone (the single
    kernels of ``tools/profile_kernels.py`` are plain CuPy calls of their shapes)."""
    private = re.compile(r"^\s*(from src_dask(\.\w+)* import _|from src_dask\._|"
                         r"import src_dask\._)|\bsrc_dask\.(\w+\.)*_[a-z]", re.M)
    for path in BENCH.rglob("*.py"):
        assert not private.search(path.read_text()), path.relative_to(BENCH).as_posix()


def test_benchmarks_leave_dask_servers_as_they_are():
    """What the benchmarks keep on Dask's workers and scheduler (spill counters, the
    transfer watch, the ladder's warnings) lives in plugins registered through
    ``Client.register_plugin``: no attribute of a worker or scheduler is set or
    replaced, and none of theirs starting with ``_`` is read."""
    setting = re.compile(r"\bdask_(worker|scheduler)\.[\w.]+\s*=[^=]|"
                         r"\bdask_(worker|scheduler)\.(\w+\.)*_\w|"
                         r"getattr\(dask_(worker|scheduler), \"_")
    for path in BENCH.rglob("*.py"):
        assert not setting.search(path.read_text()), path.relative_to(BENCH).as_posix()


def test_profile_kernels_runs_on_the_cpu(tmp_path, capsys):
    """``tools/profile_kernels.py --device cpu --quick`` times one site of each problem
    and, with ``--products native,3m``, each of their products both ways."""
    out = tmp_path / "kernels.json"
    record, stdout = _main("tools.profile_kernels", "--device", "cpu", "--products",
                           "native,3m", "--no-dm2000", "--out", str(out), capsys=capsys)
    assert json.loads(out.read_text())["date"] == record["date"]
    for site in ("mpo_mps_chi32", "stack_dm16"):
        entry = record[site]
        assert entry["kernels_s"] > 0 and entry["floor_s"] > 0
        assert entry["qr_max_diff"] < 1e-10  # CholeskyQR2 and Householder: the same Q
        assert {"native", "3m"} <= {k.removeprefix(f"{site}_") for k in record}
    rows = record["products_dm16"]
    assert {r["step"] for r in rows} == {"pass1", "project", "piece", "update"}
    assert all(r["native_s"] > 0 and r["three_s"] > 0 for r in rows)
    assert "stack_dm32" not in record and "copies_256MiB" not in record
    assert FLOP_LEGEND in stdout


def test_three_real_products_of_profile_kernels_are_the_products():
    """The three real products ``tools/profile_kernels.py`` times are the complex ones."""
    import numpy as np

    pk = importlib.import_module("tools.profile_kernels")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 5, 7)) + 1j * rng.standard_normal((3, 5, 7))
    b = rng.standard_normal((3, 7, 4)) + 1j * rng.standard_normal((3, 7, 4))
    for conj in (False, True):
        want = np.matmul(a.conj() if conj else a, b)
        assert np.allclose(pk.three_real(np, a, b, conj), want, rtol=1e-13, atol=1e-13)
        assert np.allclose(pk.interleaved(np, a, b, conj), want, rtol=1e-13, atol=1e-13)
    # the pairwise steps of pass 1's path as batched products (batch, m, k, n)
    eq, _ = pk.equations(2)
    steps = pk.gemms(eq, (8, 4, 6), (8, 2, 1), (4, 5, 2, 3), (6, 7, 3, 1))
    assert steps and all(len(s) == 4 and min(s) >= 1 for s in steps)


@pytest.mark.timeout(120)
def test_the_loop_watch_writes_down_what_a_stalled_loop_waits_in():
    """The benchmarks' event-loop watch on a worker: a loop held for 0.3 s (a function run
    on it) is one stall, and faulthandler's dump names what held it."""
    import time

    from distributed import Client, LocalCluster
    from tools.transfers import WatchWorker

    def hold_the_loop():
        time.sleep(0.3)

    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        client.register_plugin(WatchWorker())
        for _ in range(3):  # a loaded machine (the suite's other process) may lose one
            client.run(lambda dask_worker: dask_worker.plugins[WatchWorker.name].reset())
            time.sleep(0.2)  # ticks: each arms the watchdog anew
            client.run(hold_the_loop)  # runs on the worker's event loop
            (loop,) = client.run(
                lambda dask_worker: dask_worker.plugins[WatchWorker.name].loop.read()).values()
            if any(b - a >= 0.25 for a, b in loop["stalls"]):
                break
    assert any(b - a >= 0.25 for a, b in loop["stalls"]), loop["stalls"]
    stacks = loop["stall_stacks"]
    assert stacks["dumps"] >= 1
    assert any("hold_the_loop" in where for where, _ in stacks["loop"]), stacks


def test_the_ladder_keeps_the_runs_own_plan_lines():
    """A rung records what its run logged on the client (its plan as decided then);
    the logger's level is put back after."""
    import logging

    from bench_memory_ladder import _RunLog
    from problems import tiny_stack

    import src_dask

    logger = logging.getLogger("src_dask")
    before = logger.level
    with _RunLog() as run_log:
        src_dask.src(*tiny_stack(2), chi_out=4, seed=0)
    assert "src: seed 0" in run_log.lines
    assert any(line.startswith("src: SRC plan") for line in run_log.lines), run_log.lines
    assert logger.level == before and run_log not in logger.handlers


def test_the_ladders_worker_plugin_prints_src_dasks_info_lines_and_puts_back(capsys):
    """On the worker the ladder's plugin keeps the warnings and prints src_dask's INFO
    lines to stderr (the ladder's log, which outlasts a worker that dies); teardown
    puts the logger back as it was."""
    import logging

    from bench_memory_ladder import WorkerWarnings

    logger = logging.getLogger("src_dask")
    level, handlers = logger.level, list(logger.handlers)
    plugin = WorkerWarnings()
    plugin.setup(worker=None)
    try:
        logger.info("spilled 1 GB of stored data (test)")
        logger.warning("site 3: computing it in pieces of 2 (test)")
    finally:
        plugin.teardown(worker=None)
    err = capsys.readouterr().err
    assert "worker src_dask INFO spilled 1 GB" in err and "pieces of 2" in err
    assert plugin.read() == ["site 3: computing it in pieces of 2 (test)"]
    assert logger.level == level and logger.handlers == handlers


def test_the_ladders_table_says_what_running_out_of_memory_cost(capsys):
    """Each rung's table row carries its worker's memory events (halved steps, seconds
    waited, rows in turn, rescheduled tasks), "-" where the worker could not say."""
    from bench_memory_ladder import report

    record = {"runs": {
        "cap3": {"seconds": 250.0, "memory_events": {"halved": 12, "waited_s": 3.5,
                                                     "turns": 4, "rescheduled": 1}},
        "cap2": {"failed": "MemoryError: site 4, ..."}}}
    report(record)
    out = capsys.readouterr().out
    assert "halved/waited s/turns/rescheduled" in out
    assert "12/3.5/4/1" in out
    assert out.rstrip().splitlines()[-1].rstrip().endswith("-")
