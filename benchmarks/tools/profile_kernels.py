# ruff: noqa: T201
"""Per-kernel GPU times of one middle site against their FLOP floor, and copy rates.

For the docs/design.md §5 problems (MPO·MPS at chi=1000; the N·V·M·U stack at
D_M=1000/chi_out=500 and D_M=2000/chi_out=1000) it times, with CUDA events
(median of 5 after a warm-up), each step of one middle site as plain CuPy calls of
the shapes src_dask's kernels contract (docs/design.md §2.2-2.4; the kernels
themselves are internal): pass 1's sketch step and pass 2's projection (their
einsums on opt_einsum's optimal path, run by opt_einsum on CuPy), the sketch piece
C·Z and the environment update conj(η)·Zᵀ (one GEMM each), the QR of the sketch
(cuSOLVER's Householder QR, and CholeskyQR2 as two plain rounds of Cholesky and a
triangular solve); then the host<->device copies of a core (pageable against a
pinned staging buffer on a copy stream of its own) and a Zarr read (zarr's GPU
buffers against a host read and the pinned copy). Each step's floor is its FLOP
count (benchmarks/flops.py) at the GEMM rate measured here.

With ``--products native,3m`` every complex product of each site (the pairwise
steps of those paths, the piece and the update) is also timed apart, natively and
as three real ones (Gauss's trick, written here: the operands' real planes, one
batched DGEMM for a_r b_r and a_i b_i, one for (a_r + a_i)(b_r + b_i), one
combining pass), with the parts of the three-real product; and each mode's
``<site>_<mode>`` entry sums a step's products as that mode of src_dask config
``complex-products`` makes them (``3m``: those whose rows, inner dimension and
columns are all at least 512 as three real ones, docs/design.md §3.2). A 3M
product's floor is 3/4 of its FLOPs at the DGEMM rate measured here ("of GEMM"
then means of three real GEMMs). ``--device cpu`` runs the same on NumPy (with
``--quick``, at sizes that take seconds: a check that needs no GPU). Prints a table
and writes benchmarks/results/gpu_kernels.json. Run with ``PYTHONPATH=src:benchmarks``:

    python benchmarks/tools/profile_kernels.py [--no-dm2000] [--products native,3m] [--out F]
    python benchmarks/tools/profile_kernels.py --device cpu --quick --products native,3m
"""

from __future__ import annotations

import string
import tempfile
import time
from collections.abc import Callable
from math import prod
from typing import Any

import numpy as np
from flops import CONVENTION, LEGEND, einsum_flops
from harness import Record, output_path, parser, print_table

STEPS = ("pass1", "project", "piece", "update")
#: The least rows, inner dimension and columns of a product that src_dask's
#: ``complex-products: 3m`` makes as three real ones (docs/design.md §3.2).
WIDE = 512
#: The most inner dimension and columns of a thin product (src_dask: _kernels.THIN_MAX).
THIN = 32
#: Index letters; s (sketch), r (right bond) and l are the equations' own.
LETTERS = [c for c in string.ascii_letters if c not in "srl"]


# -- clocks ---------------------------------------------------------------------------
def timed(xp: Any, fn: Callable[[], Any], repeats: int = 5) -> float:
    """Median device time of ``fn`` (CUDA events; on the CPU its wall time), after a
    warm-up."""
    if xp is np:
        return wall(xp, fn, repeats)
    fn()
    xp.cuda.Device().synchronize()
    times = []
    for _ in range(repeats):
        start, stop = xp.cuda.Event(), xp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(xp.cuda.get_elapsed_time(start, stop) / 1e3)
    return float(np.median(times))


def wall(xp: Any, fn: Callable[[], Any], repeats: int = 5) -> float:
    """Median wall time of ``fn`` with the device synchronized, after a warm-up."""
    def sync() -> None:
        if xp is not np:
            xp.cuda.Device().synchronize()

    fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def rand(xp: Any, *shape: int) -> Any:
    return (xp.random.standard_normal(shape) + 1j * xp.random.standard_normal(shape)) / np.sqrt(
        max(shape))


