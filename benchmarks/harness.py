# ruff: noqa: T201
"""What every benchmark script shares: its driver, command line, record, table, targets.

- :class:`Config` and :func:`execute_benchmark`: the one driver of every benchmark
  (dask-cuda's ``benchmarks/common.py`` is the model): a benchmark says what it
  measures, where its record goes, what the record starts with, how one run fills it
  and how its table is printed; the driver makes the device and the record, prints
  its header, runs, prints the table and writes the record.
- :func:`parser`: an argument parser with the shared options (``--quick``,
  ``--device``, ``--repeats``, ``--seed``, ``--gemm-n``, ``--out``, ``--merge``)
  and :meth:`Parser.sized` for options whose default depends on ``--quick``.
- :class:`Record`: a JSON record that starts with its provenance (what is
  measured, date, host, CPU, device, BLAS, versions, git commit, command,
  environment; the machine facts come from :mod:`provenance`). Records are
  written in place under ``benchmarks/results/``, one file per benchmark and
  size; git keeps their history.
- :func:`print_table`: one aligned table and its legend.
- :class:`Target`, :func:`check_targets`, :func:`print_targets`: bounds a run
  must meet, checked the same way by every script.
- :func:`captured_log`: the messages a library logs while a block runs (what it
  decided, what its own log times).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import socket
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from tools.provenance import blas_info, cpu_model, git_state, versions

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


# -- the driver ---------------------------------------------------------------------
class Config(NamedTuple):
    """One benchmark, as :func:`execute_benchmark` runs it."""

    measures: str
    """What the record measures (its ``benchmark`` field)."""
    name: Callable[[argparse.Namespace, Any], str]
    """The record's file name under ``benchmarks/results`` from the options and device."""
    device: Callable[[argparse.Namespace], Any]
    """The :class:`device.Device` the benchmark runs on."""
    run: Callable[[argparse.Namespace, Record, Any], None]
    """Fills the record on the device (``record.save()`` between steps of a long run)."""
    report: Callable[[Record], None]
    """Prints the record's table."""
    fields: Callable[[argparse.Namespace], dict[str, Any]] = lambda args: {}
    """What the record holds before the run (the problem, the options)."""


def execute_benchmark(config: Config, args: argparse.Namespace) -> Record:
    """Run one benchmark: its device and record (provenance, then ``config.fields``),
    the header, ``config.run``, the table, the record written (``--out``, or under
    ``benchmarks/results``; nowhere for ``--quick`` without ``--out``)."""
    warnings.filterwarnings("ignore", message="Couldn't import `kahypar`")
    device = config.device(args)
    path = output_path(getattr(args, "out", None), config.name(args, device),
                       getattr(args, "quick", False))
    record = Record(config.measures, device, path, **config.fields(args))
    print(record.header())
    config.run(args, record, device)
    record.save()
    config.report(record)
    return record


# -- the command line ----------------------------------------------------------------
class Parser(argparse.ArgumentParser):
    """An argument parser whose :meth:`sized` options take one default for full runs
    and another with ``--quick``."""

    def __init__(self, doc: str, **kwargs: Any):
        super().__init__(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter,
                         **kwargs)
        self._sized: dict[str, tuple[Any, Any]] = {}

    def sized(self, *flags: str, full: Any, quick: Any, help: str = "", **kwargs: Any) -> None:
        """An option defaulting to ``full``, or to ``quick`` with ``--quick``."""
        def text(v: Any) -> str:
            return " ".join(map(str, v)) if isinstance(v, list | tuple) else str(v)

        action = self.add_argument(*flags, default=None, **kwargs,
                                   help=f"{help} (default {text(full)}; {text(quick)} "
                                        "with --quick)".lstrip())
        self._sized[action.dest] = (full, quick)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        out = super().parse_args(args, namespace)
        for dest, (full, quick) in self._sized.items():
            if getattr(out, dest) is None:
                setattr(out, dest, quick if getattr(out, "quick", False) else full)
        return out


def parser(doc: str, *, quick: str | None = None, device: bool = False,
           repeats: tuple[int, int] | int | None = None, seed: int | None = None,
           gemm: bool = False, out: str | None = None, merge: str | None = None) -> Parser:
    """A :class:`Parser` with the shared options a script asks for.

    ``quick``: what ``--quick`` runs (a smoke test that writes no JSON unless
    ``--out``); ``repeats``: the default number of timed runs after a warm-up
    (a pair: full, quick); ``out``: the record's name under ``benchmarks/results``
    (``--out`` takes a file or a directory); ``merge``: what ``--merge`` keeps of
    an earlier record.
    """
    p = Parser(doc)
    if quick is not None:
        p.add_argument("--quick", action="store_true", help=f"smoke test: {quick}")
    if device:
        p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                       help="auto: the GPU when CuPy sees one (default)")
    if isinstance(repeats, tuple):
        p.sized("--repeats", type=int, full=repeats[0], quick=repeats[1],
                help="timed runs after one warm-up")
    elif repeats is not None:
        p.add_argument("--repeats", type=int, default=repeats,
                       help=f"timed runs after one warm-up (default {repeats})")
    if seed is not None:
        p.add_argument("--seed", type=int, default=seed,
                       help=f"seed of the random inputs and of the sketch (default {seed})")
    if gemm:
        p.add_argument("--gemm-n", type=int, default=None, help="size of the complex128 GEMM "
                       "(default 8192 on a GPU, 2048 on a CPU; a quarter with --quick)")
    if out is not None:
        none = "; none with --quick" if quick is not None else ""
        p.add_argument("--out", type=Path, default=None,
                       help=f"JSON record, or a directory for it (default "
                            f"benchmarks/results/{out}{none})")
    if merge is not None:
        p.add_argument("--merge", nargs="?", const="", default=None, metavar="JSON",
                       help=f"keep {merge} of an earlier record: JSON, or the --out file")
    return p


