"""Apply a random MPO to a random MPS with src_dask and check the result: its exact
relative error against the uncompressed product, and its fidelity with quimb's
uncompressed product (quimb's ``direct`` method with no cutoff).

    python examples/quickstart.py [--sites N] [--chi-out N]
"""

import argparse

import quimb.tensor as qtn
from distributed import Client, LocalCluster

import src_dask


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sites", type=int, default=30, help="sites (default 30)")
    p.add_argument("--chi-out", type=int, default=128,
                   help="bond of the result (default 128, the product's exact bond)")
    args = p.parse_args(argv)
    A = qtn.MPO_rand(args.sites, bond_dim=4, phys_dim=2, dtype="complex128", seed=1)
    psi = qtn.MPS_rand_state(args.sites, bond_dim=32, dtype="complex128", seed=2)

    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        y = src_dask.apply(A, psi, chi_out=args.chi_out, seed=0, client=client)
        error = src_dask.distance(y, A, psi, client=client)  # streamed, never dense

    exact = psi.gate_with_mpo(A, method="direct", cutoff=0.0)  # uncompressed: bond 128
    yq = y.to_quimb()
    fidelity = abs(yq.H @ exact) / (yq.norm() * exact.norm())
    print(f"{y}\nrelative error against the exact product: {error:.1e}\n"  # noqa: T201
          f"1 - fidelity against quimb's uncompressed product: {1 - fidelity:.1e}")


if __name__ == "__main__":
    main()
