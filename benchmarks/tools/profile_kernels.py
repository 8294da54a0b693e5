# ruff: noqa: T201
"""Per-kernel GPU times of one middle site against their FLOP floor, and copy rates.

For the docs/design.md §5 problems (MPO·MPS at chi=1000; the N·V·M·U stack at
D_M=1000/chi_out=500 and D_M=2000/chi_out=1000) it times, with CUDA events
(median of 5 after a warm-up), each step of one middle site: pass 1's sketch
step, pass 2's projection, sketch piece, QR (cuSOLVER Householder and
CholeskyQR2) and environment update; then the host<->device copies of a core
(plain pageable against src_dask's pinned copy stream) and a Zarr read (zarr's
GPU buffers against a host read and the pinned copy). Each step's floor is its
FLOP count (benchmarks/flops.py) at the GEMM rate measured here. With
``--products native,3m`` each site is timed with each way of making complex
products (src_dask config ``complex-products``); a 3M step's floor is 3/4 of its
FLOPs at the DGEMM rate measured here ("of GEMM" then means of three real GEMMs).
Prints a table and writes benchmarks/results/gpu_kernels.json.

    python benchmarks/profile_kernels.py [--no-dm2000] [--products native,3m] [--out F]
"""

from __future__ import annotations

import tempfile
import time
from math import prod

import numpy as np
from flops import CONVENTION, LEGEND, einsum_flops
from harness import Record, output_path, parser, print_table

STEPS = ("pass1", "project", "piece", "update")


def timed(fn, repeats: int = 5) -> float:
    """Median GPU time of ``fn`` by CUDA events, after a warm-up."""
    import cupy as cp

    fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(repeats):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
    return float(np.median(times))


def wall(fn, repeats: int = 5) -> float:
    """Median wall time of ``fn`` with the device synchronized, after a warm-up."""
    import cupy as cp

    fn()
    times = []
    for _ in range(repeats):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        fn()
        cp.cuda.Device().synchronize()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def rand(*shape):
    import cupy as cp

    return (cp.random.standard_normal(shape) + 1j * cp.random.standard_normal(shape)) / np.sqrt(
        max(shape))


def _step(seconds: float, flop: float, rate: float) -> dict:
    return {"s": seconds, "flop": flop, "floor_s": flop / rate}


def site(cores, sketch: int, block: int, rate: float) -> dict:
    """Times of one middle site's steps for ket cores ``T_i[a, b, x, x']``."""
    import cupy as cp

    from src_dask import _kernels as K

    k = len(cores)
    lefts = tuple(c.shape[0] for c in cores)
    rights = tuple(c.shape[1] for c in cores)
    up, down = cores[0].shape[2], cores[-1].shape[3]
    out = {"cores": [list(c.shape) for c in cores], "sketch": sketch, "block": block}
    env, omega = rand(block, *lefts), np.ones((block, up, down), complex)
    f = einsum_flops(K._sketch_step_eq(k), env.shape, omega.shape, *(c.shape for c in cores))
    out["pass1"] = _step(timed(lambda: K.sketch_step(env, cores, omega=omega, site=1))
                         * sketch / block, f * sketch / block, rate)
    right_env = rand(sketch, *rights)
    z = K.project_core(cores, right_env)
    a, b, x = K._symbols(k)
    eqz = ",".join(K._core_terms(k)) + f",r{b}->{a}r{x[0]}{x[k]}"
    out["project"] = _step(timed(lambda: K.project_core(cores, right_env)),
                           einsum_flops(eqz, *(c.shape for c in cores), right_env.shape), rate)
    c_env = rand(sketch, *lefts)
    piece = K.sketch_piece(c_env, z)
    out["piece"] = _step(timed(lambda: K.sketch_piece(c_env, z)),
                         8 * prod(piece.shape) * prod(lefts), rate)
    rows = piece[:sketch]

    def householder():
        q, r = cp.linalg.qr(rows.T)
        return K._positive_diagonal(q, r)

    out["qr_householder"] = {"s": timed(householder)}
    out["qr_cholesky2"] = {"s": wall(lambda: K._cholesky_qr2(rows))}
    q = K._cholesky_qr2(rows)
    out["qr_max_diff"] = float(abs(q - householder().T).max()) if q is not None else None
    eta = q.reshape(q.shape[0], -1, up, down)
    out["update"] = _step(timed(lambda: K.update_env(eta, [z])), 8 * eta.size * prod(lefts),
                          rate)
    out["pass2_step_wall"] = wall(lambda: K.pass2_step(
        [[piece]], [z], cores, up=up, down=down, cutoff=0.0, max_rank=sketch, site=1))
    out["kernels_s"] = sum(out[s]["s"] for s in STEPS) + out["qr_cholesky2"]["s"]
    out["floor_s"] = sum(out[s]["floor_s"] for s in STEPS)
    return out