def output_path(out: Path | None, name: str, quick: bool = False) -> Path | None:
    """Where a record goes: ``--out`` (a directory: ``name`` in it), else
    ``benchmarks/results/name``; nowhere for a ``--quick`` run without ``--out``."""
    if out is None:
        return None if quick else RESULTS / name
    return out / name if out.is_dir() else out


# -- the record ---------------------------------------------------------------------
class Record(dict):
    """A benchmark's JSON record: its provenance first, then what the script adds.

    ``device`` is a :class:`device.Device` (or anything with ``describe()``);
    ``path``: where :meth:`save` writes it (None: nowhere).
    """

    def __init__(self, measures: str, device: Any, path: Path | None = None, **fields: Any):
        self.path = path
        super().__init__(
            benchmark=measures,
            date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            hostname=socket.gethostname(), cpu_model=cpu_model(), nproc=os.cpu_count(),
            device=device.describe(), blas=blas_info(), versions=versions(), git=git_state(),
            command=" ".join([Path(sys.executable).name, *sys.argv]),
            env={k: v for k, v in os.environ.items()
                 if k.startswith(("OPENBLAS", "OMP_", "MKL_", "CUDA_VISIBLE", "DASK_"))})
        self.update(fields)

    def header(self) -> str:
        """One line: when and on what."""
        where = self["device"].get("gpu", self["cpu_model"])
        return (f"# {self['date']} on the {self['device']['name'].upper()}: {where}, "
                f"{self['nproc']} cores")

    def save(self) -> None:
        """Write (overwrite) the record at its ``path`` (after every step of a long run,
        so a run cut short keeps what it finished)."""
        self.write(self.path)

    def write(self, path: Path | None) -> None:
        """Write (overwrite) the record at ``path``; nothing for None."""
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self, indent=2, default=str) + "\n")
        print(f"wrote {path}")


def earlier_record(merge: str | None, out: Path | None) -> dict[str, Any]:
    """The record ``--merge`` names (``{}`` without ``--merge`` or where there is none)."""
    if merge is None:
        return {}
    path = Path(merge) if merge else out
    return json.loads(path.read_text()) if path is not None and path.exists() else {}


# -- the table ---------------------------------------------------------------------
def cell(x: Any, spec: str = "") -> str:
    """``x`` formatted by ``spec``; ``-`` for None."""
    return "-" if x is None else format(x, spec)


def gb(x: float | None, base: float | None = None) -> str:
    """``x - base`` bytes in GB (``-`` when unknown)."""
    return "-" if x is None else f"{(x - (base or 0)) / 1e9:.2f}"


def print_table(header: Sequence[str], rows: Iterable[Sequence[Any] | str],
                legend: Iterable[str] = (), align: str = "") -> None:
    """An aligned table, then its legend, one line each.

    ``align`` holds one letter per column, ``l`` or ``r`` (default: the first
    column left, the others right). A row that is a string is printed as it is.
    """
    rows = [r if isinstance(r, str) else [cell(x) if not isinstance(x, str) else x for x in r]
            for r in rows]
    table = [r for r in rows if not isinstance(r, str)]
    widths = [max([len(h), *(len(r[i]) for r in table)]) for i, h in enumerate(header)]
    align = align or "l" + "r" * (len(header) - 1)

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w)
                         for c, w, a in zip(cells, widths, align, strict=True)).rstrip()

    print()
    print(line(header))
    for r in rows:
        print(r if isinstance(r, str) else line(r))
    for text in legend:
        print(text)


# -- targets -----------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """A bound on one quantity of a run's entry (``best_s``, ``fraction_of_gemm``,
    ``ratio_to_quimb_src``, ...): at most ``bound``, or at least with ``at_most=False``."""

    what: str
    bound: float
    at_most: bool = True

    def met(self, value: float) -> bool:
        return value <= self.bound if self.at_most else value >= self.bound


def check_targets(targets: Iterable[Target],
                  runs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every target on every run that reports its quantity, met or not."""
    out = []
    for t in targets:
        for run, entry in runs.items():
            value = entry.get(t.what)
            if value is not None:
                out.append({"run": run, "what": t.what, "bound": t.bound,
                            "at_most": t.at_most, "value": value, "met": t.met(value)})
    return out


def print_targets(results: Iterable[Mapping[str, Any]]) -> None:
    for t in results:
        print(f"target {t['run']}: {t['what']} {t['value']:.4g} "
              f"{'<=' if t['at_most'] else '>='} {t['bound']}: "
              f"{'met' if t['met'] else 'NOT met'}")


# -- logs --------------------------------------------------------------------------
@contextlib.contextmanager
def captured_log(name: str, level: int,
                 propagate: bool | None = None) -> Iterator[list[str]]:
    """The messages logger ``name`` emits at ``level`` or above while the block runs,
    in a list (clear it between calls); ``propagate=False`` keeps them from the root
    logger's handlers meanwhile."""
    lines: list[str] = []
    log = logging.getLogger(name)

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler, before = Keep(level), (log.level, log.propagate)
    log.setLevel(level)
    if propagate is not None:
        log.propagate = propagate
    log.addHandler(handler)
    try:
        yield lines
    finally:
        log.removeHandler(handler)
        log.setLevel(before[0])
        log.propagate = before[1]
