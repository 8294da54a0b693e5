"""The mutation check (``make test-mutants``; CI runs it): small deliberate defects in
the core, each applied to a scratch copy of ``src/`` and required to make the fast
tests that name what it breaks fail. A defect that no test notices is a gap in the
suite; add the test, then the defect here. The list grows with every defect found.

    python tests/mutants.py            # all, then a table; exit 1 if one survives
    python tests/mutants.py --list     # the mutants
    python tests/mutants.py -k resume  # those whose name has "resume"

Each mutant is one exact replacement (it must occur once: a stale mutant is an error,
not a pass). The tests run against the scratch copy (``PYTHONPATH``), first once on
the unchanged copy, so that a failing environment is not taken for a caught defect.
"""
# ruff: noqa: T201

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str  # what the defect breaks
    path: str  # the module, under src/src_dask
    old: str
    new: str
    tests: tuple[str, ...]  # pytest arguments: files, node ids, -k expressions


MUTANTS = (
    Mutant("kernels: the environment update forgets the conjugate", "_kernels.py",
           "matmul(flat[:, lo:hi], zt, conj_a=True,", "matmul(flat[:, lo:hi], zt, conj_a=False,",
           ("tests/test_exact.py",)),
    Mutant("kernels: three real products lose the cross term", "_kernels.py",
           "        t3 -= t12[1]\n", "        pass\n",
           ("tests/test_three_real.py",)),
    Mutant("kernels: three real products on the CPU forget a plane's sum", "_kernels.py",
           "    pa[0] += pa[1]\n", "    pass\n",
           ("tests/test_three_real.py",)),
    Mutant("kernels: three real products ignore the conjugate", "_kernels.py",
           "    pa, pb = _planes(xp, a, conj_a), _planes(xp, b, False)",
           "    pa, pb = _planes(xp, a, False), _planes(xp, b, False)",
           ("tests/test_three_real.py",)),
    Mutant("kernels: an interleaved product ignores the conjugate", "_kernels.py",
           "        w[..., 1, :, 0] = b.imag\n        w[..., 1, :, 1] = -b.real\n",
           "        w[..., 1, :, 0] = -b.imag\n        w[..., 1, :, 1] = b.real\n",
           ("tests/test_interleaved.py",)),
    Mutant("kernels: an interleaved product drops the imaginary parts' cross terms",
           "_kernels.py", "        w[..., 1, :, 0] = -b.imag\n        w[..., 1, :, 1] = b.real\n",
           "        w[..., 1, :, 0] = 0\n        w[..., 1, :, 1] = b.real\n",
           ("tests/test_interleaved.py",)),
    Mutant("plan: pieces made by cuBLAS's 3M counted with planes they do not have",
           "_kernels.py",
           "    return three_real(dtype, device) and not (device == \"gpu\" and rows <= "
           "CUBLAS_3M_SIDE)",
           "    return three_real(dtype, device)",
           ("tests/test_three_real.py", "-k", "plan_counts")),
    Mutant("kernels: a batched product goes to cuBLAS's 3M, which makes one product",
           "_kernels.py", "    if (device == \"gpu\" and not batched and k >= THREE_REAL_MIN",
           "    if (device == \"gpu\" and k >= THREE_REAL_MIN",
           ("tests/test_three_real.py", "-k", "cublas")),
    Mutant("sketch: a column's draws depend on where its block starts", "_random.py",
           "columns = np.arange(start, stop, dtype=np.uint64)",
           "columns = np.arange(0, stop - start, dtype=np.uint64)",
           ("tests/test_sketch.py",)),
    Mutant("QR: the CPU basis loses its positive-diagonal gauge", "_kernels.py",
           "        q = _positive_diagonal(q, r)\n    else:", "        pass\n    else:",
           ("tests/test_sketch.py", "-k", "gauge")),
    Mutant("QR: a rejected guess of the basis keeps its update and projection", "_kernels.py",
           "        ahead.on = better is None\n        if better is not None:",
           "        ahead.on = better is None\n        if False:",
           ("tests/test_basis_ahead.py", "-k", "fails")),
    Mutant("plan: the projection's model forgets its intermediates", "_kernels.py",
           "return (s_row + z_row + 2 * biggest + extra) * dtype",
           "return (s_row + z_row + extra) * dtype",
           ("tests/test_plan.py", "-k", "measured_peak")),
    Mutant("plan: environments the device cannot keep stay on it", "_plan.py",
           "        if kept > budget:\n            return j",
           "        if kept > budget:\n            return 0",
           ("tests/test_plan.py", "-k", "crowd or record or keeps")),
    Mutant("plan: pass 1's chains run free of their barrier", "_graph/pass1.py",
           "after = barriers.get((j - _LAG,", "after = barriers.get((j + n,",
           ("tests/test_graph.py", "-k", "shape_per_site")),
    Mutant("estimate: a GPU worker's pinned reads are not counted", "_estimate.py",
           "return 2 * inputs_in_flight(stack, lookahead)",
           "return 0 * inputs_in_flight(stack, lookahead)",
           ("tests/test_estimate.py", "-k", "pinned")),
    Mutant("run store: a resume takes the caller's chunk, not the store's", "_api.py",
           "plan = dataclasses.replace(plan, chunk=chunk, key=",
           "plan = dataclasses.replace(plan, chunk=plan.chunk, key=",
           ("tests/test_store.py", "-k", "another_chunk")),
    Mutant("run store: the disk estimate drops the environments", "_runstore.py",
           "return (envs + s_env + cores) * item", "return (s_env + cores) * item",
           ("tests/test_store.py", "-k", "planned_bytes")),
    Mutant("checksums: a chunk whose CRC32C does not match is read anyway", "_integrity.py",
           'if _crc32c(target) != int.from_bytes(tail, "little"):', "if False:",
           ("tests/test_save_open_safety.py", "-k", "damaged")),
    Mutant("lock: a second run takes a store's lock over the first's", "_lock.py",
           "os.O_CREAT | os.O_EXCL | os.O_WRONLY", "os.O_CREAT | os.O_WRONLY",
           ("tests/test_runstore_safety.py", "-k", "lock or second_process")),
    Mutant("overwrite: a directory that is not a train may be replaced", "storage.py",
           "    if not _is_train(target):\n        raise PathRefusedError",
           "    if False:\n        raise PathRefusedError",
           ("tests/test_save_open_safety.py", "-k", "not_a_train")),
    Mutant("distance: a product's norm is remembered whatever its factors", "_overlap.py",
           "    return dask.base.tokenize([(f.train.kind, f.transpose, list(f.train))",
           "    return dask.base.tokenize([(f.train.kind, f.transpose)",
           ("tests/test_results.py", "-k", "norm_once")),
    Mutant("one task: a run of any size is one task", "_api.py",
           "    if total > bound:  # then only where the graph would not be faster (at 0: never)",
           "    if False:",
           ("tests/test_cluster.py", "-k", "one_task")),
    Mutant("OOM: later tasks forget the size that fitted", "_oom.py",
           "hi = min(b, lo + _FITS.get(key, b - a))", "hi = b",
           ("tests/test_oom.py", "-k", "keeps_the_split")),
    Mutant("OOM: an allocation that meets a full pool spills nothing before it fails",
           "_oom.py", "        if (_collect_garbage() or _spill_device_data(nbytes) > 0",
           "        if (_collect_garbage() or False",
           ("tests/test_oom.py", "-k", "spilling_for_an_allocation")),
    Mutant("OOM: every run wraps the worker's RMM resource once more", "_oom.py",
           "    if any(isinstance(r, rmm.mr.FailureCallbackResourceAdaptor) for r in chain):",
           "    if False:",
           ("tests/test_oom.py", "-k", "wrapped_again or allocations_spill_before")),
    Mutant("OOM: an allocation on the worker's event loop finds no data to spill",
           "_oom.py", "        return _WORKER() if _WORKER is not None else None",
           "        return None", ("tests/test_oom.py", "-k", "event_loop")),
    Mutant("OOM: a value that cannot be spilled stops the spilling", "_oom.py",
           "            log.info(\"could not spill %s from the device: %s: %s\", key, "
           "type(err).__name__,", "            break\n            log.info(\"%s %s %s\", key, "
           "type(err).__name__,", ("tests/test_oom.py", "-k", "cannot_be_spilled")),
    Mutant("OOM: a split step's allocations wait for other tasks instead of failing",
           "_oom.py", "    if getattr(_THREAD, \"splits\", 0) or not _others_running(getattr(",
           "    if not _others_running(getattr(", ("tests/test_oom.py", "-k", "waits_for_running")),
    Mutant("OOM: rows that each hold part of their memory wait for each other", "_oom.py",
           "_others_running(getattr(_THREAD, \"row\", None))", "_others_running()",
           ("tests/test_oom.py", "-k", "take_turns")),
    Mutant("OOM: a row that did not fit beside the others is not tried in turn", "_oom.py",
           "    with _marked(\"queued\"):\n        _TURN.acquire()",
           "    raise MemoryError(\"no turn\")",
           ("tests/test_oom.py", "-k", "take_turns")),
    Mutant("OOM: a row that never fits beside other tasks fails the run", "_oom.py",
           "        if tries > RESCHEDULES:", "        if True:",
           ("tests/test_oom.py", "-k", "gives_its_memory_back")),
    Mutant("OOM: a rescheduled task's memory waits for Python's garbage collector",
           "_oom.py", "    if not _GIVEN_BACK or (not at_once and",
           "    if True or (not at_once and",
           ("tests/test_oom.py", "-k", "in_a_cycle")),
    Mutant("OOM: a given-back task's frames wait for the event loop and the collector",
           "_oom.py", "    _clear_given_back_frames()\n", "",
           ("tests/test_oom.py", "-k", "before_the_event_loop")),
    Mutant("OOM: clearing a given-back task's frames closes a suspended generator",
           "_oom.py", "            if not tb.tb_frame.f_code.co_flags & _SUSPENDABLE:",
           "            if True:", ("tests/test_oom.py", "-k", "suspended_generator")),
    Mutant("OOM: the pieces of a cut step split their operands into planes again",
           "_oom.py", '    return getattr(_THREAD, "piece", False)', "    return False",
           ("tests/test_oom.py", "-k", "natively")),
    Mutant("OOM: a projection cut into rows copies its cores for every piece",
           "_graph/tasks.py", "                laid = K.laid_out_for_rows(self._cores, self._env)",
           "                laid = self._cores", ("tests/test_oom.py", "-k", "lays_its_cores")),
    Mutant("OOM: projections of the same cores at once each lay them out", "_graph/tasks.py",
           "                entry = self._shared.get(key)", "                entry = None",
           ("tests/test_oom.py", "-k", "share_one_layout")),
    Mutant("OOM: a task's environment sum makes a new array for every block",
           "_graph/tasks.py", "out=out, site=site, run=run, in_place=True)",
           "out=out, site=site, run=run)",
           ("tests/test_plan.py", "-k", "added_in_place")),
    Mutant("OOM: spilling moves the inputs of running tasks first", "_oom.py",
           " + [k for k in order if k in in_use]:", ":  # mutant",
           ("tests/test_oom.py", "-k", "inputs_of_running")),
    Mutant("OOM: asking whether a worker holds a spilled key loads it to the device",
           "_oom.py", "    data.__class__ = _ANSWERING[cls]", "    pass",
           ("tests/test_oom.py", "-k", "spilled_key")),
    Mutant("facts: a plugin dask-cuda cannot pickle hides the worker's RMM pool",
           "_cluster.py", "        return _read_cuda_config(dask_worker)",
           "        return {}", ("tests/test_cluster.py", "-k", "cannot_read")),
    Mutant("OOM: a copy to a full device gives up at once", "_oom.py",
           "            if time.monotonic() >= deadline:", "            if True:",
           ("tests/test_oom.py", "-k", "waits_for_memory")),
    Mutant("reproject: a plan that projects cores many times keeps quiet", "_api.py",
           "    if flops[0] > REPROJECT_WARNING * flops[1]:", "    if False:",
           ("tests/test_plan.py", "-k", "many_times")),
    Mutant("cut sums: S_{j-1} summed once per row block of Z_{j-1}, not per group",
           "_plan.py", "        env = [1 if pass2.split else env_blocks(stack, plan, j)",
           "        env = [1 if pass2.split else env_blocks(stack, plan, j) * 0 + (\n"
           "               z_blocks(stack, plan, j - 1) if j and env_blocks(stack, plan, j) > 1\n"
           "               else 1)",
           ("tests/test_plan.py", "-k", "many_times")),
    Mutant("cut sums: a row block of Z projected from the wrong rows of its group's S_j",
           "_kernels.py", "    return lo + first, lo + last", "    return first, last",
           ("tests/test_graph.py", "-k", "twice or row_blocks")),
    Mutant("reproject: a projected core the device cannot keep is kept", "_plan.py",
           "    return plan.reproject and site > 0", "    return False",
           ("tests/test_plan.py", "-k", "projected_twice")),
    Mutant("reproject: a sum of S projects the wrong rows of S_j", "_graph/tasks.py",
           "z = project(cores, s, rows=s_rows, site=site, run=run)",
           "z = project(cores, s, rows=None, site=site, run=run)",
           ("tests/test_graph.py", "-k", "made_twice")),
    Mutant("read ahead: a GPU worker with little host memory reads 8 sites ahead",
           "_plan.py", "    return None if fits >= default else max(1, fits)",
           "    return None",
           ("tests/test_plan.py", "-k", "fewer_sites")),
    Mutant("disk: environments host memory cannot keep stay in it", "_api.py",
           "    if not plan.host_envs or facts.keep is None or _fetched_everywhere(plan, facts):",
           "    if True:",
           ("tests/test_plan.py", "-k", "go_to_disk")),
    Mutant("plan: the blocks of a cut environment sum each take every thread's share",
           "_plan.py", 'kind == "update" and not cut else 1', 'kind == "update" else 1',
           ("tests/test_plan.py", "-k", "every_threads_share")),
    Mutant("disk: a CPU worker keeps environments Dask would spill", "_api.py",
           "        disk = _cpu_disk_envs(stack, plan, facts)\n", "        disk = 0\n",
           ("tests/test_plan.py", "-k", "cpu_run_writes")),
    Mutant("disk: a CPU run's fetch reads an environment back as for a device", "_graph/tasks.py",
           'return _transfer.from_disk(x, device=device == "gpu")',
           "return _transfer.from_disk(x, device=True)",
           ("tests/test_graph.py", "-k", "cpu_run_writes")),
    Mutant("disk: an environment file cut short is read anyway", "_transfer.py",
           "    if got != d.nbytes:", "    if got > d.nbytes:",
           ("tests/test_graph.py", "-k", "cut_short")),
    Mutant("wait: a GPU wait's polls grow sparse from its start", "_transfer.py",
           "        if time.perf_counter() > fine_until:", "        if True:",
           ("tests/test_graph.py", "-k", "polls_finely")),
    Mutant("pinned: a copied staging buffer is held until its own thread copies again",
           "_transfer.py", "    _release_copied()\n    return _pinned", "    return _pinned",
           ("tests/test_graph.py", "-k", "staging_buffer")),
    Mutant("pinned: a new block is made inside the pool's lock", "_pinned.py",
           "            block = self._make(size)\n",
           "            with self._lock:\n                block = self._make(size)\n",
           ("tests/test_graph.py", "-k", "pinned_block")),
    Mutant("pinned: a block is faulted in past the host's free memory", "_pinned.py",
           "            if _available() < size + _HEADROOM:  # the spare",
           "            if False:  # the spare",
           ("tests/test_graph.py", "-k", "free_memory")),
    Mutant("pinned: a block is page-locked before its pages are faulted in", "_pinned.py",
           "            if lib.madvise(ptr, size, _MADV_POPULATE_WRITE) != 0:",
           "            if False:",
           ("tests/test_graph.py", "-k", "pinned_block")),
    Mutant("wait: a GPU wait blocks in the driver beside a worker's loop", "_transfer.py",
           "    if not _beside_an_event_loop():", "    if True:",
           ("tests/test_graph.py", "-k", "polls_an_event")),
    Mutant("wait: a one-task run's GPU waits poll beside an idle loop", "_transfer.py",
           "    return (not _alone and distributed", "    return (distributed",
           ("tests/test_graph.py", "-k", "polls_an_event")),
    Mutant("send: inputs sent ahead of a one-task run ride in its task too",
           "_graph/builder.py", "            if id(x) in self.sent:", "            if False:",
           ("tests/test_cluster.py", "-k", "once_ahead")),
    Mutant("one task: a GPU worker's one task splits the sketch per thread", "_api.py",
           '    slots = 1 if plan.device == "gpu" else max(1, facts.threads)',
           "    slots = max(1, facts.threads)",
           ("tests/test_cluster.py", "-k", "one_block")),
    Mutant("pool: the plan forgets that an RMM pool grows", "_estimate.py",
           "    if not start or not most or start >= most:", "    if True:",
           ("tests/test_estimate.py", "-k", "rmm_pool")),
    Mutant("persist: a persisted result comes back to the client", "_api.py",
           "    persist = persist and client is not None and run is None",
           "    persist = False",
           ("tests/test_cluster.py", "-k", "persisted")),
    Mutant("heap: a CPU task's freed heap stays in the worker", "_graph/tasks.py",
           "            _Heap.libc.malloc_trim(0)\n", "",
           ("tests/test_graph.py", "-k", "heap")),
    Mutant("one task: the run keeps one BLAS thread", "_graph/tasks.py",
           "    with threadpool_limits(limits=threads):", "    with threadpool_limits(limits=1):",
           ("tests/test_graph.py", "-k", "one_task")),
    Mutant("plan: pass 2 on the first worker forgets the blocks fetched to it",
           "_estimate.py", "    if others is None or ahead is None:", "    if True:",
           ("tests/test_estimate.py", "-k", "fetched")),
    Mutant("inputs: a random core's imaginary part drawn from the real part's seeds",
           "problems.py", "        im = seeds.spawn(len(blocks)) if dtype.kind",
           "        im = re if dtype.kind",
           ("tests/test_problems.py", "-k", "draws")),
    Mutant("plan: one task on a GPU worker past what it keeps on the device", "_api.py",
           "        budget = min(budget, facts.device_limit)", "        pass",
           ("tests/test_plan.py", "-k", "one_gpu_worker")),
    Mutant("shared memory: a short file read as if whole", "_shared.py",
           "        if size != d.nbytes:", "        if size < 0:",
           ("tests/test_shared.py", "-k", "short")),
    Mutant("shared memory: a call's files left behind when it ends", "_shared.py",
           "        _remove(os.path.basename(prefix))", "        pass",
           ("tests/test_shared.py", "-k", "removes_its_files or interrupted")),
    Mutant("shared memory: an outbox writes after its call ended", "_shared.py",
           "        if not os.path.exists(self.marker):  # ended meanwhile",
           "        if False:  # ended meanwhile",
           ("tests/test_shared.py", "-k", "ends_while_it_writes")),
    Mutant("shared memory: the worker's view of an input writable", "_shared.py",
           "        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)",
           "        prot = mmap.PROT_READ | mmap.PROT_WRITE",
           ("tests/test_shared.py", "-k", "read_only")),
    Mutant("shared memory: a worker maps its inputs all at the start", "_graph/builder.py",
           "            self.tasks[key] = (partial(tasks.read_shared, sent), after)",
           "            self.tasks[key] = (partial(tasks.read_shared, sent), None)",
           ("tests/test_shared.py", "-k", "where_and_when")),
    Mutant("shared memory: one worker maps an input for all of them", "_graph/builder.py",
           "_mapped[id(x), group] = key if group is None else self.pin(key, group)",
           "_mapped[id(x), group] = key",
           ("tests/test_shared.py", "-k", "where_and_when")),
    Mutant("shared memory: a taken result copied page by page", "_shared.py",
           "        flags = mmap.MAP_SHARED | (_POPULATE if writable else 0)",
           "        flags = mmap.MAP_PRIVATE | _POPULATE if writable else mmap.MAP_SHARED",
           ("tests/test_shared.py", "-k", "not_a_copy")),
    Mutant("shared memory: files of live processes taken for stale", "_shared.py",
           "            if not (name.startswith(_PREFIX) and pid.isdigit()) or _alive(int(pid)):",
           "            if not (name.startswith(_PREFIX) and pid.isdigit()):",
           ("tests/test_shared.py", "-k", "gone")),
)


