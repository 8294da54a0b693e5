"""An out-of-core MPO·MPS product: inputs in Zarr, a run store, a memory-limited cluster.

    python examples/out_of_core.py        # seconds, in a temporary directory
    python examples/out_of_core.py --dir run1 --sites 40 --bond 256 --chi-out 256 \\
        --memory-limit 600MiB             # 76 MiB of inputs, 606 MiB of run store
    python examples/out_of_core.py --dir run2 --sites 50 --bond 1000 --chi-out 1000 \\
        --oversample 0 --memory-limit 2GiB --no-check   # 1.6 GB in, 3.1 GB of environments

What it does, and why:

1. *Generate* a random MPO A (bond ``--mpo-bond``) and MPS x (bond ``--bond``)
   directly into Zarr, one site at a time, with ``src_dask.save`` of lazy Dask
   arrays: every core is written chunk by chunk, so the inputs are never held
   in memory. Bond index k of every core is weighted by e^{-decay·k/bond}, so
   the product is compressible and a truncated result has a meaningful error.
2. *Open* them with ``src_dask.open``: TensorTrains of Dask arrays, no data read.
3. *Run* ``src_dask.apply(A, x, chi_out, store=DIR/run.zarr)`` on a
   ``LocalCluster`` whose workers have a memory limit. The sketched
   environments go to the run store as they are made, so the workers' memory
   stays bounded whatever the size; the script prints each worker's peak memory.
4. The result is a TensorTrain of *Dask arrays over the store's* ``result/site_j``.
   Calling ``src`` again returns the finished run without work (``complete`` is
   set in the store); after an interruption (Ctrl-C, a lost job), rerunning the
   same command with the same ``--dir`` resumes where the run stopped.
5. *Check* the result without forming the product: ⟨y|Ax⟩, ‖y‖ and ‖Ax‖ are
   contracted site by site, streaming the cores from Zarr, giving the relative
   error ‖y - Ax‖/‖Ax‖ (accurate to ~1e-8: it is a difference of squares) and
   the infidelity 1 - |⟨y|Ax⟩|/(‖y‖‖Ax‖). For small problems it also compares
   with the optimal (SVD) truncation of the exact product, made by quimb.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import dask
import numpy as np
from distributed.diagnostics.plugin import WorkerPlugin

import src_dask
from src_dask import TensorTrain, problems


# -- 1. generating the inputs straight into Zarr --------------------------------------------
def random_train(kind: str, n: int, bond: int, phys: int, decay: float, seed: int,
                 dtype=np.complex128) -> TensorTrain:
    """A random MPS or MPO of lazy Dask cores in quimb's layout (nothing computed),
    from :mod:`src_dask.problems`: complex Gaussians, the right-bond index k weighted
    by e^{-decay·k/bond}, each core scaled so that the norm (of the MPS, or of the
    MPO applied to a vector) stays of order one along the chain.
    """
    make = problems.random_mps if kind == "mps" else problems.random_mpo
    return make(n, bond, phys, dtype=dtype, seed=seed, decay=math.exp(-decay / bond))


def generate(inputs: Path, args: argparse.Namespace) -> float:
    """Write A and x to ``inputs/A`` and ``inputs/x`` unless the same ones are there.

    Returns the seconds spent (0 when reused). ``params.json`` is written last,
    so an interrupted generation is redone, never reused half-written.
    """
    params = {k: getattr(args, k) for k in ("sites", "bond", "mpo_bond", "decay", "seed")}
    marker = inputs / "params.json"
    if marker.exists() and json.loads(marker.read_text()) == params:
        return 0.0
    t0 = time.perf_counter()
    mpo = random_train("mpo", args.sites, args.mpo_bond, 2, args.decay, args.seed)
    mps = random_train("mps", args.sites, args.bond, 2, args.decay, args.seed + 1)
    with dask.config.set(scheduler="threads"):  # a few chunks in memory at a time
        src_dask.save(mpo, inputs / "A", overwrite=True)
        src_dask.save(mps, inputs / "x", overwrite=True)
    marker.write_text(json.dumps(params))
    return time.perf_counter() - t0


# -- 5. checking without forming the product --------------------------------------------
def _padded(core, j: int, n: int) -> np.ndarray:
    """One core read into memory, with size-1 end bonds: (l, r, ...)."""
    a = np.asarray(core)
    if j == 0:
        a = a[None]
    if j == n - 1:
        a = a[:, None]
    return a


def overlap(bra: TensorTrain, ops: list[tuple[TensorTrain, bool]], ket: TensorTrain
            ) -> tuple[complex, float]:
    """⟨bra| O_1 O_2 … |ket⟩ for MPOs ``ops`` = [(train, adjoint), …], streamed site by site.

    Only one site of each train is in memory at a time. The environment is
    rescaled at every site to avoid over- or underflow on long chains, so the
    value is returned as ``(mantissa, log)``: value = mantissa · e^log.
    """
    n = len(ket)
    env = np.ones((1,) * (len(ops) + 2), dtype=complex)  # (bra, op_1 … op_k, ket) bonds
    log = 0.0
    for j in range(n):
        # env (a, b_1…b_k, c) · bra* (a, A, p) -> (b_1…b_k, c, A, p)
        t = np.tensordot(env, _padded(bra[j], j, n).conj(), axes=([0], [0]))
        for train, adjoint in ops:  # contract (b_i, p) with (l, up): appends (B_i, down)
            op = _padded(train[j], j, n)
            op = op.conj().transpose(0, 1, 3, 2) if adjoint else op
            t = np.tensordot(t, op, axes=([0, t.ndim - 1], [0, 2]))
        env = np.tensordot(t, _padded(ket[j], j, n), axes=([0, t.ndim - 1], [0, 2]))
        scale = float(np.abs(env).max()) or 1.0
        env, log = env / scale, log + math.log(scale)
    return complex(env.reshape(())), log


def check(y: TensorTrain, a: TensorTrain, x: TensorTrain) -> dict:
    """Relative error and infidelity of ``y ≈ A·x`` from three streamed overlaps."""
    yax, l_yax = overlap(y, [(a, False)], x)
    yy, l_yy = overlap(y, [], y)
    axax, l_axax = overlap(x, [(a, True), (a, False)], x)
    # everything relative to ‖Ax‖²
    r_yy = yy.real * math.exp(l_yy - l_axax) / axax.real
    r_yax = yax * math.exp(l_yax - l_axax) / axax.real
    err2 = r_yy - 2 * r_yax.real + 1
    return {
        "rel_error": math.sqrt(max(err2, 0.0)),
        "infidelity": max(0.0, 1 - abs(r_yax) / math.sqrt(r_yy)),
        "log_norm_ax": 0.5 * (l_axax + math.log(axax.real)),
    }


def svd_reference(a: TensorTrain, x: TensorTrain, chi_out: int) -> float:
    """Relative error of the SVD truncation of the exact A·x to ``chi_out`` (quimb),
    the best a compression to that bond can do, up to the sweep's own quasi-optimality."""
    import quimb.tensor as qtn

    exact = qtn.MatrixProductState([np.asarray(c) for c in src_dask.trains.exact_product(a, x)],
                                   shape="lrp")
    best = exact.copy()
    best.compress(max_bond=chi_out, cutoff=0.0)
    return float(abs((best - exact).norm()) / abs(exact.norm()))


