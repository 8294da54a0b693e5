"""src_dask on Slurm through dask-jobqueue: the driver runs where you are (a login
node), and each Dask worker is a Slurm job that ``SLURMCluster`` submits for you.

    pip install "src_dask[hpc]"
    python examples/slurm/jobqueue.py --inputs DIR --store run.zarr --jobs 4
    python examples/slurm/jobqueue.py --gpu --inputs DIR --store run.zarr --jobs 4 \\
        --extra=--partition=gpu

DIR holds the factors saved with ``src_dask.save`` as ``DIR/0``, ``DIR/1``, …
(leftmost first). The job's size (cores, memory, walltime, partition, account)
comes from the options below or from Dask's config (``jobqueue.slurm`` in
``~/.config/dask/jobqueue.yaml``, dask-jobqueue's own defaults). Each job starts one
CPU worker (``dask worker``) or, with ``--gpu``, one GPU worker: ``dask cuda worker``
(dask-jobqueue's ``worker_command``, the ``gpu`` extra on the nodes) on the job's one
GPU (``--gres=gpu:1``), with the options of ``src_dask.sbatch``'s workers over TCP.
The scheduler runs in this process and listens on ``--host`` (default: this node's
name, which the workers' nodes must reach). Rerunning the same command after an
interruption resumes the run from the store.
"""
# ruff: noqa: T201

from __future__ import annotations

import argparse
import os
import socket
from typing import Any

from distributed import Client

import src_dask

#: What a GPU job's ``dask cuda worker`` is given, as src_dask.sbatch's workers over
#: TCP: spilling to host memory past 70 % of the GPU, every CuPy allocation through
#: RMM's asynchronous allocator (else CuPy's own pool grows beside it).
GPU_WORKER_ARGS = ["--device-memory-limit", "0.7", "--rmm-async",
                   "--set-rmm-allocator-for-libs", "cupy"]


def cluster_options(gpu: bool, host: str, extra: list[str] = (), **job: Any) -> dict[str, Any]:
    """``SLURMCluster`` keyword arguments for jobs of one worker each: ``dask worker``,
    or with ``gpu`` one ``dask cuda worker`` on the job's GPU; ``host``: where the
    scheduler listens; ``extra``: more ``#SBATCH`` directives; ``job``: cores,
    memory, walltime and the like (unset ones from Dask's config)."""
    options: dict[str, Any] = {"processes": 1, "scheduler_options": {"host": host},
                               "job_extra_directives": list(extra), **job}
    if gpu:
        options["job_extra_directives"].append("--gres=gpu:1")
        options["worker_command"] = "dask_cuda.cli"  # `python -m dask_cuda.cli`: the worker
        options["worker_extra_args"] = [*options.get("worker_extra_args", []), *GPU_WORKER_ARGS]
    return options


def main(argv: list[str] | None = None) -> None:
    from dask_jobqueue import SLURMCluster

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--chi-out", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2, help="Slurm jobs, one worker each")
    p.add_argument("--gpu", action="store_true",
                   help="each job one GPU and a `dask cuda worker` on it")
    p.add_argument("--cores", type=int, default=None, help="per job (default: Dask config)")
    p.add_argument("--memory", default=None, help="per job, e.g. 16GB (default: Dask config)")
    p.add_argument("--walltime", default=None, help="per job, e.g. 01:00:00")
    p.add_argument("--host", default=socket.gethostname(),
                   help="the address the scheduler listens on (the workers connect to it)")
    p.add_argument("--timeout", type=float, default=600,
                   help="seconds to wait for the jobs' workers (they queue)")
    p.add_argument("--extra", action="append", default=[],
                   help="another #SBATCH directive, e.g. --extra=--partition=gpu")
    args = p.parse_args(argv)

    job = {k: v for k, v in (("cores", args.cores), ("memory", args.memory),
                             ("walltime", args.walltime)) if v is not None}
    factors = sorted((d for d in os.listdir(args.inputs) if d.isdigit()), key=int)
    trains = [src_dask.open(os.path.join(args.inputs, d)) for d in factors]
    with SLURMCluster(**cluster_options(args.gpu, args.host, args.extra, **job)) as cluster:
        cluster.scale(jobs=args.jobs)
        with Client(cluster) as client:
            client.wait_for_workers(args.jobs, timeout=args.timeout)
            y = src_dask.src(*trains, chi_out=args.chi_out, seed=args.seed, client=client,
                             store=args.store)
            print(f"{y}\nwritten to {args.store}/result")


if __name__ == "__main__":
    main()
