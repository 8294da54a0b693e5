"""Where and with what a benchmark ran: CPU, BLAS, package versions, git commit.

:class:`harness.Record` puts these at the head of every record.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def blas_info() -> Any:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not importable"
    return threadpool_info()


def versions() -> dict[str, str]:
    """Versions of Python and of every package a benchmark may use (those importable)."""
    out = {"python": platform.python_version()}
    for name in ("numpy", "dask", "distributed", "quimb", "opt_einsum", "src_dask", "scipy",
                 "zarr", "cupy", "dask_cuda", "rmm"):
        if name in sys.modules:
            out[name] = getattr(sys.modules[name], "__version__", "?")
            continue
        try:  # the installed distribution's version, without importing it
            if importlib.util.find_spec(name) is None:
                continue
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:  # e.g. cupy-cuda13x: import it
            try:
                out[name] = getattr(importlib.import_module(name), "__version__", "?")
            except Exception:  # noqa: BLE001 - broken: not recorded
                continue
        except (ImportError, ValueError):
            continue
    return out


def git_state() -> dict[str, Any]:
    """The commit benchmarked and whether src/ differed from it (a dirty tree)."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"),
                "src_modified": git("status", "--porcelain", "--", "src").splitlines()}
    except (OSError, subprocess.SubprocessError):
        return {}
