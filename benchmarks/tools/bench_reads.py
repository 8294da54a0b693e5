# ruff: noqa: T201
"""Reading a stored train's core onto the GPU: the ways there are, side by side.

A site core saved by ``src_dask.save`` is a Zarr v3 array whose chunk files hold the
raw bytes and a CRC32C (codecs ``bytes`` + ``crc32c``). Each way below reads the
largest core of the train at ``PATH`` (e.g. the stack's ``M``, written by
bench_stack.py under ``--workdir``/inputs) into device memory, best of ``--repeats``
after one warm-up, and reports GB/s (issue 31, item 4):

- ``host_pinned``: src_dask's way, in plain calls: each chunk file read into page-locked
  host memory (CuPy's pinned pool), its CRC32C checked on the host, then one
  asynchronous copy to the device;
- ``zarr_gpu``: zarr-python's GPU buffers (``zarr.config.enable_gpu()``), zarr's own
  reading and checks;
- ``kvikio``: each chunk file read by KvikIO's ``CuFile.pread`` straight into device
  memory (GPUDirect Storage where the machine has it, else KvikIO's compatibility
  mode), checksum **not** verified: an upper bound for a GPU-side check;
- ``kvikio_host_crc``: the same, and the checksum computed on the host from a copy of
  the bytes back (what a straight-to-device read costs while CRC32C runs on the host).

The page cache holds the files after their first read: every way reads them from there.

    python benchmarks/tools/bench_reads.py /tmp/sb1000/inputs/M --out reads.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np


def _largest(path: Path) -> Any:
    import zarr

    group = zarr.open_group(str(path), mode="r")
    return max((a for _, a in group.arrays()), key=lambda a: a.nbytes)


def _chunk_files(arr: Any) -> list[tuple[str, tuple[slice, ...]]]:
    """(file, the selection it holds) of each chunk of ``arr`` (a LocalStore's array)."""
    root = Path(str(arr.store.root)) / arr.path
    grid = [range(math.ceil(n / c)) for n, c in zip(arr.shape, arr.chunks, strict=True)]
    return [(str(root / arr.metadata.encode_chunk_key(coords)),
             tuple(slice(i * c, min((i + 1) * c, n))
                   for i, c, n in zip(coords, arr.chunks, arr.shape, strict=True)))
            for coords in itertools.product(*grid)]


def _crc32c(data: np.ndarray) -> int:
    """The CRC32C of a uint8 array, as src_dask computes it: the ``crc32c`` package
    (it releases the GIL) where installed, else google_crc32c."""
    try:
        from crc32c import crc32c
    except ImportError:
        import google_crc32c

        return google_crc32c.value(data.tobytes())
    return crc32c(data)


def _check(payload: np.ndarray, tail: bytes, path: str) -> None:
    if int.from_bytes(tail, "little") != _crc32c(payload):
        raise ValueError(f"{path}: CRC32C mismatch")


def host_pinned(arr: Any) -> Any:
    import cupy
    import cupyx

    out = cupyx.empty_pinned(arr.shape, np.dtype(arr.dtype))
    for path, sel in _chunk_files(arr):
        shape = tuple(s.stop - s.start for s in sel)
        chunk = cupyx.empty_pinned(shape, out.dtype) if len(sel) and shape != out.shape else out
        flat = chunk.reshape(-1).view(np.uint8)
        view = memoryview(flat)
        with open(path, "rb", buffering=0) as f:
            got = 0
            while got < len(view) and (n := f.readinto(view[got:])):
                got += n
            tail = f.read(4)
        _check(flat, tail, path)
        if chunk is not out:
            out[sel] = chunk
    stream = cupy.cuda.Stream(non_blocking=True)
    device = cupy.empty(out.shape, out.dtype)
    device.set(out, stream=stream)
    stream.synchronize()
    return device


def zarr_gpu(arr: Any) -> Any:
    import zarr

    with zarr.config.enable_gpu():
        gpu = zarr.open_array(arr.store, path=arr.path, mode="r")
        return gpu[...]


def _kvikio_chunks(arr: Any, host_crc: bool) -> Any:
    import cupy
    import kvikio

    out = cupy.empty(arr.shape, np.dtype(arr.dtype))
    for path, sel in _chunk_files(arr):
        shape = tuple(s.stop - s.start for s in sel)
        whole = shape == out.shape
        target = out if whole else cupy.empty(shape, out.dtype)
        size = target.nbytes
        with kvikio.CuFile(path, "r") as f:
            got = f.pread(target.reshape(-1).view(cupy.uint8), size).get()
        if got != size:
            raise OSError(f"{path}: read {got} of {size} bytes")
        if host_crc:
            with open(path, "rb") as f:
                f.seek(size)
                tail = f.read(4)
            _check(target.reshape(-1).view(cupy.uint8).get(), tail, path)
        if not whole:
            out[sel] = target
    cupy.cuda.Device().synchronize()
    return out


def kvikio_raw(arr: Any) -> Any:
    return _kvikio_chunks(arr, host_crc=False)


def kvikio_host_crc(arr: Any) -> Any:
    return _kvikio_chunks(arr, host_crc=True)


WAYS = {"host_pinned": host_pinned, "zarr_gpu": zarr_gpu, "kvikio": kvikio_raw,
        "kvikio_host_crc": kvikio_host_crc}


def measure(arr: Any, ways: list[str], repeats: int) -> dict[str, Any]:
    import cupy

    expected = None
    results: dict[str, Any] = {}
    for name in ways:
        try:
            first = WAYS[name](arr)  # the warm-up; its result checked against the first way's
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                WAYS[name](arr)
                times.append(time.perf_counter() - t0)
        except Exception as err:  # noqa: BLE001 - a way that cannot run here is a finding
            results[name] = {"error": f"{type(err).__name__}: {err}"}
            print(f"{name:>16}: {results[name]['error']}")
            continue
        if expected is None:
            expected = first
        same = bool(cupy.array_equal(cupy.asarray(first), expected))
        best = min(times)
        results[name] = {"times_s": times, "best_s": best, "gb_s": arr.nbytes / best / 1e9,
                         "same_as_first_way": same}
        print(f"{name:>16}: {best * 1e3:8.1f} ms  {arr.nbytes / best / 1e9:6.2f} GB/s"
              f"{'' if same else '  DIFFERENT DATA'}")
        del first
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path", type=Path, help="a train saved by src_dask.save")
    p.add_argument("--ways", nargs="+", choices=list(WAYS), default=list(WAYS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    arr = _largest(args.path)
    print(f"{args.path}/{arr.path}: {arr.shape} {arr.dtype}, chunks {arr.chunks}, "
          f"{arr.nbytes / 1e9:.2f} GB")
    record: dict[str, Any] = {"path": str(args.path), "array": arr.path,
                              "shape": list(arr.shape), "chunks": list(arr.chunks),
                              "bytes": arr.nbytes,
                              "date": datetime.now(UTC).isoformat(timespec="seconds"),
                              "compat_mode_env": os.environ.get("KVIKIO_COMPAT_MODE")}
    try:
        import kvikio
        import kvikio.defaults

        record["kvikio"] = {"version": kvikio.__version__}
        record["kvikio"]["compat_mode"] = str(kvikio.defaults.get("compat_mode"))
    except Exception as err:  # noqa: BLE001 - recorded, the other ways still run
        record.setdefault("kvikio", {})["error"] = f"{type(err).__name__}: {err}"
    record["ways"] = measure(arr, args.ways, args.repeats)
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
