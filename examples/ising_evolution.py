"""Real-time evolution of a transverse-field Ising chain, one stack of MPOs per step.

    python examples/ising_evolution.py                      # L=12, 60 steps of dt=0.05
    python examples/ising_evolution.py --sites 14 --h 0.5 --chi-out 32

The Hamiltonian, with Pauli matrices X, Z (eigenvalues ±1) and open ends, is

    H = -J Σ_i Z_i Z_{i+1} - h Σ_i X_i

which is quimb's ``ham_ising(L, jz=-4J, bx=2h)`` (quimb uses spin operators
S = σ/2 and writes the field with a minus sign). The chain starts in the
product state |↑↑…↑⟩ (all Z_i = +1) and is quenched with the field h.

One time step is the second-order Trotter (Strang) formula

    U(dt) ≈ A(dt/2) · B(dt) · A(dt/2),   A(τ) = Π_{even i} e^{-iτ h_{i,i+1}},
                                          B(τ) = Π_{odd i}  e^{-iτ h_{i,i+1}},

with bond terms h_{i,i+1} = -J Z_i Z_{i+1} - h (w_i X_i + w_{i+1} X_{i+1}) that
share each site's field between its bonds (w = 1/2, or 1 at the chain's ends).
The gates of one layer commute, so A and B are exact MPOs: each 4×4 gate is
split by an SVD into two site cores joined by a bond of at most 4. A step is
then *one* call ``src_dask.src(A_half, B, A_half, psi, chi_out=...)``: the
stack of three MPOs and the state, compressed together without forming the
product — the exact product's bond would be up to 4·1·4·χ = 16χ.

Two references separate the two errors:

* the same Trotter formula applied gate by gate to the dense state vector:
  the difference is src_dask's compression error alone;
* quimb's exact evolution e^{-iHt}|ψ0⟩ (Krylov ``expm_multiply`` on the sparse
  Hamiltonian): the difference adds the Trotter error, O(dt²).

The script prints a table and plots ⟨Z⟩ at the centre and the errors over
time (matplotlib, optional).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import numpy as np

import src_dask
from src_dask import TensorTrain

PAULI_X = np.array([[0.0, 1.0], [1.0, 0.0]])
PAULI_Z = np.array([[1.0, 0.0], [0.0, -1.0]])
DEFAULT_PLOT = Path(__file__).with_suffix(".png")


# -- the Trotter gates and layers ---------------------------------------------------
def bond_hamiltonian(i: int, n: int, j: float, h: float) -> np.ndarray:
    """h_{i,i+1} as a 4×4 matrix on (s_i, s_{i+1}); the field of a site is shared
    equally between its bonds, so that Σ_i h_{i,i+1} = H exactly."""
    w_left = 1.0 if i == 0 else 0.5
    w_right = 1.0 if i + 1 == n - 1 else 0.5
    eye = np.eye(2)
    return (-j * np.kron(PAULI_Z, PAULI_Z)
            - h * (w_left * np.kron(PAULI_X, eye) + w_right * np.kron(eye, PAULI_X)))


def gate(hb: np.ndarray, tau: float) -> np.ndarray:
    """e^{-iτ h} of a Hermitian 4×4 ``hb``, by its eigendecomposition."""
    e, v = np.linalg.eigh(hb)
    return (v * np.exp(-1j * tau * e)) @ v.conj().T


def gates(n: int, parity: int, tau: float, j: float, h: float) -> dict[int, np.ndarray]:
    """The gates e^{-iτ h_{i,i+1}} of one layer: bonds i = parity, parity+2, …"""
    return {i: gate(bond_hamiltonian(i, n, j, h), tau) for i in range(parity, n - 1, 2)}


def layer_mpo(n: int, layer: dict[int, np.ndarray]) -> TensorTrain:
    """One layer of commuting two-site gates as an MPO in quimb's layout.

    A gate G[(u1 u2), (d1 d2)] is reshaped to the matrix G[(u1 d1), (u2 d2)]
    and split by an SVD, G = Σ_k L[u1 d1, k] R[k, u2 d2] with k ≤ 4, into two
    site cores joined by a bond k. Sites outside the layer's gates get the
    identity, and the bonds between gates have size 1.
    """
    cores: list[np.ndarray] = [np.eye(2)[None, None].astype(complex) for _ in range(n)]
    for i, g in layer.items():
        m = g.reshape(2, 2, 2, 2).transpose(0, 2, 1, 3).reshape(4, 4)
        u, s, vh = np.linalg.svd(m)
        k = int(np.sum(s > 1e-14 * s[0]))
        left = (u[:, :k] * np.sqrt(s[:k])).reshape(2, 2, k)        # (u1, d1, k)
        right = (np.sqrt(s[:k])[:, None] * vh[:k]).reshape(k, 2, 2)  # (k, u2, d2)
        cores[i] = left.transpose(2, 0, 1)[None]                    # (l=1, r=k, u, d)
        cores[i + 1] = right[:, None]                                # (l=k, r=1, u, d)
    cores[0], cores[-1] = cores[0][0], cores[-1][:, 0]  # drop the missing end bonds
    return TensorTrain(cores, "mpo", name="layer")


def apply_layer_dense(psi: np.ndarray, n: int, layer: dict[int, np.ndarray]) -> np.ndarray:
    """The same layer applied gate by gate to a dense state (site 0 most significant)."""
    psi = psi.reshape((2,) * n)
    for i, g in layer.items():
        psi = np.tensordot(g.reshape(2, 2, 2, 2), psi, axes=([2, 3], [i, i + 1]))
        psi = np.moveaxis(psi, [0, 1], [i, i + 1])
    return psi.reshape(-1)


# -- states and observables -----------------------------------------------------------
def product_state(n: int) -> TensorTrain:
    """|↑↑…↑⟩ as an MPS with bonds 1."""
    up = np.array([1.0, 0.0], dtype=complex)
    cores = [up[None]] + [up[None, None]] * (n - 2) + [up[None]]
    return TensorTrain(cores, "mps", name="psi0")


def normalized(psi: TensorTrain) -> TensorTrain:
    """``psi / ‖psi‖``; the compressed state loses a little norm at each step."""
    cores = psi.to_numpy()
    cores[0] = cores[0] / psi.norm()
    return TensorTrain(cores, "mps", name="psi")


def expectation(psi: TensorTrain, op: np.ndarray, site: int) -> float:
    """⟨ψ|O_site|ψ⟩ of a normalised MPS, contracted as an MPS (no dense vector)."""
    cores = psi.to_numpy()
    cores[site] = np.einsum("...p,qp->...q", cores[site], op)
    return float(psi.vdot(TensorTrain(cores, "mps")).real)


def dense_expectation(psi: np.ndarray, n: int, op: np.ndarray, site: int) -> float:
    """⟨ψ|O_site|ψ⟩ of a normalised dense state."""
    t = psi.reshape(2**site, 2, -1)
    return float(np.einsum("apb,qp,aqb->", t.conj(), op, t).real)


def infidelity(a: np.ndarray, b: np.ndarray) -> float:
    """1 - |⟨a|b⟩| / (‖a‖ ‖b‖); zero for the same state up to a phase."""
    return float(max(0.0, 1 - abs(np.vdot(a, b)) / (np.linalg.norm(a) * np.linalg.norm(b))))


def exact_states(n: int, j: float, h: float, dt: float, steps: int) -> np.ndarray:
    """e^{-iHt}|↑…↑⟩ at t = 0, dt, …, steps·dt, from quimb's sparse Hamiltonian."""
    import quimb
    from scipy.sparse.linalg import expm_multiply

    ham = quimb.ham_ising(n, jz=-4 * j, bx=2 * h, sparse=True)  # = -J ΣZZ - h ΣX
    psi0 = np.zeros(2**n, dtype=complex)
    psi0[0] = 1.0
    return expm_multiply(-1j * ham, psi0, start=0.0, stop=steps * dt, num=steps + 1,
                         endpoint=True)


