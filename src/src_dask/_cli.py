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
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from .errors import OverwriteNeededError, StoreError
from .interrupts import forget, local_client

# The library (Dask's arrays, NumPy) is imported by the commands that use it, so that
# --help answers at once; these lists are the library's (tests/test_cli.py checks them).
PROG = "src-dask"
DTYPES = ("float32", "float64", "complex64", "complex128")  # trains.SUPPORTED_DTYPES
KINDS = ("mps", "mpo", "stack", "heisenberg", "ising")  # problems.SPEC_DEFAULTS


class CLIError(Exception):
    """A failure reported as one line, with exit status 1."""


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors on one line: ``src-dask: error: ...`` (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message} (see '{self.prog} --help')\n")


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")


def _err(line: str) -> None:
    sys.stderr.write(f"{PROG}: {line}\n")
    sys.stderr.flush()


def _typed(cast: Callable[[str], Any], ok: Callable[[Any], bool], want: str) -> Any:
    """An argparse ``type``: ``cast(text)`` where ``ok`` holds of it, else the usage
    error "expected {want}, got {text!r}"."""
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


def _refuse_existing(path: str, overwrite: bool) -> None:
    """Something at an output path without --overwrite: refused before any work (what
    else ``storage.save`` refuses, ``storage.check_writable`` says)."""
    if os.path.lexists(path) and not overwrite:
        raise CLIError(f"{path}: already exists; pass --overwrite to replace it")


def _cluster_flags(args: argparse.Namespace, protocol: bool = True) -> None:
    """Where-to-run flags that go together, checked as argparse checks flags (a usage
    error): the local cluster's options need one (--workers/--gpus), the three TLS
    files go together and need a cluster, --protocol needs --gpus (``protocol``).
    Sets the local options' defaults and ``args.security`` (``tls.security``)."""
    local = args.workers is not None or args.gpus is not None
    for flag in ("--threads", "--memory-limit", "--local-directory"):
        if getattr(args, flag[2:].replace("-", "_")) is not None and not local:
            args.parser.error(f"{flag}: sets up the local cluster of --workers N or --gpus N; "
                              "add one of them (a --scheduler-file cluster has its own)")
    if args.threads is not None and args.gpus is not None:
        args.parser.error("--threads: is for --workers N (a GPU worker runs one thread)")
    args.threads = 1 if args.threads is None else args.threads
    args.memory_limit = "auto" if args.memory_limit is None else args.memory_limit
    files = {"--tls-ca-file": args.tls_ca_file, "--tls-cert": args.tls_cert,
             "--tls-key": args.tls_key}
    args.security = None
    if any(files.values()):
        if not all(files.values()):
            missing = ", ".join(k for k, v in files.items() if not v)
            args.parser.error(f"--tls-ca-file, --tls-cert and --tls-key go together (missing "
                              f"{missing})")
        if not (args.scheduler_file or args.workers or args.gpus):
            args.parser.error("--tls-*: TLS is for a cluster; add --scheduler-file FILE, "
                              "--workers N or --gpus N")
        from . import tls

        args.security = tls.security(*files.values(), names=list(files))
    if protocol and args.protocol is not None and args.gpus is None:
        args.parser.error("--protocol: chooses how the GPUs of --gpus N talk; add --gpus N")


@contextlib.contextmanager
def _compute_client(args: argparse.Namespace, dashboard: bool = True) -> Iterator[Any]:
    """The ``distributed.Client`` that a command computes on (a scheduler file's cluster
    or a local one, whose dashboard goes to stderr where ``dashboard``), or None for
    Dask's threaded scheduler in this process."""
    if args.scheduler_file is not None:
        from distributed import Client

        from . import tls

        if not os.path.isfile(args.scheduler_file):
            raise CLIError(f"{args.scheduler_file}: no such scheduler file")
        address = tls.scheduler_tls_address(args.scheduler_file, args.security)
        if address is not None:  # Dask's own error would speak of an ``ssl_context``
            raise CLIError(f"{args.scheduler_file}: the scheduler at {address} takes TLS "
                           "connections only; pass --tls-ca-file, --tls-cert and --tls-key "
                           "(or set distributed.comm.tls in Dask config)")
        with Client(scheduler_file=args.scheduler_file, security=args.security) as client:
            workers = len(client.scheduler_info()["workers"])
            _err(f"connected to {client.scheduler.address} ({workers} workers); dashboard: "
                 f"{client.dashboard_link}")
            yield client
    elif args.gpus is not None or args.workers is not None:
        where = {"gpus": args.gpus, "protocol": args.protocol} if args.gpus is not None else \
            {"gpus": 0, "n_workers": args.workers, "threads_per_worker": args.threads}
        with _local_client(args.host, memory_limit=args.memory_limit, security=args.security,
                           local_directory=args.local_directory, **where) as client:
            if dashboard:
                _err(f"dashboard: {client.dashboard_link}")
            yield client
    else:
        yield None