def free(xp: Any) -> None:
    if xp is not np:
        xp.get_default_memory_pool().free_all_blocks()


# -- one site's contractions (docs/design.md §1-2) -------------------------------------
def equations(k: int) -> tuple[str, str]:
    """Pass 1's sketch step ``C[s, a..] Ω[s, x_0, x_k] Π T_i[a_i, b_i, x_{i-1}, x_i] ->
    C'[s, b..]`` and pass 2's projection ``Π T_i · S[r, b..] -> Z[a.., r, x_0, x_k]``
    for a ket stack of depth ``k``."""
    a, b, x = "".join(LETTERS[:k]), "".join(LETTERS[k:2 * k]), LETTERS[2 * k:3 * k + 1]
    cores = ",".join(a[i] + b[i] + x[i] + x[i + 1] for i in range(k))
    return (f"s{a},s{x[0]}{x[k]},{cores}->s{b}", f"{cores},r{b}->{a}r{x[0]}{x[k]}")


def gemms(eq: str, *shapes: tuple[int, ...]) -> list[tuple[int, int, int, int]]:
    """The pairwise steps of ``eq``'s optimal path (opt_einsum) as batched products
    ``(batch, m, k, n)``: indices on both sides and kept are the batch, on both and
    summed the inner dimension, on one side and kept its rows or columns."""
    import opt_einsum as oe

    _, info = oe.contract_path(eq, *shapes, shapes=True, optimize="optimal")
    out = []
    for step in info.contraction_list:
        terms, kept = step[2].split("->")
        if terms.count(",") != 1:
            continue
        ta, tb = terms.split(",")

        def size(cs: list[str]) -> int:
            return prod(info.size_dict[c] for c in cs)

        out.append((size([c for c in ta if c in tb and c in kept]),
                    size([c for c in ta if c not in tb and c in kept]),
                    size([c for c in ta if c in tb and c not in kept]),
                    size([c for c in tb if c not in ta and c in kept])))
    return out


def householder(xp: Any, rows: Any) -> Any:
    """``Qᵀ`` of the QR of ``M = rowsᵀ`` with a real positive diagonal in R."""
    q, r = xp.linalg.qr(rows.T)
    d = xp.diagonal(r)
    return (q * (d / abs(d))[None, :]).T


def cholesky_qr2(xp: Any, rows: Any) -> Any:
    """``Qᵀ`` of the same QR by CholeskyQR2: two rounds of ``Q = M L⁻ᴴ`` with ``MᴴM =
    LLᴴ`` (src_dask's takes the second round to first order where the first leaves Q
    orthonormal to 1e-8, docs/design.md §2.4: this is its upper bound)."""
    if xp is np:
        from scipy.linalg import solve_triangular
    else:
        from cupyx.scipy.linalg import solve_triangular
    for _ in range(2):
        lower = xp.linalg.cholesky(rows.conj() @ rows.T)
        rows = solve_triangular(lower.conj(), rows, lower=True, check_finite=False)
    return rows


def _step(seconds: float, flop: float, rate: float) -> dict:
    return {"s": seconds, "flop": flop, "floor_s": flop / rate}


