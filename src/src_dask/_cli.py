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
import json
import logging
import os
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from dask.utils import format_bytes

import src_dask

from . import connect
from .errors import OverwriteNeededError
from .interrupts import forget

# NumPy and Dask's arrays are imported by the commands that use them (``storage``,
# ``problems``), so that --help answers at once; hence these lists, which are the
# library's (trains.SUPPORTED_DTYPES, problems.SPEC_DEFAULTS: tests/test_cli.py checks).
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
    if not err:
        sys.stdout.write(line + "\n")
        return
    sys.stderr.write(f"{PROG}: {line}\n")
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


def _cluster_flags(args: argparse.Namespace, protocol: bool = True) -> None:
    """Where-to-run flags that do not go together (usage errors); their defaults, and
    ``args.security`` (``connect.security`` of the --tls-* files)."""
    local = args.workers is not None or args.gpus is not None
    for flag in ("--threads", "--memory-limit", "--local-directory"):
        if getattr(args, flag[2:].replace("-", "_")) is not None and not local:
            args.parser.error(f"{flag}: sets up the local cluster of --workers N or --gpus N; "
                              "add one of them (a --scheduler-file cluster has its own)")
    if args.threads is not None and args.gpus is not None:
        args.parser.error("--threads: is for --workers N (a GPU worker runs one thread)")
    args.threads = 1 if args.threads is None else args.threads
    args.memory_limit = "auto" if args.memory_limit is None else args.memory_limit
    tls = {"--tls-ca-file": args.tls_ca_file, "--tls-cert": args.tls_cert,
           "--tls-key": args.tls_key}
    if any(tls.values()) and not all(tls.values()):
        args.parser.error("--tls-ca-file, --tls-cert and --tls-key go together (missing "
                          f"{', '.join(k for k, v in tls.items() if not v)})")
    if any(tls.values()) and not (args.scheduler_file or args.workers or args.gpus):
        args.parser.error("--tls-*: TLS is for a cluster; add --scheduler-file FILE, "
                          "--workers N or --gpus N")
    args.security = connect.security(*tls.values(), names=list(tls)) if all(tls.values()) \
        else None
    if protocol and args.protocol is not None and args.gpus is None:
        args.parser.error("--protocol: chooses how the GPUs of --gpus N talk; add --gpus N")


@contextlib.contextmanager
def _compute_client(args: argparse.Namespace, dashboard: bool = True) -> Iterator[Any]:
    """``connect.client`` of the where-to-run flags, said on stderr (``dashboard``: a
    local cluster's dashboard too)."""
    local: dict[str, Any] = {}
    if args.gpus is not None or args.workers is not None:
        local = {"host": args.host, "memory_limit": args.memory_limit,
                 "local_directory": args.local_directory}
        local |= {"gpus": args.gpus, "protocol": args.protocol} if args.gpus is not None else \
            {"gpus": 0, "n_workers": args.workers, "threads_per_worker": args.threads}
    with contextlib.ExitStack() as stack:
        try:
            client = stack.enter_context(connect.client(args.scheduler_file,
                                                        security=args.security, **local))
        except ValueError as err:
            if "no usable GPU" not in str(err):
                raise
            raise CLIError("--gpus: no usable GPU here (CuPy and a CUDA device); use "
                           "--workers N for a CPU cluster") from None
        if args.scheduler_file is not None:
            workers = len(client.scheduler_info()["workers"])
            _say(f"connected to {client.scheduler.address} ({workers} workers); dashboard: "
                 f"{client.dashboard_link}", err=True)
        elif client is not None and dashboard:
            _say(f"dashboard: {client.dashboard_link}", err=True)
        yield client


@contextlib.contextmanager
def _log_to_stderr(enabled: bool) -> Iterator[None]:
    """-v: the ``src_dask`` logger's INFO messages on stderr while the block runs, and
    no handler left behind after it (``main`` may be called again)."""
    handler, logger = logging.StreamHandler(sys.stderr), logging.getLogger("src_dask")
    handler.setFormatter(logging.Formatter("src-dask: %(message)s"))
    level = logger.level
    if enabled:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


