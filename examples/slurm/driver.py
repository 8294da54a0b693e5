"""The driver of examples/slurm/src_dask.sbatch: connect, run src on Zarr trains.

    python driver.py --scheduler-file scheduler.json --inputs DIR --store run.zarr
        [--tls-ca-file ca.pem --tls-cert cert.pem --tls-key key.pem]

DIR holds the factors of the product saved with ``src_dask.save`` as
``DIR/0``, ``DIR/1``, … (leftmost first). The result stays in the run store
(``run.zarr/result``); rerunning the same command after an interruption
resumes the run. With the --tls-* files (those the scheduler and workers were
started with) the driver connects over TLS; without them, Dask config
(``distributed.comm.tls``) decides.
"""
# ruff: noqa: T201

from __future__ import annotations

import argparse
import os
import time

from distributed import Client, Security

import src_dask


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--scheduler-file", required=True)
    p.add_argument("--inputs", required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--chi-out", type=int, default=1000)
    p.add_argument("--oversample", default="0")
    p.add_argument("--workers", type=int, default=1, help="wait for this many workers")
    p.add_argument("--timeout", type=float, default=300,
                   help="seconds to wait for them (then fail, naming how many came)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tls-ca-file", help="TLS: the CA's certificate (PEM)")
    p.add_argument("--tls-cert", help="TLS: this client's certificate, signed by the CA")
    p.add_argument("--tls-key", help="TLS: its private key")
    args = p.parse_args(argv)
    tls = (args.tls_ca_file, args.tls_cert, args.tls_key)
    if any(tls) and not all(tls):
        p.error("--tls-ca-file, --tls-cert and --tls-key go together")
    security = None  # Dask config's
    if all(tls):
        security = Security(tls_ca_file=args.tls_ca_file, tls_client_cert=args.tls_cert,
                            tls_client_key=args.tls_key, require_encryption=True)

    factors = sorted((d for d in os.listdir(args.inputs) if d.isdigit()), key=int)
    trains = [src_dask.open(os.path.join(args.inputs, d)) for d in factors]
    oversample = args.oversample if args.oversample == "auto" else int(args.oversample)
    with Client(scheduler_file=args.scheduler_file, security=security) as client:
        try:
            client.wait_for_workers(args.workers, timeout=args.timeout)
        except TimeoutError:
            raise SystemExit(f"driver.py: {len(client.nthreads())} of {args.workers} workers "
                             f"joined within {args.timeout:g} s (see the workers' errors above)"
                             ) from None
        print(f"dashboard: {client.dashboard_link}; {len(client.nthreads())} workers")
        t0 = time.perf_counter()
        y = src_dask.src(*trains, chi_out=args.chi_out, oversample=oversample,
                         seed=args.seed, client=client, store=args.store)
        print(f"{y}\nwritten to {args.store}/result in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