def _local_client(host: str, **options: Any) -> Any:
    """``interrupts.local_client`` on ``src_dask.cluster(host=host, **options)``, its
    dashboard on a free port (None would take port 8787 all the same)."""
    from distributed.comm.addressing import unparse_host_port

    import src_dask

    def start() -> Any:
        try:
            return src_dask.cluster(host=host, dashboard_address=unparse_host_port(host, 0),
                                    **options)
        except ValueError as err:
            if "no usable GPU" not in str(err):
                raise
            raise CLIError("--gpus: no usable GPU here (CuPy and a CUDA device); use "
                           "--workers N for a CPU cluster") from None
    return local_client(start)


@contextlib.contextmanager
def _log_to_stderr(enabled: bool) -> Iterator[None]:
    """The ``src_dask`` logger's INFO messages on stderr while the block runs (-v); the
    handler removed and the level restored afterwards, so ``main`` can run again."""
    import logging

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


def _open_inputs(paths: Sequence[str]) -> list[Any]:
    """The trains saved at ``paths`` (``storage.open_trains``), lazily."""
    from . import storage

    try:
        return storage.open_trains(*paths)
    except StoreError as err:
        if "not a src_dask train" in str(err):
            raise CLIError(f"{err} or '{PROG} generate'") from None
        raise


# -- the commands ----------------------------------------------------------------------
def demo(args: argparse.Namespace) -> int:
    """MPO·MPS on a local cluster; the error against the exact product and the time."""
    import src_dask
    from src_dask import problems
    from src_dask.trains import TensorTrain, exact_product

    # decaying bonds: a compressible product, so the errors are worth reading
    mpo = problems.random_mpo(args.sites, args.mpo_bond, seed=args.seed, decay=0.5)
    mps = problems.random_mps(args.sites, args.bond, seed=args.seed + 1, decay=0.9)
    mpo, mps = (TensorTrain(t.to_numpy(), t.kind) for t in (mpo, mps))  # in memory
    exact = exact_product(mpo, mps)
    with _local_client(args.host, gpus=0, n_workers=args.workers,
                       threads_per_worker=1) as client:
        _out(f"dashboard: {client.dashboard_link}")
        _out(f"problem:   MPO (bond {args.mpo_bond}) · MPS (bond {args.bond}), {args.sites} "
             f"sites, complex128; exact product bond {max(exact.bond_dims)}")
        for oversample in (0, "auto"):
            t0 = time.perf_counter()
            y = src_dask.apply(mpo, mps, args.chi_out, oversample=oversample, seed=args.seed,
                               client=client)
            dt = time.perf_counter() - t0
            diff = y.norm() ** 2 + exact.norm() ** 2 - 2 * y.vdot(exact).real
            _out(f"chi_out={args.chi_out:<4d} oversample={oversample!s:<5} relative error "
                 f"{math.sqrt(max(diff, 0.0)) / exact.norm():.3e}   time {dt:6.2f} s")
        if args.wait:
            input("press Enter to stop the cluster ")
    return 0


def generate(args: argparse.Namespace) -> int:
    """Write a reference problem (``problems.spec``, ``problems.write``) to ``args.path``."""
    from dask.utils import format_bytes

    from . import problems

    given = {name: getattr(args, name) for name in problems.SPEC_OPTIONS}
    try:
        spec = problems.spec(args.kind, **{k: v for k, v in given.items() if v is not None})
    except ValueError as err:  # an option that does not apply to the kind
        args.parser.error(str(err))
    path = os.path.abspath(args.path)
    _refuse_existing(path, args.overwrite)
    t0 = time.perf_counter()
    trains = problems.write(spec, path, overwrite=args.overwrite)
    what = "stack " + "·".join(trains) if spec["kind"] == "stack" else spec["kind"]
    _out(f"wrote {what} to {args.path}: {len(next(iter(trains.values())))} sites, "
         f"{spec['dtype']}, {format_bytes(sum(t.nbytes for t in trains.values()))} in "
         f"{time.perf_counter() - t0:.1f} s")
    return 0