# -- the commands; each docstring is its help: the summary line, then the description --
def demo(args: argparse.Namespace) -> int:
    """run SRC on a built-in MPO·MPS problem on a local cluster

    MPO·MPS with decaying bonds (a compressible product) on a local cluster: prints the
    dashboard address and, for plain and oversampled SRC, the relative error against the
    exact product and the time."""
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
    """write a reference problem (random MPS/MPO, the src-method stack, Heisenberg or Ising
    MPO) to Zarr

    Write a reference problem to PATH with src_dask.save (a Zarr group; PATH appears only
    once it is completely written).

      mps         random MPS, complex Gaussian, bonds min(--bond, phys^k), norm ~1
      mpo         random MPO, same, |A x| ~ |x|
      stack       the src-method stack N·V·M·U (PATH/N, …, PATH/U; 'src-dask run PATH'
                  takes them in order): legs 4x4, bonds --bond, --bond, --dm, --bond
      heisenberg  spin-1/2 XXZ chain (quimb's MPO_ham_heis), exact MPO of bond 5
      ising       spin-1/2 transverse-field Ising (quimb's MPO_ham_ising), bond 3

    Random problems (complex128 unless --dtype) are drawn site by site, never held in
    memory, the same for the same options and seed; Hamiltonians are float64."""
    problems = src_dask.problems
    try:
        spec = problems.spec(args.kind, **{k: v for k in problems.SPEC_OPTIONS
                                           if (v := getattr(args, k)) is not None})
    except ValueError as err:  # an option that does not apply to the kind
        args.parser.error(str(err))
    t0 = time.perf_counter()
    trains = problems.write(spec, _new(os.path.abspath(args.path), args.overwrite),
                            overwrite=args.overwrite)
    what = "stack " + "·".join(trains) if spec["kind"] == "stack" else spec["kind"]
    _say(f"wrote {what} to {args.path}: {len(next(iter(trains.values())))} sites, "
         f"{spec['dtype']}, {format_bytes(sum(t.nbytes for t in trains.values()))} in "
         f"{time.perf_counter() - t0:.1f} s")
    return 0


def run(args: argparse.Namespace) -> int:
    """compress the product of saved trains with SRC; write the result to Zarr

    Compress the product TRAIN[0]·TRAIN[1]·… (leftmost first; a stack written by 'generate
    stack' counts as its factors) to bond dimension --chi-out with src_dask.src, and write
    the result to --out with src_dask.save. The output appears only when the run has
    finished: a failed or interrupted run leaves nothing at --out. With --store, rerunning
    the same command resumes an interrupted run."""
    from . import storage

    _cluster_flags(args)  # usage errors first
    trains = storage.open_trains(*args.trains)
    out = _new(os.path.realpath(args.out), args.overwrite)
    # --out must not write over (or around) an input or the run store
    apart = {f"input {t.name}": t for t in trains} | ({"--store": args.store} if args.store
                                                      else {})
    storage.check_writable(out, True, apart_from=apart)  # before any work
    if args.report is not None and not (args.workers or args.gpus or args.scheduler_file):
        args.parser.error("--report: Dask's performance report needs a cluster; add "
                          "--workers N, --gpus N or --scheduler-file FILE")
    options = {"chi_out": args.chi_out, "oversample": args.oversample, "cutoff": args.cutoff,
               "dtype": args.dtype, "seed": args.seed, "chunk": args.chunk}
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    before = storage.run_progress(args.store)
    with _log_to_stderr(args.verbose), _compute_client(args) as client:
        t0 = time.perf_counter()
        try:
            result = src_dask.src(*trains, **options, client=client, store=args.store,
                                  overwrite=args.overwrite_store, progress=progress,
                                  performance_report=args.report)
        except OverwriteNeededError as err:  # the API's option is --overwrite-store
            raise CLIError(f"{err.reason}; pass --overwrite-store to replace it") from err
        options["seed"] = result.seed  # drawn by src when not given (a store keeps its own)
        made_by = {"command": "src-dask run", "inputs": [os.path.abspath(p) for p in args.trains],
                   "store": args.store and os.path.abspath(args.store), **options}
        storage.save(result, out, overwrite=args.overwrite, attrs={"made_by": made_by})
        seconds = time.perf_counter() - t0
        error = src_dask.distance(result, *trains, client=client) if args.check else None
    if before is not None and before.resumed():
        _say(before.resumed())
    # the product computed: the factors in order, a bra where an MPS is on the left
    side = "bra" if len(trains) > 1 and trains[0].kind == "mps" else "ket"
    _say(f"wrote {result.kind} ({'·'.join(t.kind.upper() for t in trains)}, {side}) to "
         f"{args.out}: {len(result)} sites, max bond {max(result.bond_dims)}, {result.dtype}, "
         f"{format_bytes(result.nbytes)} in {seconds:.2f} s (seed {options['seed']})"
         + ("" if error is None else f"; relative error {error:.3e}"))
    return 0


def plan(args: argparse.Namespace) -> int:
    """say what 'run' would need (memory per worker, disk, FLOPs, tasks); run nothing

    The plan of 'src-dask run' with the same trains and options (src_dask.plan): sketch
    blocks, projected-core row blocks, the peak memory of each worker (host, and device on
    GPUs), the environments' bytes, the disk a --store needs, FLOPs per pass and the number
    of tasks. Nothing is computed; a problem that cannot fit the workers or the disk is
    refused (exit 1) with the numbers; a local cluster is started to ask its workers
    what they have."""
    import dataclasses

    from . import storage

    _cluster_flags(args)
    trains = storage.open_trains(*args.trains)
    options = {"chi_out": args.chi_out, "oversample": args.oversample, "cutoff": args.cutoff,
               "dtype": args.dtype, "chunk": args.chunk, "store": args.store}
    with _compute_client(args, dashboard=False) as client:  # nothing to watch
        result = src_dask.plan(*trains, **options, client=client)
    _say(json.dumps(dataclasses.asdict(result), indent=1) if args.json else str(result))
    return 0


