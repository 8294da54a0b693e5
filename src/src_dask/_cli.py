"""The src-dask command line: SRC on tensor trains saved in Zarr, from the shell.

    src-dask demo                                  the quick-start problem on a local cluster
    src-dask generate mpo A.zarr --sites 50 --bond 4          reference problems into Zarr
    src-dask run A.zarr x.zarr --chi-out 64 --out y.zarr      compress a product of saved trains
    src-dask plan A.zarr x.zarr --chi-out 64       what that run would need, running nothing
    src-dask info y.zarr                           what a train, stack or run store holds

Exit status: 0 on success, 1 when a run fails or an input is bad, 2 for a
usage error, 130 when interrupted. Errors are one line on stderr
("src-dask: error: ..."); --debug shows the traceback instead.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

import src_dask

from . import connect
from .errors import OverwriteNeededError
from .interrupts import forget

# --help imports neither NumPy nor Dask's arrays (the commands do: ``storage``, ``problems``), hence
# these copies of trains.SUPPORTED_DTYPES and problems.SPEC_DEFAULTS (tests/test_cli.py checks).
PROG = "src-dask"
DTYPES = ("float32", "float64", "complex64", "complex128")
KINDS = ("mps", "mpo", "stack", "heisenberg", "ising")


class CLIError(Exception):
    """A failure reported as one line, with exit status 1."""


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors on one line: ``src-dask: error: ...`` (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message} (see '{self.prog} --help')\n")


def _say(line: str, err: bool = False) -> None:
    """A line of output on stdout, or (``err``) of news on stderr, ``src-dask:`` first."""
    (sys.stderr if err else sys.stdout).write(f"{PROG}: {line}\n" if err else line + "\n")
    if err:
        sys.stderr.flush()


def _typed(cast: Callable[[str], Any], ok: Callable[[Any], bool], want: str) -> Any:
    """An argparse ``type``: ``cast(text)`` where ``ok`` of it, else a usage error."""
    def parse(text: str) -> Any:
        with contextlib.suppress(ValueError):
            if ok(value := cast(text)):
                return value
        raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
    return parse


_positive_int = _typed(int, lambda v: v >= 1, "a positive integer")
_non_negative_int = _typed(int, lambda v: v >= 0, "an integer >= 0")
_oversample = _typed(lambda t: t if t == "auto" else int(t), lambda v: v == "auto" or v >= 0,
                     "an integer >= 0 or 'auto'")
_cutoff = _typed(float, lambda v: 0 <= v < 1, "a number in [0, 1)")


def _new(path: str, overwrite: bool) -> str:
    """``path``, refused before any work where something is there without --overwrite."""
    if os.path.lexists(path) and not overwrite:
        raise CLIError(f"{path}: already exists; pass --overwrite to replace it")
    return path


def _usage(args: argparse.Namespace, check: Callable[..., Any], *a: Any, **kw: Any) -> Any:
    """``check(*a, **kw)``, the library's check of options: its ValueError a usage error."""
    try:
        return check(*a, **kw)
    except ValueError as err:
        args.parser.error(str(err))


def _where(args: argparse.Namespace, protocol: bool = True) -> dict[str, Any]:
    """``connect.client_options`` of the where-to-run flags (--protocol checked if ``protocol``)."""
    return _usage(args, connect.client_options, args.scheduler_file, workers=args.workers,
                  gpus=args.gpus, threads=args.threads, memory_limit=args.memory_limit,
                  local_directory=args.local_directory, host=args.host,
                  protocol=args.protocol if protocol or args.gpus is not None else None,
                  tls=(args.tls_ca_file, args.tls_cert, args.tls_key))


@contextlib.contextmanager
def _compute_client(where: dict[str, Any], dashboard: bool = True) -> Iterator[Any]:
    """``connect.client(**where)``, described on stderr (``dashboard``: a local one too)."""
    with contextlib.ExitStack() as stack:
        try:
            client = stack.enter_context(connect.client(**where))
        except ValueError as err:
            if "no usable GPU" not in str(err):
                raise
            raise CLIError("--gpus: no usable GPU here (CuPy and a CUDA device); use "
                           "--workers N for a CPU cluster") from None
        if client is not None and (dashboard or where.get("scheduler_file") is not None):
            _say(connect.describe(client), err=True)
        yield client


