"""Apply a random MPO to a random MPS with src_dask and check against quimb.

    python examples/quickstart.py
"""

import quimb.tensor as qtn
from distributed import Client, LocalCluster

import src_dask

if __name__ == "__main__":
    A = qtn.MPO_rand(30, bond_dim=4, phys_dim=2, dtype="complex128", seed=1)
    psi = qtn.MPS_rand_state(30, bond_dim=32, dtype="complex128", seed=2)

    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        y = src_dask.apply(A, psi, chi_out=128, seed=0, client=client)  # the exact bond is 128

    exact = psi.gate_with_mpo(A, method="direct")
    yq = y.to_quimb()
    fidelity = abs(yq.H @ exact) / (yq.norm() * exact.norm())
    print(f"{y}\n1 - fidelity against quimb's exact product: {1 - fidelity:.1e}")  # noqa: T201
