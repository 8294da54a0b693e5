"""src_dask inside one Slurm allocation through dask-jobqueue's ``SLURMRunner``:
every task of ``srun`` runs this script; rank 0 becomes the scheduler, rank 1 runs
the code below (the client), the others become workers.

    salloc -N 2 --ntasks-per-node=3      # or an sbatch script with the same srun line
    srun python examples/slurm/runner.py --inputs DIR --store run.zarr
    srun --gpus-per-task=1 python examples/slurm/runner.py --gpu --inputs DIR --store run.zarr

``--gpu``: the workers are ``dask_cuda.CUDAWorker`` (one GPU per task, the ``gpu``
extra). DIR holds the factors saved with ``src_dask.save`` as ``DIR/0``, ``DIR/1``, …
(leftmost first); the scheduler file goes to ``--scheduler-file`` (default: in the
current directory, named after the job), which must be on a file system every node
sees. Rerunning after an interruption resumes the run from the store.
"""
# ruff: noqa: T201

from __future__ import annotations

import argparse
import os

from dask_jobqueue.slurm import SLURMRunner
from distributed import Client

import src_dask


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--chi-out", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="per worker")
    p.add_argument("--gpu", action="store_true", help="workers as dask_cuda.CUDAWorker")
    p.add_argument("--scheduler-file", default="scheduler-{job_id}.json")
    p.add_argument("--timeout", type=float, default=300,
                   help="seconds to wait for the workers")
    args = p.parse_args(argv)

    worker = {"worker_class": "dask_cuda.CUDAWorker"} if args.gpu else {}
    with SLURMRunner(scheduler_file=args.scheduler_file,
                     worker_options={"nthreads": args.threads}, **worker) as runner:
        with Client(runner) as client:  # only rank 1 gets here
            client.wait_for_workers(runner.n_workers, timeout=args.timeout)
            factors = sorted((d for d in os.listdir(args.inputs) if d.isdigit()), key=int)
            trains = [src_dask.open(os.path.join(args.inputs, d)) for d in factors]
            y = src_dask.src(*trains, chi_out=args.chi_out, seed=args.seed, client=client,
                             store=args.store)
            print(f"{y}\nwritten to {args.store}/result on {runner.n_workers} workers")


if __name__ == "__main__":
    main()