# -- 3. the run ---------------------------------------------------------------------------
class _PeakMemory(WorkerPlugin):
    """Each worker's peak resident memory, sampled every 5 ms (a worker plugin)."""

    name = "peak-memory"

    def setup(self, worker):
        import psutil

        self.peak, proc = 0, psutil.Process()

        def sample():
            while True:
                self.peak = max(self.peak, proc.memory_info().rss)
                time.sleep(0.005)

        threading.Thread(target=sample, daemon=True).start()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", default=None,
                   help="working directory for the inputs and the run store; rerun with the "
                        "same --dir to resume (default: a temporary directory, removed at the end)")
    p.add_argument("--sites", type=int, default=16, help="sites (default 16)")
    p.add_argument("--bond", type=int, default=32, help="bond of the MPS x (default 32)")
    p.add_argument("--mpo-bond", type=int, default=4, help="bond of the MPO A (default 4)")
    p.add_argument("--chi-out", type=int, default=32, help="bond of the result (default 32)")
    p.add_argument("--oversample", default="auto", help="an int >= 0 or 'auto' (default)")
    p.add_argument("--decay", type=float, default=4.0,
                   help="bond index k weighted by exp(-decay k / bond) (default 4)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--threads", type=int, default=1, help="threads per worker (default 1)")
    p.add_argument("--memory-limit", default="1GiB", help="per worker (default 1GiB)")
    p.add_argument("--chunk", type=int, default=None,
                   help="sketch columns per block (default: src_dask's choice)")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs and the sketch")
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="check y against A·x by streamed overlaps (default: yes; it costs "
                        "about mpo-bond times the run itself)")
    p.add_argument("--reference", choices=("auto", "yes", "no"), default="auto",
                   help="compare with quimb's SVD truncation of the exact product "
                        "(auto: when its bond is at most 512 and quimb is installed)")
    args = p.parse_args(argv)
    if args.oversample != "auto":
        args.oversample = int(args.oversample)
    return args