def site(xp: Any, cores: list[Any], sketch: int, block: int, rate: float) -> dict:
    """Times of one middle site's steps for ket cores ``T_i[a, b, x, x']``."""
    import opt_einsum as oe

    k = len(cores)
    lefts = tuple(c.shape[0] for c in cores)
    rights = tuple(c.shape[1] for c in cores)
    up, down = cores[0].shape[2], cores[-1].shape[3]
    shapes = [c.shape for c in cores]
    eq1, eqz = equations(k)
    out = {"cores": [list(s) for s in shapes], "sketch": sketch, "block": block,
           "how": "plain CuPy/NumPy calls of the kernels' shapes: opt_einsum's optimal "
                  "path for pass 1 and the projection, one GEMM each for the piece and "
                  "the update (benchmarks/tools/profile_kernels.py)"}
    env, omega = rand(xp, block, *lefts), xp.ones((block, up, down), complex)
    pass1 = oe.contract_expression(eq1, env.shape, omega.shape, *shapes, optimize="optimal")
    f = einsum_flops(eq1, env.shape, omega.shape, *shapes)
    t1 = timed(xp, lambda: pass1(env, omega, *cores))
    out["pass1"] = _step(t1 * sketch / block, f * sketch / block, rate)
    right_env = rand(xp, sketch, *rights)
    project = oe.contract_expression(eqz, *shapes, right_env.shape, optimize="optimal")
    z = project(*cores, right_env)
    out["project"] = _step(timed(xp, lambda: project(*cores, right_env)),
                           einsum_flops(eqz, *shapes, right_env.shape), rate)
    zm = z.reshape(prod(lefts), -1)  # Z as a (Π a) x (R·U·D) matrix
    c_env = rand(xp, sketch, prod(lefts))
    piece = c_env @ zm
    out["piece"] = _step(timed(xp, lambda: c_env @ zm), 8 * piece.size * prod(lefts), rate)
    rows = piece[:sketch]
    out["qr_householder"] = {"s": timed(xp, lambda: householder(xp, rows))}
    out["qr_cholesky2"] = {"s": wall(xp, lambda: cholesky_qr2(xp, rows))}
    q = cholesky_qr2(xp, rows)
    out["qr_max_diff"] = float(abs(q - householder(xp, rows)).max())
    zt = zm.T

    def update(eta: Any) -> Any:
        return eta.conj() @ zt

    out["update"] = _step(timed(xp, lambda: update(q)), 8 * q.size * prod(lefts), rate)

    def pass2_step() -> Any:  # orthonormalize, update, project the next site
        s_next = update(cholesky_qr2(xp, rows)).reshape(sketch, *lefts)
        return project(*cores, s_next)

    out["pass2_step_wall"] = wall(xp, pass2_step)
    out["kernels_s"] = sum(out[s]["s"] for s in STEPS) + out["qr_cholesky2"]["s"]
    out["floor_s"] = sum(out[s]["floor_s"] for s in STEPS)
    return out


# -- complex products, native and as three real ones ------------------------------------
def site_products(cores_shapes: list[tuple[int, ...]], sketch: int,
                  block: int) -> list[tuple[str, tuple[int, ...], tuple[int, ...], bool]]:
    """``(step, a's shape, b's shape, conj a)`` of every complex product of one site:
    pass 1's step on ``block`` columns and the projection (the pairwise steps of their
    paths, batched), the piece and the update."""
    k = len(cores_shapes)
    lefts = tuple(s[0] for s in cores_shapes)
    rights = tuple(s[1] for s in cores_shapes)
    up, down = cores_shapes[0][2], cores_shapes[-1][3]
    eq1, eqz = equations(k)
    out = []
    for step, eq, shapes in (
            ("pass1", eq1, [(block, *lefts), (block, up, down), *cores_shapes]),
            ("project", eqz, [*cores_shapes, (sketch, *rights)])):
        out += [(step, (b, m, kk), (b, kk, n), False) for b, m, kk, n in gemms(eq, *shapes)]
    a, rud = prod(lefts), sketch * up * down
    out.append(("piece", (sketch, a), (a, rud), False))
    out.append(("update", (sketch, rud), (rud, a), True))
    return out


def three_real(xp: Any, a: Any, b: Any, conj: bool) -> Any:
    """``conj(a) @ b`` (``conj``) or ``a @ b`` as three real products (Gauss's trick),
    written as plain array operations: the textbook form of what src_dask's
    ``complex-products: 3m`` computes (its own split and combine kernels are fused)."""
    ar, ai, br, bi = _parts(xp, a, b, conj)
    t1, t2 = xp.matmul(ar, br), xp.matmul(ai, bi)
    t3 = xp.matmul(ar + ai, br + bi)
    return (t1 - t2) + 1j * (t3 - t1 - t2)


