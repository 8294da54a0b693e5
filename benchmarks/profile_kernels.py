"""Per-kernel GPU times of one site, against the FLOP floor: where a run's time goes.

    python benchmarks/profile_kernels.py [--out kernels.json]

For the DESIGN.md §3 problems (MPO·MPS at chi=1000; the N·V·M·U stack at
D_M=1000/chi_out=500 and D_M=2000/chi_out=1000) it times, with CUDA events
(median of 5 after a warm-up), each step of one middle site: pass 1's sketch
step, pass 2's projection, sketch piece, QR (cuSOLVER Householder and
CholeskyQR2) and environment update; then the host↔device copies of a core
(plain pageable against src_dask's pinned copy stream) and a Zarr read (zarr's
GPU buffers against a host read and the pinned copy). The site's FLOPs (8 per
complex multiply-add) at the GEMM rate measured here give each step's floor.
"""
# ruff: noqa: T201

from __future__ import annotations

import argparse
import json
import tempfile
import time
from math import prod

import cupy as cp
import numpy as np
import opt_einsum as oe

from src_dask import _kernels as K
from src_dask import _transfer


def timed(fn, repeats: int = 5) -> float:
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
    return (cp.random.standard_normal(shape) + 1j * cp.random.standard_normal(shape)) / np.sqrt(
        max(shape))


def flops(eq: str, *arrays) -> float:
    _, info = oe.contract_path(eq, *[a.shape for a in arrays], shapes=True, optimize="optimal")
    return 8 * float(info.opt_cost) / 2


def gemm_rate(n: int = 8192) -> float:
    a, b = rand(n, n), rand(n, n)
    return 8 * n**3 / timed(lambda: a @ b, 3)


def site(cores, sketch: int, block: int, rate: float) -> dict:
    """Times of one middle site's steps for ket cores ``T_i[a, b, x, x']``."""
    k = len(cores)
    lefts = tuple(c.shape[0] for c in cores)
    rights = tuple(c.shape[1] for c in cores)
    up, down = cores[0].shape[2], cores[-1].shape[3]
    out = {"cores": [list(c.shape) for c in cores], "sketch": sketch, "block": block}
    env = rand(block, *lefts)
    omega = np.ones((block, up, down), complex)
    eq1 = K._sketch_step_eq(k)
    t = timed(lambda: K.sketch_step(env, cores, omega=omega, site=1)) * sketch / block
    f = flops(eq1, env, omega, *cores) * sketch / block
    out["pass1"] = {"s": t, "flop": f, "floor_s": f / rate}
    right_env = rand(sketch, *rights)
    z = K.project_core(cores, right_env)
    a, b, x = K._symbols(k)
    eqz = ",".join(K._core_terms(k)) + f",r{b}->{a}r{x[0]}{x[k]}"
    f = flops(eqz, *cores, right_env)
    out["project"] = {"s": timed(lambda: K.project_core(cores, right_env)), "flop": f,
                      "floor_s": f / rate}
    c_env = rand(sketch, *lefts)
    piece = K.sketch_piece(c_env, z)
    f = 8 * prod(piece.shape) * prod(lefts)
    out["piece"] = {"s": timed(lambda: K.sketch_piece(c_env, z)), "flop": f,
                    "floor_s": f / rate}
    rows = piece[:sketch]

    def householder():
        q, r = cp.linalg.qr(rows.T)
        return K._positive_diagonal(q, r)

    out["qr_householder"] = {"s": timed(householder)}
    out["qr_cholesky2"] = {"s": wall(lambda: K._cholesky_qr2(rows))}
    q = K._cholesky_qr2(rows)
    hq = householder()
    out["qr_max_diff"] = float(abs(q - hq.T).max()) if q is not None else None
    eta = q.reshape(q.shape[0], -1, up, down)
    f = 8 * eta.size * prod(lefts)
    out["update"] = {"s": timed(lambda: K.update_env(eta, [z])), "flop": f, "floor_s": f / rate}
    out["pass2_step_wall"] = wall(lambda: K.pass2_step(
        [[piece]], [z], cores, up=up, down=down, cutoff=0.0, max_rank=sketch, site=1))
    steps = ("pass1", "project", "piece", "update")
    out["kernels_s"] = sum(out[s]["s"] for s in steps) + out["qr_cholesky2"]["s"]
    out["floor_s"] = sum(out[s]["floor_s"] for s in steps)
    return out


def copies(nbytes: int) -> dict:
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
    import zarr
    from zarr.core.buffer import gpu

    with tempfile.TemporaryDirectory() as d:
        z = zarr.create_array(f"{d}/a", shape=host.shape, dtype=host.dtype, chunks=host.shape,
                              compressors=None)
        z[...] = host
        res["zarr_gpu_buffer_GBps"] = gbps / wall(
            lambda: z.get_basic_selection(Ellipsis, prototype=gpu.buffer_prototype), 3)
        res["zarr_host_then_pinned_GBps"] = gbps / wall(lambda: _transfer.to_device(z[...]), 3)
    return res


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--no-dm2000", action="store_true")
    args = p.parse_args()
    rate = gemm_rate()
    print(f"GEMM complex128: {rate / 1e12:.1f} TFLOP/s", flush=True)
    record = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "gemm_flops": rate}
    chi = 1000
    record["mpo_mps_chi1000"] = site([rand(4, 4, 2, 2), rand(chi, chi, 2, 1)], chi, chi, rate)
    print(json.dumps(record["mpo_mps_chi1000"], indent=1), flush=True)
    sizes = [(1000, 500, 128)] + ([] if args.no_dm2000 else [(2000, 1000, 128)])
    for dm, chi_out, block in sizes:
        cores = [rand(4, 4, 4, 4), rand(4, 4, 4, 4), rand(dm, dm, 4, 4), rand(4, 4, 4, 4)]
        key = f"stack_dm{dm}"
        record[key] = site(cores, chi_out, block, rate)
        print(key, json.dumps(record[key], indent=1), flush=True)
        del cores
        cp.get_default_memory_pool().free_all_blocks()
    record["copies_256MiB"] = copies(256 * 2**20)
    print(json.dumps(record["copies_256MiB"], indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
