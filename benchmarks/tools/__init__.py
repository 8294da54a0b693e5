"""What the benchmarks measure with and how their records are read: the provenance of a
record, the transfer and event-loop instruments, the task-timeline analysis, the peer
project src-method, the plots, the profiles, the plans of described machines, and the
scripts that measure src_dask's own internals (UCX comm waits, kernels).

The scripts here import the benchmarks' shared modules (``harness``, ``device``, ...)
by name: run them with ``benchmarks/`` on the path,
``PYTHONPATH=src:benchmarks python benchmarks/tools/timeline.py ...``.
"""