def distance(args: argparse.Namespace) -> int:
    """the relative error of a saved result against the product of saved trains

    ||RESULT - TRAIN[0]·TRAIN[1]·…|| / ||TRAIN[0]·TRAIN[1]·…||, exactly, by streamed
    overlaps (src_dask.distance), without forming the product; it resolves errors down to
    about 1e-7."""
    from . import storage

    _cluster_flags(args, protocol=False)
    result, *trains = storage.open_trains(args.result, *args.trains)
    with _compute_client(args) as client:
        error = src_dask.distance(result, *trains, client=client)
    _say(f"{args.result} against {'·'.join(t.kind.upper() for t in trains)}: relative error "
         f"{error:.3e}")
    return 0


def info(args: argparse.Namespace) -> int:
    """describe a saved train, a stack or a run store

    For a train: kind, sites, bond and physical dimensions, dtype and size. For a stack:
    each factor. For a run store: the run's options and inputs, its progress (pass 1 blocks
    done, pass 2 next site), whether it is complete, and the bytes it plans to use."""
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
    except KeyboardInterrupt as err:
        if args.debug:
            raise
        forget(err)
        from .storage import run_progress

        progress = run_progress(getattr(args, "store", None))  # where it stopped
        _say("interrupted" + ("" if progress is None else " " + progress.stopped()), err=True)
        return 130
    except BrokenPipeError:  # stdout closed early (| head): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as err:
        if args.debug:
            raise
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
_PROBLEM = [  # the trains and the options of ``src`` that run and plan share
    _o("trains", "saved trains (src_dask.save / 'src-dask generate'), leftmost first",
       nargs="+", metavar="TRAIN"),
    _o("--chi-out", "bond dimension of the result", required=True, **_N),
    _o("--oversample", "extra sketch columns, or 'auto' = max(ceil(chi_out/2), 10); with N > 0 "
       "the result is rounded exactly to chi_out (default 0)", type=_oversample, default=0,
       metavar="N|auto"),
    _o("--cutoff", "relative singular-value threshold in [0, 1) (default 0)", type=_cutoff,
       default=0.0, metavar="X"),
    _o("--dtype", "working and output dtype (default: promoted from the inputs)", choices=DTYPES),
    _o("--chunk", "sketch columns per block (default: one block per worker thread, none over "
       "256 MiB)", **_N)]
_WHERE = ("where it runs", "Default: Dask's threaded scheduler in this process.", [
    _o("--scheduler-file", "connect to the Dask cluster of this scheduler file", metavar="FILE"),
    _o("--gpus", "start a local dask-cuda cluster on N GPUs (src_dask.cluster)", **_N),
    _o("--workers", "start a local CPU cluster of N worker processes", **_N)])
_HOST = _o("--host", "address the local cluster and its dashboard listen on (default 127.0.0.1: "
           "this machine only; 0.0.0.0 opens them to the network: add TLS)",
           default="127.0.0.1", metavar="ADDR")
_LOCAL = [  # how the local cluster is set up
    _o("--threads", "--workers: threads per worker (default 1)", **_N),
    _o("--protocol", "--gpus: how the GPUs talk (default: ucx on several GPUs when it is "
       "installed, at NVLink speed, but it listens on every network interface without "
       "authentication; tcp stays on --host, at about 1 GB/s)", choices=("ucx", "tcp")),
    _o("--memory-limit", "--gpus/--workers: host memory per worker before spilling to disk "
       "(default auto)", metavar="BYTES"),
    _o("--local-directory", "--gpus/--workers: under which folder workers spill to disk (in a "
       "fresh subfolder only you can enter; default: the temporary directory)", metavar="DIR"),
    _HOST]
_TLS = ("TLS", "Encrypt and authenticate the connections to the scheduler and between workers "
        "(--scheduler-file: the cluster's certificates; --gpus/--workers: the local cluster "
        "uses them). Give all three; without them, Dask config (distributed.comm.tls) decides.",
        [_o("--tls-ca-file", "the certificate authority's certificate", metavar="PEM"),
         _o("--tls-cert", "this side's certificate (signed by the CA)", metavar="PEM"),
         _o("--tls-key", "its private key", metavar="PEM")])