def run(args: argparse.Namespace) -> int:
    """SRC on saved trains; the result written to ``args.out`` (atomically)."""
    from dask.utils import format_bytes

    import src_dask

    from . import storage

    _cluster_flags(args)  # usage errors first
    out = os.path.realpath(args.out)
    trains = _open_inputs(args.trains)
    _refuse_existing(out, args.overwrite)
    # --out must not write over (or around) an input or the run store
    apart = {f"input {t.name}": t for t in trains} | ({} if args.store is None else
                                                      {"--store": args.store})
    storage.check_writable(out, True, apart_from=apart)  # before any work
    if args.report is not None and not (args.workers or args.gpus or args.scheduler_file):
        args.parser.error("--report: Dask's performance report needs a cluster; add "
                          "--workers N, --gpus N or --scheduler-file FILE")
    options = {"chi_out": args.chi_out, "oversample": args.oversample, "cutoff": args.cutoff,
               "dtype": args.dtype, "seed": args.seed, "chunk": args.chunk}
    before = storage.run_progress(args.store)
    with _log_to_stderr(args.verbose), _compute_client(args) as client:
        t0 = time.perf_counter()
        try:
            result = src_dask.src(*trains, **options, client=client, store=args.store,
                                  overwrite=args.overwrite_store, performance_report=args.report,
                                  progress=sys.stderr.isatty() if args.progress is None
                                  else args.progress)
        except OverwriteNeededError as err:  # the API's option is --overwrite-store
            raise CLIError(f"{err.reason}; pass --overwrite-store to replace it") from err
        options["seed"] = result.seed  # drawn by src when not given (a store keeps its own)
        made_by = {"command": "src-dask run", "inputs": [os.path.abspath(p) for p in args.trains],
                   "store": args.store and os.path.abspath(args.store), **options}
        storage.save(result, out, overwrite=args.overwrite, attrs={"made_by": made_by})
        seconds = time.perf_counter() - t0
        error = src_dask.distance(result, *trains, client=client) if args.check else None
    if before is not None and before.resumed():
        _out(before.resumed())
    # the product computed: the factors in order, a bra where an MPS is on the left
    side = "bra" if len(trains) > 1 and trains[0].kind == "mps" else "ket"
    _out(f"wrote {result.kind} ({_product(trains)}, {side}) to {args.out}: {len(result)} sites, "
         f"max bond {max(result.bond_dims)}, {result.dtype}, {format_bytes(result.nbytes)} in "
         f"{seconds:.2f} s (seed {options['seed']})"
         + ("" if error is None else f"; relative error {error:.3e}"))
    return 0


def _product(trains: Sequence[Any]) -> str:
    return "·".join(t.kind.upper() for t in trains)


def distance(args: argparse.Namespace) -> int:
    """The relative error of a saved result against the product of saved trains."""
    import src_dask

    _cluster_flags(args, protocol=False)
    result, *trains = _open_inputs([args.result, *args.trains])
    with _compute_client(args) as client:
        error = src_dask.distance(result, *trains, client=client)
    _out(f"{args.result} against {_product(trains)}: relative error {error:.3e}")
    return 0


def plan(args: argparse.Namespace) -> int:
    """What ``run`` with the same arguments would need (``src_dask.plan``), printed;
    nothing is computed or written. A problem that cannot fit is an error (exit 1)."""
    import dataclasses

    import src_dask

    _cluster_flags(args)
    trains = _open_inputs(args.trains)
    options = {"chi_out": args.chi_out, "oversample": args.oversample, "cutoff": args.cutoff,
               "dtype": args.dtype, "chunk": args.chunk, "store": args.store}
    with _compute_client(args, dashboard=False) as client:  # nothing to watch
        result = src_dask.plan(*trains, **options, client=client)
    _out(json.dumps(dataclasses.asdict(result), indent=1) if args.json else str(result))
    return 0


def info(args: argparse.Namespace) -> int:
    """Describe a saved train, a stack of trains, or a run store (``storage.describe``)."""
    from . import storage

    if not os.path.exists(args.path):
        raise CLIError(f"{args.path}: no such file or directory")
    data = storage.describe(args.path)
    _out(json.dumps(data, indent=2) if args.json else str(data))
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
        _err("interrupted" + _where_it_stopped(getattr(args, "store", None)))
        return 130
    except BrokenPipeError:  # stdout closed early (| head): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as err:
        if args.debug:
            raise
        msg = " ".join(str(err).split()) or type(err).__name__  # one line, typed if unclear
        plain = (CLIError, ValueError, TypeError, OSError, RuntimeError, FloatingPointError,
                 MemoryError)
        _err(f"error: {msg if isinstance(err, plain) else f'{type(err).__name__}: {msg}'}")
        return 1