# -- the commands; each docstring is its help: the summary line, then the description --
def demo(args: argparse.Namespace) -> int:
    """run SRC on a built-in MPO·MPS problem on a local cluster

    A compressible MPO·MPS (decaying bonds) on a local cluster: prints the dashboard address,
    then for plain and oversampled SRC the relative error against the exact product and the time."""
    mpo = src_dask.problems.random_mpo(args.sites, args.mpo_bond, seed=args.seed, decay=0.5)
    mps = src_dask.problems.random_mps(args.sites, args.bond, seed=args.seed + 1, decay=0.9)
    mpo, mps = (src_dask.TensorTrain(t.to_numpy(), t.kind) for t in (mpo, mps))  # in memory
    exact = max(a * b for a, b in zip(mpo.bond_dims, mps.bond_dims, strict=True))
    with connect.client(host=args.host, gpus=0, n_workers=args.workers,
                        threads_per_worker=1) as client:
        _say(f"dashboard: {client.dashboard_link}")
        _say(f"problem:   MPO (bond {args.mpo_bond}) · MPS (bond {args.bond}), {args.sites} "
             f"sites, complex128; exact product bond {exact}")
        for oversample in (0, "auto"):
            t0 = time.perf_counter()
            y = src_dask.apply(mpo, mps, args.chi_out, oversample=oversample, seed=args.seed,
                               client=client)
            dt = time.perf_counter() - t0
            _say(f"chi_out={args.chi_out:<4d} oversample={oversample!s:<5} relative error "
                 f"{src_dask.distance(y, mpo, mps, client=client):.3e}   time {dt:6.2f} s")
        if args.wait:
            input("press Enter to stop the cluster ")
    return 0


def generate(args: argparse.Namespace) -> int:
    """write a reference problem to Zarr (random MPS/MPO, src-method stack, Heisenberg/Ising)

    Write the problem KIND to PATH, a Zarr group that appears only once completely written.

      mps         random MPS, complex Gaussian, bonds min(--bond, phys^k), norm ~1
      mpo         random MPO, same, |A x| ~ |x|
      stack       the src-method stack N·V·M·U (PATH/N, …, PATH/U; 'src-dask run PATH'
                  takes them in order): legs 4x4, bonds --bond, --bond, --dm, --bond
      heisenberg  spin-1/2 XXZ chain (quimb's MPO_ham_heis), exact MPO of bond 5
      ising       spin-1/2 transverse-field Ising (quimb's MPO_ham_ising), bond 3

    Random problems (complex128 unless --dtype) are drawn site by site, never held in memory,
    the same for the same options and seed; Hamiltonians are float64."""
    problems = src_dask.problems
    spec = _usage(args, problems.spec, args.kind, **{k: v for k in problems.SPEC_OPTIONS
                                                     if (v := getattr(args, k)) is not None})
    t0 = time.perf_counter()
    problems.write(spec, _new(os.path.abspath(args.path), args.overwrite), overwrite=args.overwrite)
    seconds = time.perf_counter() - t0
    _say(f"wrote {src_dask.storage.describe(args.path).summary()} in {seconds:.1f} s")
    return 0


