"""quimb's layouts ↔ rank 4: the one place that pads and unpads site cores.

quimb's default layouts (docs/design.md §1)::

    MPS   first (r, p)      middle (l, r, p)      last (l, p)
    MPO   first (r, u, d)   middle (l, r, u, d)   last (l, u, d)

Inside a run every core is padded to rank 4 ``(a, b, up, down)``: size-1
bonds at the ends of a train, a size-1 down leg for an MPS, and up and down
swapped for a transposed factor (a bra stack's). One set of equations then
serves every depth and both orientations. The functions index without
copying and work on NumPy, CuPy and Dask arrays alike.
"""

from __future__ import annotations

from typing import Any

#: Rank of (first, middle, last) site cores for each kind of train.
RANKS: dict[str, tuple[int, int, int]] = {"mps": (2, 3, 2), "mpo": (3, 4, 3)}


def role(site: int, n: int) -> int:
    """0 for the first site, 2 for the last, 1 in between."""
    return 0 if site == 0 else 2 if site == n - 1 else 1


def padded_shape(shape: tuple[int, ...], kind: str, site: int, n: int,
                 transpose: bool = False) -> tuple[int, int, int, int]:
    """The rank-4 shape ``(a, b, up, down)`` of a core of ``shape``."""
    out = [int(s) for s in shape]
    if site == 0:
        out.insert(0, 1)
    if site == n - 1:
        out.insert(1, 1)
    if kind == "mps":
        out.append(1)
    if transpose:
        out[2], out[3] = out[3], out[2]
    return tuple(out)  # type: ignore[return-value]


def pad_bonds(core: Any, site: int, n: int) -> Any:
    """``core`` with its missing end bonds as size-1 axes: ``(l, r, legs…)``."""
    if site == 0:
        core = core[None]
    if site == n - 1:
        core = core[:, None]
    return core


def pad(core: Any, kind: str, site: int, n: int, transpose: bool = False) -> Any:
    """``core`` as ``(a, b, up, down)`` (a view: no copy, no cast)."""
    core = pad_bonds(core, site, n)
    if kind == "mps":
        core = core[..., None]
    return core.swapaxes(2, 3) if transpose else core


def unpad(core: Any, kind: str, site: int, n: int) -> Any:
    """A rank-4 output core back in quimb's layout for an MPS or MPO result."""
    if kind == "mps":
        core = core[..., 0]
    if site == n - 1:
        core = core[:, 0]
    if site == 0:
        core = core[0]
    return core


def dimension_names(kind: str, site: int, n: int) -> tuple[str, ...]:
    """Names of the axes of a core in quimb's layout, for the arrays src_dask writes:
    the bonds it shares with its neighbours (``bond_{j-1}``, ``bond_j``: the same name
    in both cores, so that readers such as xarray see one dimension), then its
    physical leg ``phys_j`` (MPS) or legs ``up_j``, ``down_j`` (MPO)."""
    legs = (f"phys_{site}",) if kind == "mps" else (f"up_{site}", f"down_{site}")
    left = (f"bond_{site - 1}",) if site > 0 else ()
    right = (f"bond_{site}",) if site < n - 1 else ()
    return (*left, *right, *legs)