def _where_it_stopped(store: str | None) -> str:
    """What an interrupted ``run --store`` keeps (``storage.run_progress``), or ""."""
    if store is None:
        return ""
    from . import storage

    progress = storage.run_progress(store)
    return "" if progress is None else " " + progress.stopped()


# -- the parser: the options of each command, as tables ------------------------------------
_N = {"type": _positive_int, "metavar": "N"}
_PROBLEM = [  # the trains and the options of ``src`` that run and plan share
    ("trains", {"nargs": "+", "metavar": "TRAIN",
                "help": "saved trains (src_dask.save / 'src-dask generate'), leftmost first"}),
    ("--chi-out", {**_N, "required": True, "help": "bond dimension of the result"}),
    ("--oversample", {"type": _oversample, "default": 0, "metavar": "N|auto", "help":
                      "extra sketch columns, or 'auto' = max(ceil(chi_out/2), 10); with N > 0 "
                      "the result is rounded exactly to chi_out (default 0)"}),
    ("--cutoff", {"type": _cutoff, "default": 0.0, "metavar": "X",
                  "help": "relative singular-value threshold in [0, 1) (default 0)"}),
    ("--dtype", {"choices": DTYPES,
                 "help": "working and output dtype (default: promoted from the inputs)"}),
    ("--chunk", {**_N, "help": "sketch columns per block (default: one block per worker "
                 "thread, none over 256 MiB)"}),
]
_WHERE = [  # mutually exclusive: where a command computes
    ("--scheduler-file", {"metavar": "FILE",
                          "help": "connect to the Dask cluster of this scheduler file"}),
    ("--gpus", {**_N, "help": "start a local dask-cuda cluster on N GPUs (src_dask.cluster)"}),
    ("--workers", {**_N, "help": "start a local CPU cluster of N worker processes"}),
]
_LOCAL = [  # how the local cluster is set up
    ("--threads", {**_N, "help": "--workers: threads per worker (default 1)"}),
    ("--protocol", {"choices": ("ucx", "tcp"), "default": None, "help": "--gpus: how the GPUs "
                    "talk (default: ucx on several GPUs when it is installed, at NVLink speed, "
                    "but it listens on every network interface without authentication; tcp "
                    "stays on --host, at about 1 GB/s)"}),
    ("--memory-limit", {"metavar": "BYTES", "help": "--gpus/--workers: host memory per worker "
                        "before spilling to disk (default auto)"}),
    ("--local-directory", {"metavar": "DIR", "help": "--gpus/--workers: under which folder "
                           "workers spill to disk (in a fresh subfolder only you can enter; "
                           "default: the temporary directory)"}),
    ("--host", {"default": "127.0.0.1", "metavar": "ADDR", "help": "--gpus/--workers: address "
                "the scheduler, workers and dashboard listen on (default 127.0.0.1: this "
                "machine only; 0.0.0.0 opens them to the network: add TLS)"}),
]
_TLS = [("--tls-ca-file", {"metavar": "PEM", "help": "the certificate authority's certificate"}),
        ("--tls-cert", {"metavar": "PEM", "help": "this side's certificate (signed by the CA)"}),
        ("--tls-key", {"metavar": "PEM", "help": "its private key"})]
_TLS_HELP = ("Encrypt and authenticate the connections to the scheduler and between workers "
             "(--scheduler-file: the cluster's certificates; --gpus/--workers: the local "
             "cluster uses them). Give all three; without them, Dask config "
             "(distributed.comm.tls) decides.")