def run(args: argparse.Namespace) -> int:
    """compress the product of saved trains with SRC; write the result to Zarr

    Compress TRAIN[0]·TRAIN[1]·… (leftmost first; a stack counts as its factors) to bond
    dimension --chi-out with src_dask.src. --out appears only once the run has finished: a failed
    or interrupted run leaves nothing there. With --store, rerunning resumes an interrupted run."""
    from . import diagnostics, storage

    where, trains = _where(args), storage.open_trains(*args.trains)  # usage errors first
    out = _new(os.path.realpath(args.out), args.overwrite)
    apart = {f"input {t.name}": t for t in trains} | ({"--store": args.store} if args.store else {})
    storage.check_writable(out, True, apart_from=apart)  # before any work; not over/in an input
    if args.report is not None and not (args.workers or args.gpus or args.scheduler_file):
        args.parser.error("--report: Dask's performance report needs a cluster; add "
                          "--workers N, --gpus N or --scheduler-file FILE")
    options = {"chi_out": args.chi_out, "oversample": args.oversample, "cutoff": args.cutoff,
               "dtype": args.dtype, "seed": args.seed, "chunk": args.chunk}
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    before = storage.run_progress(args.store)
    log = diagnostics.log_to(sys.stderr, f"{PROG}: ") if args.verbose else contextlib.nullcontext()
    with log, _compute_client(where) as client:  # -v: the library's log on stderr
        t0 = time.perf_counter()
        try:
            result = src_dask.src(*trains, **options, client=client, store=args.store,
                                  overwrite=args.overwrite_store, progress=progress,
                                  performance_report=args.report)
        except OverwriteNeededError as err:  # the API's option is --overwrite-store
            raise CLIError(f"{err.reason}; pass --overwrite-store to replace it") from err
        options["seed"] = result.seed  # drawn by src when not given (a store keeps its own)
        side = "bra" if len(trains) > 1 and trains[0].kind == "mps" else "ket"  # MPS on the left
        made_by = {"command": "src-dask run", "inputs": [os.path.abspath(p) for p in args.trains],
                   "product": f"{'·'.join(t.kind.upper() for t in trains)}, {side}",
                   "store": args.store and os.path.abspath(args.store), **options}
        storage.save(result, out, overwrite=args.overwrite, attrs={"made_by": made_by})
        seconds = time.perf_counter() - t0
        error = src_dask.distance(result, *trains, client=client) if args.check else None
    if before is not None and before.resumed():
        _say(before.resumed())
    _say(f"wrote {storage.describe(args.out).summary()} in {seconds:.2f} s (seed "
         f"{options['seed']})" + ("" if error is None else f"; relative error {error:.3e}"))
    return 0


def plan(args: argparse.Namespace) -> int:
    """say what 'run' would need (memory per worker, disk, FLOPs, tasks); run nothing

    The plan of 'run' with the same trains and options (src_dask.plan): sketch and projected-core
    blocks, each worker's peak memory (host; device on GPUs), environments' bytes, the disk of a
    --store, FLOPs per pass and tasks. Nothing is computed (a local cluster starts only to ask its
    workers what they have); a problem that cannot fit is refused with the numbers (exit 1)."""
    from . import storage

    where, trains = _where(args), storage.open_trains(*args.trains)  # usage errors first
    options = {"chi_out": args.chi_out, "oversample": args.oversample, "cutoff": args.cutoff,
               "dtype": args.dtype, "chunk": args.chunk, "store": args.store}
    with _compute_client(where, dashboard=False) as client:  # nothing to watch
        result = src_dask.plan(*trains, **options, client=client)
    _say(json.dumps(dataclasses.asdict(result), indent=1) if args.json else str(result))
    return 0


def distance(args: argparse.Namespace) -> int:
    """the relative error of a saved result against the product of saved trains

    ||RESULT - TRAIN[0]·TRAIN[1]·…|| / ||TRAIN[0]·TRAIN[1]·…||, exactly, by streamed overlaps
    (src_dask.distance), without forming the product; it resolves errors down to about 1e-7."""
    from . import storage

    where = _where(args, protocol=False)
    result, *trains = storage.open_trains(args.result, *args.trains)
    with _compute_client(where) as client:
        error = src_dask.distance(result, *trains, client=client)
    _say(f"{args.result} against {'·'.join(t.kind.upper() for t in trains)}: relative error "
         f"{error:.3e}")
    return 0