def _scratch(where: Path) -> Path:
    """A copy of ``src/`` under ``where``; its path for PYTHONPATH."""
    shutil.copytree(ROOT / "src", where / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return where / "src"


def _run_tests(src: Path, tests: tuple[str, ...], timeout: float) -> tuple[bool, str]:
    """Whether the tests pass against ``src``; the end of their output."""
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                               "-p", "no:xdist", *tests], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:g} s"
    return done.returncode == 0, (done.stdout + done.stderr)[-1500:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-k", default="", help="only the mutants whose name contains this")
    p.add_argument("--list", action="store_true")
    p.add_argument("--timeout", type=float, default=600, help="per test run, seconds")
    args = p.parse_args(argv)
    chosen = [m for m in MUTANTS if args.k in m.name]
    if args.list:
        for m in chosen:
            print(f"{m.name}  [{m.path}; {' '.join(m.tests)}]")
        return 0
    rows, bad = [], 0
    with tempfile.TemporaryDirectory(prefix="src_dask_mutants_") as tmp:
        clean = _scratch(Path(tmp) / "clean")
        for m in chosen:
            passed, out = _run_tests(clean, m.tests, args.timeout)
            if not passed:
                print(f"the tests of '{m.name}' fail on the unchanged code:\n{out}")
                return 2
        for i, m in enumerate(chosen):
            src = _scratch(Path(tmp) / f"m{i}")
            module = src / "src_dask" / m.path
            text = module.read_text()
            if text.count(m.old) != 1:
                rows.append((m.name, f"STALE: found {text.count(m.old)} times"))
                bad += 1
                continue
            module.write_text(text.replace(m.old, m.new))
            start = time.monotonic()
            passed, out = _run_tests(src, m.tests, args.timeout)
            took = time.monotonic() - start
            rows.append((m.name, f"{'SURVIVED' if passed else 'caught'} ({took:.0f} s)"))
            if passed:
                bad += 1
                print(f"'{m.name}' survived {' '.join(m.tests)}:\n{out}")
    width = max(len(name) for name, _ in rows)
    for name, result in rows:
        print(f"{name:<{width}}  {result}")
    print(f"{len(rows) - bad} of {len(rows)} mutants caught")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
