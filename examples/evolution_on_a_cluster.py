"""Time evolution on a Dask cluster, the state staying on the workers between steps.

    python examples/evolution_on_a_cluster.py                  # L=40, chi_out=64, 20 steps
    python examples/evolution_on_a_cluster.py --sites 60 --chi-out 128 --workers 2

The quench of examples/ising_evolution.py (H = -J ΣZZ - h ΣX from |↑…↑⟩), one Strang
step U(dt) ≈ A(dt/2)·B(dt)·A(dt/2) per call, as a quimb user would run a TEBD-like
loop, but on a Client: ``src_dask.src(A, B, A, psi, ..., persist=True)`` leaves the
new state's cores in the workers' memory, and the next step takes them there — only
their shapes come to the client, which brings the state home once, at the end. The
same loop runs in quimb in this process (``tensor_network_1d_compress(...,
method="src")`` on the same stack of three MPOs and the state); the script prints the
time per step of both, and how far apart their final states are (both compress with
random sketches of their own: the difference is of the compression error's size).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the MPOs of ising_evolution.py

from ising_evolution import PAULI_Z, expectation, gates, layer_mpo, product_state  # noqa: E402

import src_dask  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sites", type=int, default=40, help="chain length L (default 40)")
    p.add_argument("--steps", type=int, default=20, help="time steps (default 20)")
    p.add_argument("--dt", type=float, default=0.1, help="time step (default 0.1)")
    p.add_argument("--chi-out", type=int, default=64, help="bond of the state (default 64)")
    p.add_argument("--workers", type=int, default=2,
                   help="LocalCluster workers of one thread each (default 2)")
    p.add_argument("--no-quimb", action="store_true", help="skip quimb's loop")
    return p.parse_args(argv)


def evolve_on_cluster(client, a_half, b_full, psi, steps: int, chi_out: int) -> tuple:
    """``steps`` Strang steps of ``psi`` on ``client``, the state kept on the workers;
    the final state (brought home) and the seconds of each step."""
    seconds = []
    for step in range(steps):
        t0 = time.perf_counter()
        psi = src_dask.src(a_half, b_full, a_half, psi, chi_out=chi_out, seed=step,
                           client=client, persist=True)
        seconds.append(time.perf_counter() - t0)
    return src_dask.TensorTrain(psi.to_numpy(), "mps", name="psi"), seconds


def evolve_in_quimb(a_half, b_full, psi, steps: int, chi_out: int) -> tuple:
    """The same loop with quimb's SRC in this process: the final state (a quimb MPS)
    and the seconds of each step."""
    import quimb.tensor as qtn

    a, b, state = a_half.to_quimb(), b_full.to_quimb(), psi.to_quimb()
    seconds = []
    for step in range(steps):
        t0 = time.perf_counter()
        stack = qtn.tensor_network_apply_op_vec(a, state)
        stack = qtn.tensor_network_apply_op_vec(b, stack)
        stack = qtn.tensor_network_apply_op_vec(a, stack)
        state = qtn.tensor_network_1d_compress(stack, max_bond=chi_out, method="src",
                                               seed=step)
        seconds.append(time.perf_counter() - t0)
    return state, seconds


def main(argv: list[str] | None = None) -> dict:
    """Run both loops; print and return the times per step and the final states' gap."""
    from distributed import Client, LocalCluster

    args = parse_args(argv)
    n, centre = args.sites, args.sites // 2
    a_half = layer_mpo(n, gates(n, 0, args.dt / 2, 1.0, 1.0))
    b_full = layer_mpo(n, gates(n, 1, args.dt, 1.0, 1.0))
    psi0 = product_state(n)
    with LocalCluster(n_workers=args.workers, threads_per_worker=1,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        psi, ours = evolve_on_cluster(client, a_half, b_full, psi0, args.steps, args.chi_out)
    out = {"sites": n, "steps": args.steps, "chi_out": args.chi_out,
           "src_dask_seconds_per_step": sorted(ours)[len(ours) // 2],
           "z_centre": expectation(psi, PAULI_Z, centre), "bonds": psi.bond_dims}
    line = (f"L={n}, chi_out={args.chi_out}, {args.steps} steps of dt={args.dt}: "
            f"src_dask on {args.workers} workers {out['src_dask_seconds_per_step']:.3f} s a "
            f"step (median; first {ours[0]:.3f} s), <Z_{centre}> = {out['z_centre']:.6f}")
    if not args.no_quimb:
        theirs_state, theirs = evolve_in_quimb(a_half, b_full, psi0, args.steps, args.chi_out)
        overlap = abs(psi.vdot(theirs_state)) ** 2 / (psi.norm() * theirs_state.norm()) ** 2
        out.update(quimb_seconds_per_step=sorted(theirs)[len(theirs) // 2],
                   infidelity_vs_quimb=1 - overlap)
        line += (f"; quimb {out['quimb_seconds_per_step']:.3f} s a step "
                 f"({out['src_dask_seconds_per_step'] / out['quimb_seconds_per_step']:.2f}x), "
                 f"1 - fidelity between the two {out['infidelity_vs_quimb']:.1e}")
    sys.stdout.write(line + "\n")
    return out


if __name__ == "__main__":
    main()
