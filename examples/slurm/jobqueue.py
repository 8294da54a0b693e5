"""src_dask on Slurm through dask-jobqueue: the driver runs where you are (a login
node), and each Dask worker is a Slurm job that ``SLURMCluster`` submits for you.

    pip install "src_dask[hpc]"
    python examples/slurm/jobqueue.py --inputs DIR --store run.zarr --jobs 4

DIR holds the factors saved with ``src_dask.save`` as ``DIR/0``, ``DIR/1``, …
(leftmost first). The job's size (cores, memory, walltime, partition, account)
comes from the options below or from Dask's config (``jobqueue.slurm`` in
``~/.config/dask/jobqueue.yaml``, dask-jobqueue's own defaults). This starts CPU
workers (``dask worker``); for GPU nodes ``src_dask.sbatch`` (one ``dask cuda
worker`` per node) is the tested path. The scheduler runs in this process and listens on
``--host`` (default: this node's name, which the workers' nodes must reach).
Rerunning the same command after an interruption resumes the run from the store.
"""
# ruff: noqa: T201

from __future__ import annotations

import argparse
import os
import socket

from dask_jobqueue import SLURMCluster
from distributed import Client

import src_dask


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--chi-out", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2, help="Slurm jobs, one worker each")
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

    options = {k: v for k, v in (("cores", args.cores), ("memory", args.memory),
                                 ("walltime", args.walltime)) if v is not None}
    extra = list(args.extra)
    factors = sorted((d for d in os.listdir(args.inputs) if d.isdigit()), key=int)
    trains = [src_dask.open(os.path.join(args.inputs, d)) for d in factors]
    with SLURMCluster(processes=1, job_extra_directives=extra,
                      scheduler_options={"host": args.host}, **options) as cluster:
        cluster.scale(jobs=args.jobs)
        with Client(cluster) as client:
            client.wait_for_workers(args.jobs, timeout=args.timeout)
            y = src_dask.src(*trains, chi_out=args.chi_out, seed=args.seed, client=client,
                             store=args.store)
            print(f"{y}\nwritten to {args.store}/result")


if __name__ == "__main__":
    main()