def main(argv: list[str] | None = None) -> dict:
    """Generate, run, rerun and check; print what happens and return the numbers."""
    args = parse_args(argv)
    out = sys.stdout.write
    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="src_dask_ooc_"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        return _run(args, workdir, out)
    finally:
        if not args.dir:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(args: argparse.Namespace, workdir: Path, out) -> dict:
    from distributed import Client, LocalCluster

    t_gen = generate(workdir / "inputs", args)
    a, x = src_dask.open(workdir / "inputs" / "A"), src_dask.open(workdir / "inputs" / "x")
    out(f"inputs in {workdir / 'inputs'} ("
        + (f"generated in {t_gen:.1f} s" if t_gen else "reused") + "):\n"
        f"  A: {_describe(a)}\n  x: {_describe(x)}\n"
        f"  {(a.nbytes + x.nbytes) / 2**20:.1f} MiB on disk; opened as "
        f"{type(x[1]).__module__}.{type(x[1]).__name__} cores (nothing read yet)\n")

    store = workdir / "run.zarr"
    options = {"chi_out": args.chi_out, "oversample": args.oversample, "seed": args.seed,
               "chunk": args.chunk, "store": store}
    with LocalCluster(n_workers=args.workers, threads_per_worker=args.threads,
                      memory_limit=args.memory_limit, dashboard_address=":0",
                      local_directory=str(workdir / "dask-scratch")) as cluster, \
            Client(cluster) as client:
        client.register_plugin(_PeakMemory())
        out(f"cluster: {args.workers} workers × {args.threads} thread(s), memory limit "
            f"{args.memory_limit} each; dashboard {client.dashboard_link}\n")

        status = _store_status(store)
        if status:
            out(f"{store} exists: {status}\n")
        t0 = time.perf_counter()
        y = src_dask.apply(a, x, client=client, **options)
        t_run = time.perf_counter() - t0
        peaks = client.run(lambda dask_worker: dask_worker.plugins["peak-memory"].peak)

        t0 = time.perf_counter()
        again = src_dask.apply(a, x, client=client, **options)  # the finished run, no work
        t_again = time.perf_counter() - t0

    import zarr

    attrs = dict(zarr.open_group(store, mode="r").attrs)
    same = all(np.array_equal(np.asarray(c), np.asarray(c2)) for c, c2 in zip(y, again,
                                                                              strict=True))
    out(f"\nsrc: {t_run:.1f} s -> {_describe(y)}\n"
        f"  result cores: {type(y[0]).__module__}.{type(y[0]).__name__} over "
        f"{store}/result/site_j\n"
        f"  store: complete={attrs['complete']}, sketch {attrs['sketch']} columns in blocks "
        f"of {attrs['chunk']}, {attrs['bytes_planned'] / 2**20:.1f} MiB planned on disk\n"
        f"  peak worker memory: {', '.join(f'{p / 2**20:.0f} MiB' for p in peaks.values())} "
        f"(limit {args.memory_limit})\n"
        f"calling src again: {t_again:.2f} s, the finished run (same cores: {same})\n")

    res = {}
    if args.check:
        t0 = time.perf_counter()
        res = check(y, a, x)
        out(f"\ncheck (streamed overlaps, {time.perf_counter() - t0:.1f} s): "
            f"‖y - Ax‖/‖Ax‖ = {res['rel_error']:.2e}, 1 - fidelity = {res['infidelity']:.2e}\n")
    exact_bond = args.bond * args.mpo_bond
    if args.reference == "yes" or (args.reference == "auto" and exact_bond <= 512
                                   and _has_quimb()):
        res["svd_error"] = svd_reference(a, x, args.chi_out)
        out(f"SVD truncation of the exact product (bond {exact_bond}) to {args.chi_out}: "
            f"{res['svd_error']:.2e}")
        if "rel_error" in res and res["svd_error"] > 0:
            out(f"; src_dask / SVD = {res['rel_error'] / res['svd_error']:.2f}")
        out("\n")
    res.update(t_run=t_run, t_again=t_again, same=same, complete=attrs["complete"],
               peaks=peaks, result=y, store=store)
    return res


def _store_status(store: Path) -> str | None:
    """What a run store left by an earlier call holds (its layout is documented and
    readable with plain zarr), or None where there is none."""
    import zarr

    try:
        group = zarr.open_group(store, mode="r")
    except (FileNotFoundError, zarr.errors.GroupNotFoundError):
        return None
    if group.attrs.get("complete"):
        return "a finished run; src will return it without work"
    progress = group["progress"]
    blocks = progress["pass1"][...]
    n = group.attrs["sites"]
    done = n - 1 - progress.attrs["pass2_next"]
    return (f"an interrupted run: pass 1 has {int(blocks.sum())} of {blocks.size} blocks of "
            f"sketch columns written, pass 2 {done} of {n - 1} sites done; src resumes it")


def _describe(tt: TensorTrain) -> str:
    """A one-line summary of a train (its repr lists every bond)."""
    return (f"{tt.kind.upper()}, {len(tt)} sites, max bond {max(tt.bond_dims)}, {tt.dtype}, "
            f"{tt.nbytes / 2**20:.2f} MiB")


def _has_quimb() -> bool:
    try:
        import quimb.tensor  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