def products(cores, sketch: int, block: int) -> list[dict]:
    """Each complex product of one middle site (pass 1's step on ``block`` columns, the
    projection, the sketch piece, the update) timed natively and as three real ones,
    with the three-real product's parts: the planes of both operands, the real GEMMs,
    the combination (``_kernels.matmul``'s)."""
    import cupy as cp

    from src_dask import _kernels as K

    calls, kinds, native = [], [], K.matmul

    def recorded(a, b, **kw):
        calls.append((a, b, kw.get("conj_a", False), kw.get("shapes")))
        return native(a, b, **kw)

    lefts, rights = tuple(c.shape[0] for c in cores), tuple(c.shape[1] for c in cores)
    up, down = cores[0].shape[2], cores[-1].shape[3]
    steps = [("pass1", lambda: K.sketch_step(rand(block, *lefts), cores,
                                             omega=np.ones((block, up, down), complex), site=1)),
             ("project", lambda: K.project_core(cores, rand(sketch, *rights)))]
    K.matmul = recorded
    try:
        for kind, step in steps:
            n = len(calls)
            z = step()
            kinds += [kind] * (len(calls) - n)
        for kind, step in (("piece", lambda: K.sketch_piece(rand(sketch, *lefts), z)),
                           ("update", lambda: K.update_env(rand(sketch, sketch, up, down), [z]))):
            n = len(calls)
            step()
            kinds += [kind] * (len(calls) - n)
    finally:
        K.matmul = native
    rows = []
    for kind, call in zip(kinds, calls, strict=True):
        rows.append(_product_times(kind, *call))
        cp.get_default_memory_pool().free_all_blocks()  # the planes and products of each
    return rows


def _product_times(kind: str, a, b, conj: bool, shapes) -> dict:
    """One product of :func:`products`, timed natively, as three real ones, and by parts."""
    import cupy as cp

    from src_dask import _kernels as K

    sa, sb = shapes or (a.shape, b.shape)
    pa = K._planes(cp, a, conj).reshape((2, *sa))
    pb = K._planes(cp, b, False).reshape((2, *sb))
    t12, t3 = cp.matmul(pa, pb), cp.matmul(pa[0], pb[0])
    out = cp.empty(t3.shape, complex)
    row = {"step": kind, "a": list(sa), "b": list(sb), "dims": list(K._gemm_dims(a, b, shapes)),
           "native_s": timed(lambda: cp.matmul((a.conj() if conj else a).reshape(sa),
                                               b.reshape(sb)), 3),
           "three_s": timed(lambda: K._three_real_product(cp, a, b, conj, shapes), 3),
           "planes_s": timed(lambda: (K._planes(cp, a, conj), K._planes(cp, b, False)), 3),
           "gemms_s": timed(lambda: (cp.matmul(pa, pb), cp.matmul(pa[0], pb[0])), 3),
           "combine_s": timed(lambda: K._combine_kernel()(t12[0], t12[1], t3, out), 3)}
    return row


def real_gemm_rate(n: int) -> float:
    """FLOP/s of an ``n``³ float64 GEMM on the GPU (best of 3 by CUDA events)."""
    import cupy as cp

    a, b = cp.random.standard_normal((n, n)), cp.random.standard_normal((n, n))
    seconds = min(timed(lambda: a @ b, 1) for _ in range(3))
    return 2.0 * n**3 / seconds