def info(args: argparse.Namespace) -> int:
    """describe a saved train, a stack or a run store

    A train: kind, sites, bond and physical dims, dtype, size; a stack: each factor; a run store:
    options, inputs, progress (pass 1 blocks, pass 2 next site), complete or not, bytes planned."""
    from . import storage

    if not os.path.exists(args.path):
        raise CLIError(f"{args.path}: no such file or directory")
    data = storage.describe(args.path)
    _say(json.dumps(data, indent=2) if args.json else str(data))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the subcommand's parser: its --help lists what it takes
        getattr(args, "parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return args.func(args)
    except BrokenPipeError:  # stdout closed early (| head): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (KeyboardInterrupt, Exception) as err:
        if args.debug:
            raise
        if isinstance(err, KeyboardInterrupt):
            forget(err)
            from .storage import run_progress

            progress = run_progress(getattr(args, "store", None))  # where it stopped
            _say("interrupted" + ("" if progress is None else f" {progress.stopped()}"), err=True)
            return 130
        msg = " ".join(str(err).split()) or type(err).__name__  # one line, typed if unclear
        plain = isinstance(err, (CLIError, ValueError, TypeError, OSError, RuntimeError,
                                 FloatingPointError, MemoryError))
        _say(f"error: {msg if plain else f'{type(err).__name__}: {msg}'}", err=True)
        return 1


# -- the parser: the options of each command, as tables ------------------------------------
def _o(flags: str, help: str, **kwargs: Any) -> tuple[str, dict[str, Any]]:  # noqa: A002
    """One option: its flags (space-separated) and ``add_argument``'s keywords."""
    return flags, {"help": help, **kwargs}


_N, _INT = {"type": _positive_int, "metavar": "N"}, {"type": _positive_int}
_SEED, _FLAG = {"type": _non_negative_int, "metavar": "N"}, {"action": "store_true"}
_JSON = _o("--json", "print JSON instead of text", **_FLAG)
_DEBUG = _o("--debug", "show the full traceback of an error (for developers)", **_FLAG)
_PROBLEM = [  # the trains and the options of ``src`` that run and plan share
    _o("trains", "saved trains (src_dask.save), leftmost first", nargs="+", metavar="TRAIN"),
    _o("--chi-out", "bond dimension of the result", required=True, **_N),
    _o("--oversample", "extra sketch columns, or 'auto': max(ceil(chi_out/2), 10); N > 0 rounds "
       "the result to chi_out exactly (default 0)", type=_oversample, default=0, metavar="N|auto"),
    _o("--cutoff", "relative singular-value threshold in [0, 1) (default 0)", type=_cutoff,
       default=0.0, metavar="X"),
    _o("--dtype", "working and output dtype (default: promoted from the inputs)", choices=DTYPES),
    _o("--chunk", "sketch columns per block (default: one per worker thread, <= 256 MiB)", **_N)]
_WHERE = ("where it runs", "Default: Dask's threaded scheduler in this process.", [
    _o("--scheduler-file", "connect to the Dask cluster of this scheduler file", metavar="FILE"),
    _o("--gpus", "start a local dask-cuda cluster on N GPUs (src_dask.cluster)", **_N),
    _o("--workers", "start a local CPU cluster of N worker processes", **_N)])
_HOST = _o("--host", "where the local cluster and dashboard listen (default 127.0.0.1: this "
           "machine only; 0.0.0.0: the network, add TLS)", default="127.0.0.1", metavar="ADDR")
_LOCAL = [  # how the local cluster is set up
    _o("--threads", "--workers: threads per worker (default 1)", **_N),
    _o("--protocol", "--gpus: ucx (default on several GPUs where installed: NVLink speed, but "
       "unauthenticated on every interface) or tcp (on --host, ~1 GB/s)", choices=("ucx", "tcp")),
    _o("--memory-limit", "--gpus/--workers: host memory per worker before spilling to disk "
       "(default auto)", metavar="BYTES"),
    _o("--local-directory", "--gpus/--workers: spill under DIR, in a fresh subfolder only you "
       "can enter (default: the temporary directory)", metavar="DIR"),
    _HOST]
_TLS = ("TLS", "Encrypt and authenticate the connections of the cluster (--scheduler-file's or "
        "the local one): give all three; without them, Dask config (distributed.comm.tls) decides.",
        [_o("--tls-ca-file", "the certificate authority's certificate", metavar="PEM"),
         _o("--tls-cert", "this side's certificate (signed by the CA)", metavar="PEM"),
         _o("--tls-key", "its private key", metavar="PEM")])
#: Each command's own options, and whether it takes those of _WHERE, _LOCAL and _TLS.
_COMMANDS: dict[Callable[[argparse.Namespace], int], tuple[list, bool]] = {
    demo: ([_o("--sites", "sites (default 40)", **_INT, default=40),
            _o("--bond", "MPS bond dimension (default 64)", **_INT, default=64),
            _o("--mpo-bond", "MPO bond dimension (default 4)", **_INT, default=4),
            _o("--chi-out", "bond dimension of the result (default 64)", **_INT, default=64),
            _o("--workers", "worker processes of the local cluster (default 2)", **_INT, default=2),
            _o("--seed", "seed (default 0)", type=_non_negative_int, default=0),
            _o("--wait", "keep the dashboard up until Enter", **_FLAG), _HOST], False),
    generate: ([
        _o("kind", "mps, mpo, stack, heisenberg or ising", choices=KINDS, metavar="KIND"),
        _o("path", "where to write (a Zarr group)", metavar="PATH"),
        _o("--sites", "number of sites (default 50)", **_N),
        _o("--bond", "bond dimension (mps 64, mpo 4; stack: of N, V and U, 4)", **_N),
        _o("--phys", "physical dimension (mps, mpo 2; stack 4)", **_N),
        _o("--dm", "stack: bond D_M of M (default 1000)", **_N),
        _o("--seed", "random problems: seed (default 0; the stack's factor i: seed+i)", **_SEED),
        _o("--dtype", "dtype of the cores", choices=DTYPES),
        _o("--j", "Hamiltonians: coupling (default 1; > 0 is antiferromagnetic)", type=float),
        _o("--jz", "heisenberg: ZZ coupling (default --j; XXZ anisotropy)", type=float),
        _o("--field", "Hamiltonians: field, bz (heisenberg) or bx (ising), default 0", type=float),
        _o("--overwrite", "replace PATH if it holds a src_dask train or stack", **_FLAG)], False),
    run: ([
        *_PROBLEM,
        _o("--store", "run store (Zarr): memory bounded by disk, resumable", metavar="DIR"),
        _o("--out", "where to write the result", required=True, metavar="PATH"),
        _o("--seed", "seed of the sketch (default: a fresh one, printed and saved with the "
           "output; with --store, the store's)", **_SEED),
        _o("--overwrite", "replace --out if it holds a src_dask train", **_FLAG),
        _o("--progress", "a bar by pass and site on stderr (default: if stderr is a terminal)",
           action=argparse.BooleanOptionalAction),
        _o("--report", "save Dask's performance report here (needs a cluster)", metavar="HTML"),
        _o("-v --verbose", "log what the run does (problem, sketch, device) on stderr", **_FLAG),
        _o("--overwrite-store", "replace a --store of another run (the same run resumes)", **_FLAG),
        _o("--check", "also print the relative error against the exact product "
           "(src_dask.distance: about as dear as the run)", **_FLAG)], True),
    plan: ([*_PROBLEM, _o("--store", "plan a run with a run store there (its disk is checked)",
                          metavar="DIR"), _JSON], True),
    distance: ([_o("result", "a saved train (e.g. run's --out)", metavar="RESULT"),
                _o("trains", "the factors, as given to run", nargs="+", metavar="TRAIN")], True),
    info: ([_o("path", "a saved train, stack or run store", metavar="PATH"), _JSON], False),
}


def _parser() -> argparse.ArgumentParser:
    """The command line's parser: a subcommand per entry of :data:`_COMMANDS`, its help
    the command's docstring (prose filled to 79 columns, indented tables kept)."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(prog=PROG, description=__doc__, formatter_class=fmt)
    parser.add_argument("--version", action="version", version=f"{PROG} {src_dask.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for func, (options, cluster) in _COMMANDS.items():
        summary, *paragraphs = textwrap.dedent("    " + (func.__doc__ or "")).split("\n\n")
        text = "\n\n".join(t if t.startswith("  ") else textwrap.fill(" ".join(t.split()), 79)
                           for t in paragraphs)
        p = sub.add_parser(func.__name__, formatter_class=fmt, help=" ".join(summary.split()),
                           description=text)
        p.set_defaults(func=func, parser=p)
        tables = [(p, [_DEBUG, *options])]
        if cluster:
            where = p.add_argument_group(*_WHERE[:2]).add_mutually_exclusive_group()
            tables += [(where, _WHERE[2]), (p, _LOCAL), (p.add_argument_group(*_TLS[:2]), _TLS[2])]
        for group, table in tables:
            for flags, kwargs in table:
                group.add_argument(*flags.split(), **kwargs)
    return parser