_FLAG = {"action": "store_true"}
_JSON = ("--json", {**_FLAG, "help": "print JSON instead of text"})
_DEMO = [
    ("--sites", {"type": _positive_int, "default": 40, "help": "sites (default 40)"}),
    ("--bond", {"type": _positive_int, "default": 64, "help": "MPS bond dimension (default 64)"}),
    ("--mpo-bond", {"type": _positive_int, "default": 4,
                    "help": "MPO bond dimension (default 4)"}),
    ("--chi-out", {"type": _positive_int, "default": 64,
                   "help": "bond dimension of the result (default 64)"}),
    ("--workers", {"type": _positive_int, "default": 2,
                   "help": "worker processes of the local cluster (default 2)"}),
    ("--seed", {"type": _non_negative_int, "default": 0, "help": "seed (default 0)"}),
    ("--wait", {**_FLAG, "help": "keep the dashboard up until Enter"}),
    ("--host", {"default": "127.0.0.1", "metavar": "ADDR", "help": "address the cluster and its "
                "dashboard listen on (default 127.0.0.1: this machine only; 0.0.0.0 opens them "
                "to the network)"}),
]
_GENERATE = [
    ("kind", {"choices": KINDS, "metavar": "KIND", "help": "mps, mpo, stack, heisenberg or ising"}),
    ("path", {"metavar": "PATH", "help": "where to write (a Zarr group)"}),
    ("--sites", {**_N, "help": "number of sites (default 50)"}),
    ("--bond", {**_N, "help": "bond dimension (mps 64, mpo 4; stack: of N, V and U, 4)"}),
    ("--phys", {**_N, "help": "physical dimension (mps, mpo 2; stack 4)"}),
    ("--dm", {**_N, "help": "stack: bond D_M of M (default 1000)"}),
    ("--seed", {"type": _non_negative_int, "metavar": "N", "help": "random problems: seed "
                "(default 0; the stack's factor i uses seed+i)"}),
    ("--dtype", {"choices": DTYPES, "help": "dtype of the cores"}),
    ("--j", {"type": float, "help": "Hamiltonians: coupling (default 1; > 0 is "
             "antiferromagnetic)"}),
    ("--jz", {"type": float, "help": "heisenberg: ZZ coupling (default --j; XXZ anisotropy)"}),
    ("--field", {"type": float, "help": "Hamiltonians: field, bz for heisenberg, bx for ising "
                 "(default 0)"}),
    ("--overwrite", {**_FLAG, "help": "replace PATH if it holds a src_dask train or stack"}),
]
_RUN = [
    ("--store", {"metavar": "DIR", "help": "run store (Zarr) for environments and progress: "
                 "bounded memory, resumable"}),
    ("--out", {"required": True, "metavar": "PATH", "help": "where to write the result"}),
    ("--seed", {"type": _non_negative_int, "metavar": "N", "help": "seed of the sketch "
                "(default: a fresh one, printed and recorded with the output; with --store, "
                "the store's)"}),
    ("--overwrite", {**_FLAG, "help": "replace --out if it holds a src_dask train"}),
    ("--progress", {"action": argparse.BooleanOptionalAction, "help": "a progress bar by pass "
                    "and site on stderr (default: when stderr is a terminal)"}),
    ("--report", {"metavar": "HTML", "help": "write Dask's performance report of the run to "
                  "this HTML file (needs --workers, --gpus or --scheduler-file)"}),
    ("-v --verbose", {**_FLAG, "help": "log what the run does (problem, sketch, device) on "
                      "stderr"}),
    ("--overwrite-store", {**_FLAG, "help": "replace a --store that holds a run of other "
                           "inputs or options (a store of the same run is resumed, not "
                           "replaced)"}),
    ("--check", {**_FLAG, "help": "also print the result's relative error against the exact "
                 "product (src_dask.distance: streamed overlaps, about as dear as the run)"}),
]
_PLAN = [("--store", {"metavar": "DIR", "help": "plan a run with a run store there (its disk "
                      "is checked)"}), _JSON]
_DISTANCE = [("result", {"metavar": "RESULT", "help": "a saved train (e.g. run's --out)"}),
             ("trains", {"nargs": "+", "metavar": "TRAIN",
                         "help": "the factors as given to run, leftmost first"})]
_INFO = [("path", {"metavar": "PATH", "help": "a saved train, stack or run store"}), _JSON]
_GENERATE_KINDS = """\
  mps         random MPS, complex Gaussian, bonds min(--bond, phys^k), norm ~1
  mpo         random MPO, same, |A x| ~ |x|
  stack       the src-method stack N·V·M·U: PATH/N, PATH/V, PATH/M, PATH/U;
              legs 4x4, bonds --bond, --bond, --dm, --bond, entries
              (N(0,1) + i N(0,1))/sqrt(bond*4); drawn site by site, never held
              in memory ('src-dask run PATH' takes the four factors in order)
  heisenberg  spin-1/2 XXZ chain, H = sum j (SxSx + SySy) + jz SzSz - field Sz
              (quimb's MPO_ham_heis), exact MPO of bond 5
  ising       spin-1/2 transverse-field Ising, H = sum j SzSz - field Sx
              (quimb's MPO_ham_ising), exact MPO of bond 3"""