#: Each command's own options, and whether it takes those of _WHERE, _LOCAL and _TLS.
_COMMANDS: dict[Callable[[argparse.Namespace], int], tuple[list, bool]] = {
    demo: ([_o("--sites", "sites (default 40)", **_INT, default=40),
            _o("--bond", "MPS bond dimension (default 64)", **_INT, default=64),
            _o("--mpo-bond", "MPO bond dimension (default 4)", **_INT, default=4),
            _o("--chi-out", "bond dimension of the result (default 64)", **_INT, default=64),
            _o("--workers", "worker processes of the local cluster (default 2)", **_INT,
               default=2),
            _o("--seed", "seed (default 0)", type=_non_negative_int, default=0),
            _o("--wait", "keep the dashboard up until Enter", **_FLAG), _HOST], False),
    generate: ([
        _o("kind", "mps, mpo, stack, heisenberg or ising", choices=KINDS, metavar="KIND"),
        _o("path", "where to write (a Zarr group)", metavar="PATH"),
        _o("--sites", "number of sites (default 50)", **_N),
        _o("--bond", "bond dimension (mps 64, mpo 4; stack: of N, V and U, 4)", **_N),
        _o("--phys", "physical dimension (mps, mpo 2; stack 4)", **_N),
        _o("--dm", "stack: bond D_M of M (default 1000)", **_N),
        _o("--seed", "random problems: seed (default 0; the stack's factor i uses seed+i)",
           **_SEED),
        _o("--dtype", "dtype of the cores", choices=DTYPES),
        _o("--j", "Hamiltonians: coupling (default 1; > 0 is antiferromagnetic)", type=float),
        _o("--jz", "heisenberg: ZZ coupling (default --j; XXZ anisotropy)", type=float),
        _o("--field", "Hamiltonians: field, bz for heisenberg, bx for ising (default 0)",
           type=float),
        _o("--overwrite", "replace PATH if it holds a src_dask train or stack", **_FLAG)], False),
    run: ([
        *_PROBLEM,
        _o("--store", "run store (Zarr) for environments and progress: bounded memory, "
           "resumable", metavar="DIR"),
        _o("--out", "where to write the result", required=True, metavar="PATH"),
        _o("--seed", "seed of the sketch (default: a fresh one, printed and recorded with the "
           "output; with --store, the store's)", **_SEED),
        _o("--overwrite", "replace --out if it holds a src_dask train", **_FLAG),
        _o("--progress", "a progress bar by pass and site on stderr (default: when stderr is a "
           "terminal)", action=argparse.BooleanOptionalAction),
        _o("--report", "write Dask's performance report of the run to this HTML file (needs "
           "--workers, --gpus or --scheduler-file)", metavar="HTML"),
        _o("-v --verbose", "log what the run does (problem, sketch, device) on stderr", **_FLAG),
        _o("--overwrite-store", "replace a --store that holds a run of other inputs or options "
           "(a store of the same run is resumed, not replaced)", **_FLAG),
        _o("--check", "also print the result's relative error against the exact product "
           "(src_dask.distance: streamed overlaps, about as dear as the run)", **_FLAG)], True),
    plan: ([*_PROBLEM, _o("--store", "plan a run with a run store there (its disk is checked)",
                          metavar="DIR"), _JSON], True),
    distance: ([_o("result", "a saved train (e.g. run's --out)", metavar="RESULT"),
                _o("trains", "the factors as given to run, leftmost first", nargs="+",
                   metavar="TRAIN")], True),
    info: ([_o("path", "a saved train, stack or run store", metavar="PATH"), _JSON], False),
}


def _parser() -> argparse.ArgumentParser:
    """The command line's parser: a subcommand per entry of :data:`_COMMANDS`, its help
    the command's docstring (prose filled to 79 columns, indented tables kept)."""
    from . import __version__

    fmt = argparse.RawDescriptionHelpFormatter
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error (for developers)")
    parser = _Parser(prog=PROG, description=__doc__, formatter_class=fmt)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for func, (options, cluster) in _COMMANDS.items():
        summary, *paragraphs = textwrap.dedent("    " + (func.__doc__ or "")).split("\n\n")
        text = "\n\n".join(t if t.startswith("  ") else textwrap.fill(" ".join(t.split()), 79)
                           for t in paragraphs)
        p = sub.add_parser(func.__name__, parents=[common], formatter_class=fmt,
                           help=" ".join(summary.split()), description=text)
        tables = [(p, options)]
        if cluster:
            where = p.add_argument_group(*_WHERE[:2]).add_mutually_exclusive_group()
            tables += [(where, _WHERE[2]), (p, _LOCAL),
                       (p.add_argument_group(*_TLS[:2]), _TLS[2])]
        for group, table in tables:
            for flags, kwargs in table:
                group.add_argument(*flags.split(), **kwargs)
        p.set_defaults(func=func, parser=p)
    return parser
