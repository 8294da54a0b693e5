"""The on-disk layout of a run store: the names of its groups and arrays and the
keys of its attributes, in one place (zarr's metadata layer; the reads and
writes are :class:`~src_dask._runstore.RunStore`'s, the policy
:class:`~src_dask._runstore.OpenRun`'s)::

    store/                    attrs: format "src_dask.run", version, run_id, fingerprint
                              (inputs and options), seed, sketch, chunk, sites,
                              bytes_planned, complete (written last: only then is it a
                              result)
    store/.src_dask.lock      the writer's host, pid and run (one writer per store)
    store/env/site_j          C_j, (s, a_1, …, a_k), chunked along s by blocks
                              of sketch columns; written by pass 1, read by pass 2
    store/progress            attrs: pass2_next (the next site pass 2 will do);
                              array pass1[c] = 1 once block c's chain is written
    store/eta/site_j          η_j, the padded output core of pass 2 at site j
    store/S/site_j            the right environment pass 2 resumes from
    store/result/site_j       the output cores in quimb's layout; attrs: discarded
"""

from __future__ import annotations

from dataclasses import dataclass

from ._lock import LOCK


@dataclass(frozen=True)
class RunLayout:
    """Where a run store keeps each thing: group and array names, attribute keys."""

    format: str = "src_dask.run"  # the group attribute ``format`` of every run store
    version: int = 2  # the layout's version (attribute ``version``)
    lock: str = LOCK  # the lock file (:mod:`._lock`)
    env: str = "env"  # group of the sketched environments C_j (pass 1)
    progress: str = "progress"  # group of what is done: array pass1, attribute pass2_next
    pass1: str = "pass1"  # array of ``progress``: 1 per block of sketch columns done
    pass2_next: str = "pass2_next"  # attribute of ``progress``: the next site of pass 2
    eta: str = "eta"  # group of pass 2's padded output cores η_j
    right_env: str = "S"  # group of the right environment pass 2 resumes from
    result: str = "result"  # group of the output cores, in quimb's layout
    discarded: str = "discarded"  # attribute of ``result``: the rounding's weights
    complete: str = "complete"  # group attribute, True once the result is whole
    # the group's attributes every run store has, and their types (see :meth:`problem`)
    attributes: tuple[tuple[str, type], ...] = (
        ("format", str), ("version", int), ("run_id", str), ("fingerprint", dict),
        ("seed", int), ("sketch", int), ("chunk", int), ("sites", int), ("complete", bool))

    @property
    def entries(self) -> tuple[str, ...]:
        """What a run writes at the top of its store: all that ``overwrite`` deletes
        (not the lock, not what someone else put there)."""
        return ("zarr.json", self.env, self.progress, self.eta, self.right_env, self.result)

    @property
    def pass1_path(self) -> str:
        return f"{self.progress}/{self.pass1}"

    def env_site(self, site: int) -> str:
        return f"{self.env}/site_{site}"

    def eta_site(self, site: int) -> str:
        return f"{self.eta}/site_{site}"

    def right_env_site(self, site: int) -> str:
        return f"{self.right_env}/site_{site}"

    def result_site(self, site: int) -> str:
        return f"{self.result}/site_{site}"

    def problem(self, attrs: dict) -> str | None:
        """What is wrong with a run store's attributes (hand-edited, or another
        version), or None. (A store of another number of sites is not damaged: it
        holds another run.)"""
        for key, kind in self.attributes:
            value = attrs.get(key)
            if key not in attrs:
                return f"{key} is missing"
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                return f"{key} is {value!r}, expected {kind.__name__}"
        if attrs["version"] != self.version:
            return f"format version {attrs['version']}, this src_dask writes {self.version}"
        if attrs["sketch"] < 1 or not 1 <= attrs["chunk"] <= attrs["sketch"]:
            return f"sketch {attrs['sketch']} and chunk {attrs['chunk']} do not make blocks"
        if attrs["sites"] < 2 or attrs["seed"] < 0:
            return f"sites {attrs['sites']}, seed {attrs['seed']}"
        return None


#: The layout this src_dask writes and reads.
LAYOUT = RunLayout()


def env_dims(site: int, factors: int) -> tuple[str, ...]:
    """Axes of a sketched environment ``C_site[s, a_1..a_k]``: the sketch columns, then
    each factor's bond left of ``site``."""
    return ("sketch", *(f"bond_{site - 1}_factor_{i}" for i in range(factors)))


def eta_dims(site: int) -> tuple[str, ...]:
    """Axes of the padded output core η_site: its bonds, its up and down legs."""
    return (f"bond_{site - 1}", f"bond_{site}", f"up_{site}", f"down_{site}")


def right_env_dims(site: int, factors: int) -> tuple[str, ...]:
    """Axes of the right environment ``S_site[r, b_1..b_k]`` pass 2 resumes from: the
    output's bond right of ``site``, then each factor's bond there."""
    return (f"bond_{site}", *env_dims(site + 1, factors)[1:])