def interleaved(xp: Any, a: Any, b: Any, conj: bool) -> Any:
    """``conj(a) @ b`` or ``a @ b`` as one real product of ``a``'s interleaved parts with
    the real ``(2k, 2n)`` matrix of ``b``'s products: what src_dask's ``complex-products:
    auto`` and ``3m`` compute for a thin product."""
    k, n = b.shape[-2:]
    s = 1 if conj else -1
    w = xp.stack([xp.stack([b.real, b.imag], -1), xp.stack([s * b.imag, -s * b.real], -1)], -3)
    out = xp.matmul(xp.ascontiguousarray(a).view(a.real.dtype), w.reshape(*b.shape[:-2], 2 * k,
                                                                            2 * n))
    return out.view(a.dtype)


def _parts(xp: Any, a: Any, b: Any, conj: bool) -> tuple[Any, Any, Any, Any]:
    """The real and imaginary parts of ``a`` (conjugated for ``conj``) and ``b``, each
    contiguous."""
    im = -a.imag if conj else a.imag
    return tuple(xp.ascontiguousarray(x) for x in (a.real, im, b.real, b.imag))


def product_times(xp: Any, step: str, sa: tuple[int, ...], sb: tuple[int, ...],
                  conj: bool) -> dict:
    """One product of :func:`site_products` on random operands, timed natively, as three
    real ones, and by the three-real product's parts (median of 3)."""
    a, b = rand(xp, *sa), rand(xp, *sb)
    m, k, n = sa[-2], sb[-2], sb[-1]
    row: dict[str, Any] = {"step": step, "a": list(sa), "b": list(sb), "dims": [m, k, n],
                           "wide": min(m, k, n) >= WIDE,
                           "native_s": timed(xp, lambda: xp.matmul(a.conj() if conj else a, b),
                                             3)}
    if max(k, n) <= THIN:
        row["interleaved_s"] = timed(xp, lambda: interleaved(xp, a, b, conj), 3)
    try:
        ar, ai, br, bi = _parts(xp, a, b, conj)
        t1, t2, t3 = xp.matmul(ar, br), xp.matmul(ai, bi), xp.matmul(ar + ai, br + bi)
        row.update(three_s=timed(xp, lambda: three_real(xp, a, b, conj), 3),
                   planes_s=timed(xp, lambda: _parts(xp, a, b, conj), 3),
                   gemms_s=timed(xp, lambda: (xp.matmul(ar, br), xp.matmul(ai, bi),
                                              xp.matmul(ar + ai, br + bi)), 3),
                   combine_s=timed(xp, lambda: (t1 - t2) + 1j * (t3 - t1 - t2), 3))
    except MemoryError as err:  # CuPy's OutOfMemoryError is one (src_dask goes native)
        row["three_real_failed"] = f"{type(err).__name__}: {err}"[:200]
    return row


def modes_of(rows: list[dict], cores_shapes: list[tuple[int, ...]], sketch: int, block: int,
             rates: dict[str, float]) -> dict[str, dict]:
    """Each mode's sum of the site's products by step (pass 1 scaled from ``block`` to
    ``sketch`` columns), with the floors: native products at the complex GEMM rate,
    three real ones at 3/4 of their FLOPs at the DGEMM rate."""
    out = {}
    for mode in ("native", "3m"):  # 3m: auto's choice on a GPU
        entry: dict[str, Any] = {"how": f"the site's products alone, as complex-products: "
                                        f"{mode} makes them (benchmarks/tools/profile_kernels.py)",
                                 "sketch": sketch, "block": block,
                                 "cores": [list(s) for s in cores_shapes]}
        for step in STEPS:
            scale = sketch / block if step == "pass1" else 1.0
            s = flop = floor = 0.0
            for r in (r for r in rows if r["step"] == step):
                three = mode == "3m" and r["wide"] and "three_s" in r
                thin = mode == "3m" and "interleaved_s" in r
                f = 8.0 * prod(r["a"]) * r["b"][-1]
                s += r["three_s" if three else "interleaved_s" if thin else "native_s"]
                flop += f
                floor += f / rates["3m" if three else "native"]
            entry[step] = {"s": s * scale, "flop": flop * scale, "floor_s": floor * scale}
        entry["kernels_s"] = sum(entry[s]["s"] for s in STEPS)
        entry["floor_s"] = sum(entry[s]["floor_s"] for s in STEPS)
        out[mode] = entry
    return out