# -- the run -------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sites", type=int, default=12, help="chain length L (default 12)")
    p.add_argument("--steps", type=int, default=60, help="time steps (default 60)")
    p.add_argument("--dt", type=float, default=0.05, help="time step (default 0.05)")
    p.add_argument("--chi-out", type=int, default=24, help="bond dimension kept (default 24)")
    p.add_argument("--oversample", default="auto",
                   help="src's oversampling: an int >= 0 or 'auto' (default)")
    p.add_argument("--j", type=float, default=1.0, help="coupling J (default 1)")
    p.add_argument("--h", type=float, default=1.0, help="transverse field h (default 1)")
    p.add_argument("--workers", type=int, default=0,
                   help="LocalCluster worker processes; 0 = Dask's threaded scheduler (default)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first step's sketch")
    p.add_argument("--plot", default=str(DEFAULT_PLOT),
                   help=f"where to save the plot (default {DEFAULT_PLOT.name} next to this "
                        "script); '' for none")
    args = p.parse_args(argv)
    if args.sites < 3:
        p.error("--sites must be at least 3")
    if args.oversample != "auto":
        args.oversample = int(args.oversample)
    return args


def main(argv: list[str] | None = None) -> dict:
    """Run the evolution; print the table, save the plot, return the measured errors."""
    args = parse_args(argv)
    n, dt, centre = args.sites, args.dt, args.sites // 2
    out = sys.stdout.write
    out(f"H = -J ΣZZ - h ΣX, L={n}, J={args.j}, h={args.h}, dt={dt}, {args.steps} steps, "
        f"chi_out={args.chi_out}, oversample={args.oversample}; <Z> at site {centre}\n")

    # A(dt/2) and B(dt): the MPOs of one Strang step, and the same gates for the dense check.
    half_even = gates(n, 0, dt / 2, args.j, args.h)
    full_odd = gates(n, 1, dt, args.j, args.h)
    a_half, b_full = layer_mpo(n, half_even), layer_mpo(n, full_odd)
    out(f"step MPOs: A(dt/2) bonds {a_half.bond_dims}, B(dt) bonds {b_full.bond_dims}\n")

    t0 = time.perf_counter()
    exact = exact_states(n, args.j, args.h, dt, args.steps)
    t_exact = time.perf_counter() - t0

    with _client(args.workers) as client:
        psi = product_state(n)
        trotter = exact[0].copy()
        rows = [_row(0.0, psi, trotter, exact[0], n, centre)]
        t0 = time.perf_counter()
        for step in range(1, args.steps + 1):
            # the whole Strang step is one compressed product of a stack of four trains
            psi = src_dask.src(a_half, b_full, a_half, psi, chi_out=args.chi_out,
                               oversample=args.oversample, seed=args.seed + step,
                               client=client)
            psi = normalized(psi)
            for layer in (half_even, full_odd, half_even):
                trotter = apply_layer_dense(trotter, n, layer)
            rows.append(_row(step * dt, psi, trotter, exact[step], n, centre))
        t_src = time.perf_counter() - t0

    _print_table(rows, every=max(1, args.steps // 10))
    res = {
        "max_infidelity_vs_trotter": max(r["inf_trotter"] for r in rows),
        "max_infidelity_vs_exact": max(r["inf_exact"] for r in rows),
        "max_dz_vs_trotter": max(r["dz_trotter"] for r in rows),
        "max_dz_vs_exact": max(r["dz_exact"] for r in rows),
        "max_dz_trotter_vs_exact": max(abs(r["z_trotter"] - r["z_exact"]) for r in rows),
        "final_bonds": psi.bond_dims,
        "rows": rows,
        "plot": None,
    }
    out(f"\nmax over time      1 - fidelity   |Δ<Z>|\n"
        f"  vs dense Trotter  {res['max_infidelity_vs_trotter']:.1e}       "
        f"{res['max_dz_vs_trotter']:.1e}   (src_dask's compression error)\n"
        f"  vs exact e^-iHt   {res['max_infidelity_vs_exact']:.1e}       "
        f"{res['max_dz_vs_exact']:.1e}   (compression + Trotter error)\n"
        f"final bonds {psi.bond_dims}; src_dask {t_src:.1f} s for {args.steps} steps, "
        f"quimb exact {t_exact:.2f} s\n")
    if args.plot:
        res["plot"] = _plot(rows, args, Path(args.plot))
    return res


def _client(workers: int):
    """A LocalCluster client of ``workers`` processes, or nothing (threaded scheduler)."""
    if workers <= 0:
        return contextlib.nullcontext(None)
    from distributed import Client, LocalCluster

    stack = contextlib.ExitStack()
    cluster = stack.enter_context(LocalCluster(n_workers=workers, threads_per_worker=1,
                                               dashboard_address=":0"))
    client = stack.enter_context(Client(cluster))
    sys.stdout.write(f"dashboard: {client.dashboard_link}\n")

    @contextlib.contextmanager
    def held():
        with stack:
            yield client

    return held()


def _row(t: float, psi: TensorTrain, trotter: np.ndarray, exact: np.ndarray,
         n: int, centre: int) -> dict:
    """The observables and errors of one time: src_dask's MPS against both references."""
    dense = psi.to_dense()  # L is small enough for the references anyway
    z_src = expectation(psi, PAULI_Z, centre)
    z_trotter = dense_expectation(trotter, n, PAULI_Z, centre)
    z_exact = dense_expectation(exact, n, PAULI_Z, centre)
    return {
        "t": t,
        "z_src": z_src,
        "z_trotter": z_trotter,
        "z_exact": z_exact,
        "x_src": expectation(psi, PAULI_X, centre),
        "dz_trotter": abs(z_src - z_trotter),
        "dz_exact": abs(z_src - z_exact),
        "inf_trotter": infidelity(dense, trotter),
        "inf_exact": infidelity(dense, exact),
        "inf_trotter_exact": infidelity(trotter, exact),
        "bond": max(psi.bond_dims),
    }


def _print_table(rows: list[dict], every: int) -> None:
    out = sys.stdout.write
    out(f"\n{'t':>5} {'<Z> src':>9} {'<Z> exact':>9} {'<X> src':>9} {'bond':>4}  "
        f"{'1-F Trotter':>11} {'1-F exact':>9}  {'|dZ| Trotter':>12} {'|dZ| exact':>10}\n")
    for k, r in enumerate(rows):
        if k % every and k != len(rows) - 1:
            continue
        out(f"{r['t']:5.2f} {r['z_src']:9.5f} {r['z_exact']:9.5f} {r['x_src']:9.5f} "
            f"{r['bond']:4d}  {r['inf_trotter']:11.1e} {r['inf_exact']:9.1e}  "
            f"{r['dz_trotter']:12.1e} {r['dz_exact']:10.1e}\n")


def _plot(rows: list[dict], args: argparse.Namespace, path: Path) -> Path | None:
    """⟨Z⟩ at the centre (src_dask, dense Trotter, exact) and the errors over time."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.stdout.write("matplotlib is not installed: no plot (pip install matplotlib)\n")
        return None
    t = np.array([r["t"] for r in rows])
    col = {k: np.array([r[k] for r in rows]) for k in rows[0]}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 7), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    top.plot(t, col["z_exact"], "k-", lw=2.5, alpha=0.35, label=r"exact $e^{-iHt}$ (quimb)")
    top.plot(t, col["z_trotter"], "C1--", lw=1.2, label="dense 2nd-order Trotter")
    top.plot(t, col["z_src"], "C0o", ms=3.5, label=f"src_dask MPO stack, $\\chi$={args.chi_out}")
    top.set_ylabel(rf"$\langle Z_{{{args.sites // 2}}}\rangle$")
    top.set_title(rf"TFIM quench, $H=-J\sum ZZ-h\sum X$: L={args.sites}, J={args.j:g}, "
                  rf"h={args.h:g}, dt={args.dt:g}")
    top.legend(loc="best", fontsize=9)
    floor = 1e-17  # log scale: errors are exact zeros until the bond reaches chi_out
    later = slice(1, None)  # t = 0 is the exact product state
    for key, style, label in [
            ("inf_trotter", "C0-", "1-F, src_dask vs dense Trotter (compression)"),
            ("dz_trotter", "C0:", r"$|\Delta Z|$, src_dask vs dense Trotter"),
            ("inf_exact", "C3-", "1-F, src_dask vs exact (+ Trotter error)"),
            ("dz_exact", "C3:", r"$|\Delta Z|$, src_dask vs exact")]:
        bottom.semilogy(t[later], col[key][later] + floor, style, label=label)
    bottom.set_ylim(1e-13, 1.0)
    bottom.set_xlabel("t")
    bottom.set_ylabel("error")
    bottom.legend(loc="upper left", fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    sys.stdout.write(f"plot saved to {path}\n")
    return path


if __name__ == "__main__":
    main()