def copies(nbytes: int) -> dict:
    """Host<->device copy rates (pageable, src_dask's pinned stream) and Zarr reads."""
    import cupy as cp
    import zarr
    from zarr.core.buffer import gpu

    from src_dask import _transfer

    host = np.ones(nbytes // 16, complex)
    dev = cp.asarray(host)
    gbps = nbytes / 1e9
    res = {
        "bytes": nbytes,
        "h2d_pageable_GBps": gbps / wall(lambda: cp.asarray(host)),
        "h2d_pinned_stream_GBps": gbps / wall(lambda: _transfer.to_device(host)),
        "d2h_pageable_GBps": gbps / wall(lambda: dev.get()),
        "d2h_pinned_stream_GBps": gbps / wall(lambda: _transfer.to_host(dev)),
    }
    with tempfile.TemporaryDirectory() as d:
        z = zarr.create_array(f"{d}/a", shape=host.shape, dtype=host.dtype, chunks=host.shape,
                              compressors=None)
        z[...] = host
        res["zarr_gpu_buffer_GBps"] = gbps / wall(
            lambda: z.get_basic_selection(Ellipsis, prototype=gpu.buffer_prototype), 3)
        res["zarr_host_then_pinned_GBps"] = gbps / wall(lambda: _transfer.to_device(z[...]), 3)
    return res


def report(record: dict) -> None:
    sites = [k for k in record if isinstance(record[k], dict) and "floor_s" in record[k]]
    ms = [*STEPS, "qr_householder", "qr_cholesky2"]
    print_table(["one middle site", *(f"{s} ms" for s in ms), "kernels ms", "floor ms"],
                [[k, *(f"{record[k][s]['s'] * 1e3:.2f}" for s in ms),
                  f"{record[k]['kernels_s'] * 1e3:.1f}", f"{record[k]['floor_s'] * 1e3:.1f}"]
                 for k in sites],
                [LEGEND, f"floor: the steps' FLOPs at the GEMM rate "
                 f"{record['gemm_flops'] / 1e12:.1f} TFLOP/s; kernels: the steps and CholeskyQR2",
                 "copies (GB/s): " + ", ".join(f"{k.removesuffix('_GBps')} {v:.1f}" for k, v
                                               in record["copies_256MiB"].items() if k != "bytes")])


def main(argv: list[str] | None = None) -> dict:
    p = parser(__doc__, out="gpu_kernels.json")
    p.add_argument("--no-dm2000", action="store_true", help="skip the D_M=2000 stack's site")
    p.add_argument("--products", default="native",
                   help="ways of making complex products to time, comma-separated (native, 3m)")
    args = p.parse_args(argv)
    import cupy as cp
    import dask
    from device import Device, gemm_rate

    device = Device("gpu")
    rate = gemm_rate(8192, 3, device)["tflops"] * 1e12
    print(f"GEMM complex128: {rate / 1e12:.1f} TFLOP/s", flush=True)
    record = Record("per-kernel GPU times of one middle site against their FLOP floor",
                    device, gemm_flops=rate, flop_convention=CONVENTION)
    chi = 1000
    modes = args.products.split(",")
    rates = {"native": rate, "3m": real_gemm_rate(8192) * 4 / 3}  # 3M: 3/4 of the FLOPs
    record["dgemm_flops"] = rates["3m"] * 3 / 4
    print(f"GEMM float64: {record['dgemm_flops'] / 1e12:.1f} TFLOP/s", flush=True)
    sizes = [(1000, 500, 128)] + ([] if args.no_dm2000 else [(2000, 1000, 128)])
    for mode in modes:
        tag = "" if mode == modes[0] == "native" and len(modes) == 1 else f"_{mode}"
        with dask.config.set({"src_dask.complex-products": mode}):
            record[f"mpo_mps_chi1000{tag}"] = site([rand(4, 4, 2, 2), rand(chi, chi, 2, 1)],
                                                   chi, chi, rates[mode])
            for dm, chi_out, block in sizes:
                cores = [rand(4, 4, 4, 4), rand(4, 4, 4, 4), rand(dm, dm, 4, 4),
                         rand(4, 4, 4, 4)]
                name = f"stack_dm{dm}{tag}"
                record[name] = site(cores, chi_out, block, rates[mode])
                print(f"{name}: {record[name]['kernels_s'] * 1e3:.1f} ms", flush=True)
                del cores
                cp.get_default_memory_pool().free_all_blocks()
    if "3m" in modes:
        cores = [rand(4, 4, 4, 4), rand(4, 4, 4, 4), rand(1000, 1000, 4, 4), rand(4, 4, 4, 4)]
        record["products_dm1000"] = products(cores, 500, 128)
        del cores
        print_table(["D_M=1000 site: product", "m k n", "native ms", "3m ms", "planes ms",
                     "gemms ms", "combine ms"],
                    [[r["step"], " ".join(map(str, r["dims"])),
                      *(f"{r[k] * 1e3:.2f}" for k in ("native_s", "three_s", "planes_s",
                                                      "gemms_s", "combine_s"))]
                     for r in record["products_dm1000"]], [])
    record["copies_256MiB"] = copies(256 * 2**20)
    report(record)
    record.write(output_path(args.out, "gpu_kernels.json"))
    return record


if __name__ == "__main__":
    main()