_WHERE_TEXT = ("--scheduler-file (a running cluster), --gpus (a local dask-cuda cluster, one "
               "worker per GPU), --workers (a local CPU cluster), else Dask's threaded "
               "scheduler in this process.")
#: Each command: its function, one line of help, its description's paragraphs (prose is
#: filled to 79 columns, indented blocks kept), its options; ``cluster``: where it runs.
_COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], int], str, list[str], list, bool]] = {
    "demo": (demo, "run SRC on a built-in MPO·MPS problem on a local cluster", [
        "MPO·MPS with decaying bonds (a compressible product) on a local cluster: prints the "
        "dashboard address and, for plain and oversampled SRC, the relative error against the "
        "exact product and the time."], _DEMO, False),
    "generate": (generate, "write a reference problem (random MPS/MPO, the src-method stack, "
                 "Heisenberg or Ising MPO) to Zarr", [
        "Write a reference problem to PATH with src_dask.save (a Zarr group; PATH appears only "
        "once it is completely written).", _GENERATE_KINDS,
        "Spin operators are S = sigma/2. Random problems are the same for the same options and "
        "seed. Defaults: 50 sites; mps bond 64, mpo bond 4, stack --dm 1000 (12 GB); complex128 "
        "for random problems, float64 for Hamiltonians."], _GENERATE, False),
    "run": (run, "compress the product of saved trains with SRC; write the result to Zarr", [
        "Compress the product TRAIN[0]·TRAIN[1]·… (leftmost first; a stack written by "
        "'generate stack' counts as its factors) to bond dimension --chi-out with src_dask.src, "
        "and write the result to --out with src_dask.save. The output appears only when the run "
        "has finished: a failed or interrupted run leaves nothing at --out. With --store, "
        "rerunning the same command resumes an interrupted run.",
        "Where it runs: " + _WHERE_TEXT], _PROBLEM + _RUN, True),
    "plan": (plan, "say what 'run' would need (memory per worker, disk, FLOPs, tasks); run "
             "nothing", [
        "The plan of 'src-dask run' with the same trains and options (src_dask.plan): sketch "
        "blocks, projected-core row blocks, the peak memory of each worker (host, and device on "
        "GPUs), the environments' bytes, the disk a --store needs, FLOPs per pass and the "
        "number of tasks. Nothing is computed; a problem that cannot fit the workers or the "
        "disk is refused (exit 1) with the numbers.",
        "The workers planned for: --scheduler-file (a running cluster), --gpus or --workers (a "
        "local cluster, started to ask its workers what they have), else Dask's threaded "
        "scheduler in this process."], _PROBLEM + _PLAN, True),
    "distance": (distance, "the relative error of a saved result against the product of saved "
                 "trains", [
        "||RESULT - TRAIN[0]·TRAIN[1]·…|| / ||TRAIN[0]·TRAIN[1]·…||, exactly, by streamed "
        "overlaps (src_dask.distance), without forming the product; it resolves errors down to "
        "about 1e-7."], _DISTANCE, True),
    "info": (info, "describe a saved train, a stack or a run store", [
        "For a train: kind, sites, bond and physical dimensions, dtype and size. For a stack: "
        "each factor. For a run store: the run's options and inputs, its progress (pass 1 "
        "blocks done, pass 2 next site), whether it is complete, and the bytes it plans to "
        "use."], _INFO, False),
}


def _add(p: Any, options: list) -> None:
    for flags, kwargs in options:
        p.add_argument(*flags.split(), **kwargs)


def _parser() -> argparse.ArgumentParser:
    """The command line's parser: one subcommand per entry of :data:`_COMMANDS`."""
    import textwrap

    from . import __version__

    fmt = argparse.RawDescriptionHelpFormatter  # help text as written: prose filled here
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error (for developers)")
    parser = _Parser(prog=PROG, description=__doc__, formatter_class=fmt)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (func, help, description, options, cluster) in _COMMANDS.items():
        text = "\n\n".join(d if d.startswith("  ") else textwrap.fill(d, 79) for d in description)
        p = sub.add_parser(name, parents=[common], formatter_class=fmt, help=help,
                           description=text)
        _add(p, options)
        if cluster:
            _add(p.add_mutually_exclusive_group(), _WHERE)
            _add(p, _LOCAL)
            _add(p.add_argument_group("TLS", _TLS_HELP), _TLS)
        p.set_defaults(func=func, parser=p)
    return parser