# -- copies ------------------------------------------------------------------------------
def copies(nbytes: int) -> dict:
    """Host<->device copy rates (pageable; through a pinned staging buffer on a copy
    stream of its own) and Zarr reads (zarr's GPU buffers; a host read and the pinned
    copy)."""
    import cupy as cp
    import cupyx
    import zarr
    from zarr.core.buffer import gpu

    host = np.ones(nbytes // 16, complex)
    dev = cp.asarray(host)
    staging = cupyx.empty_pinned(host.shape, host.dtype)
    stream = cp.cuda.Stream(non_blocking=True)

    def to_device(x: np.ndarray) -> Any:
        out = cp.empty(x.shape, x.dtype)
        np.copyto(staging, x)
        out.set(staging, stream=stream)
        stream.synchronize()
        return out

    def to_host(x: Any) -> np.ndarray:
        x.get(stream=stream, out=staging)
        stream.synchronize()
        return np.array(staging)

    gbps = nbytes / 1e9
    res = {
        "bytes": nbytes,
        "h2d_pageable_GBps": gbps / wall(cp, lambda: cp.asarray(host)),
        "h2d_pinned_stream_GBps": gbps / wall(cp, lambda: to_device(host)),
        "d2h_pageable_GBps": gbps / wall(cp, lambda: dev.get()),
        "d2h_pinned_stream_GBps": gbps / wall(cp, lambda: to_host(dev)),
    }
    with tempfile.TemporaryDirectory() as d:
        z = zarr.create_array(f"{d}/a", shape=host.shape, dtype=host.dtype, chunks=host.shape,
                              compressors=None)
        z[...] = host
        res["zarr_gpu_buffer_GBps"] = gbps / wall(
            cp, lambda: z.get_basic_selection(Ellipsis, prototype=gpu.buffer_prototype), 3)
        res["zarr_host_then_pinned_GBps"] = gbps / wall(cp, lambda: to_device(z[...]), 3)
    return res


# -- the run -------------------------------------------------------------------------------
def real_gemm_rate(xp: Any, n: int) -> float:
    """FLOP/s of an ``n``³ float64 GEMM (best of 3)."""
    a, b = xp.random.standard_normal((n, n)), xp.random.standard_normal((n, n))
    seconds = min(timed(xp, lambda: a @ b, 1) for _ in range(3))
    return 2.0 * n**3 / seconds


def report(record: dict) -> None:
    sites = [k for k in record if isinstance(record[k], dict) and "floor_s" in record[k]]
    ms = [*STEPS, "qr_householder", "qr_cholesky2"]

    def cell(entry: dict, step: str) -> str:
        return f"{entry[step]['s'] * 1e3:.2f}" if step in entry else "-"

    print_table(["one middle site", *(f"{s} ms" for s in ms), "kernels ms", "floor ms"],
                [[k, *(cell(record[k], s) for s in ms), f"{record[k]['kernels_s'] * 1e3:.1f}",
                  f"{record[k]['floor_s'] * 1e3:.1f}"] for k in sites],
                [LEGEND, f"floor: the steps' FLOPs at the GEMM rate "
                 f"{record['gemm_flops'] / 1e12:.3f} TFLOP/s; kernels: the steps and "
                 "CholeskyQR2; <site>_<mode>: the site's products alone, made as that mode "
                 "makes them"])
    for key in (k for k in record if k.startswith("products_")):
        print_table([f"{key}: product", "m k n", "native ms", "3m ms", "planes ms",
                     "gemms ms", "combine ms"],
                    [[r["step"], " ".join(map(str, r["dims"])),
                      *(f"{r[k] * 1e3:.2f}" if k in r else "-"
                        for k in ("native_s", "three_s", "planes_s", "gemms_s", "combine_s"))]
                     for r in record[key]], [])
    if "copies_256MiB" in record:
        print("copies (GB/s): " + ", ".join(f"{k.removesuffix('_GBps')} {v:.1f}" for k, v
                                            in record["copies_256MiB"].items() if k != "bytes"))


def main(argv: list[str] | None = None) -> dict:
    p = parser(__doc__, quick="MPO·MPS chi=32 and stacks D_M=16 and 32 (seconds on a CPU)",
               out="gpu_kernels.json")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                   help="CuPy on the GPU (default) or NumPy on the CPU")
    p.add_argument("--no-dm2000", action="store_true",
                   help="skip the D_M=2000 stack's site (with --quick the D_M=32 one)")
    p.add_argument("--products", default="native",
                   help="ways of making complex products to time, comma-separated (native, "
                        "3m): with 3m, each product of each site apart, both ways")
    args = p.parse_args(argv)
    from device import Device, gemm_rate

    device = Device(args.device)
    xp = device.xp
    gemm_n = (8192 if device.is_gpu else 2048) // (8 if args.quick else 1)
    rate = gemm_rate(gemm_n, 3, device)["tflops"] * 1e12
    print(f"GEMM complex128: {rate / 1e12:.3f} TFLOP/s", flush=True)
    record = Record("per-kernel GPU times of one middle site against their FLOP floor",
                    device, gemm_flops=rate, flop_convention=CONVENTION)
    modes = args.products.split(",")
    if unknown := set(modes) - {"native", "3m"}:
        p.error(f"--products: unknown {', '.join(sorted(unknown))} (native, 3m)")
    rates = {"native": rate, "3m": real_gemm_rate(xp, gemm_n) * 4 / 3}  # 3M: 3/4 of the FLOPs
    record["dgemm_flops"] = rates["3m"] * 3 / 4
    print(f"GEMM float64: {record['dgemm_flops'] / 1e12:.3f} TFLOP/s", flush=True)
    chi, sizes = (32, [(16, 8, 8), (32, 16, 8)]) if args.quick else (
        1000, [(1000, 500, 128), (2000, 1000, 128)])
    if args.no_dm2000:
        sizes = sizes[:1]
    problems = [(f"mpo_mps_chi{chi}", [(4, 4, 2, 2), (chi, chi, 2, 1)], chi, chi)]
    problems += [(f"stack_dm{dm}", [(4, 4, 4, 4), (4, 4, 4, 4), (dm, dm, 4, 4), (4, 4, 4, 4)],
                  chi_out, block) for dm, chi_out, block in sizes]
    for name, shapes, sketch, block in problems:
        cores = [rand(xp, *s) for s in shapes]
        try:
            record[name] = site(xp, cores, sketch, block, rate)
        except MemoryError as err:  # CuPy's OutOfMemoryError too: the other sites still run
            record[name] = {"error": f"{type(err).__name__}: {err}"}
            print(f"{name}: {record[name]['error']}", flush=True)
            del cores
            free(xp)
            continue
        print(f"{name}: {record[name]['kernels_s'] * 1e3:.1f} ms", flush=True)
        del cores
        free(xp)
        if "3m" not in modes:
            continue
        rows = []
        for step, sa, sb, conj in site_products(shapes, sketch, block):
            rows.append(product_times(xp, step, sa, sb, conj))
            free(xp)  # the operands, planes and products of each
        record[f"products_{name.removeprefix('stack_')}"] = rows
        for mode, entry in modes_of(rows, shapes, sketch, block, rates).items():
            if mode in modes:
                record[f"{name}_{mode}"] = entry
    if device.is_gpu:
        record["copies_256MiB"] = copies(256 * 2**20)
    report(record)
    record.write(output_path(args.out, "gpu_kernels.json", args.quick))
    return record


if __name__ == "__main__":
    main()
