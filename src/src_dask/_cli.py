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
from typing import Any

from ._signals import forget, local_client
from .errors import OverwriteNeededError, StoreError

# The library (Dask's arrays, NumPy) is imported by the commands that use it, so that
# --help answers at once; these lists are the library's (tests/test_cli.py checks them).
PROG = "src-dask"
DTYPES = ("float32", "float64", "complex64", "complex128")  # trains.SUPPORTED_DTYPES
KINDS = ("mps", "mpo", "stack", "heisenberg", "ising")  # problems.SPEC_DEFAULTS


class CLIError(Exception):
    """A failure reported as one line, with exit status 1."""


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors on one line: ``src-dask: error: ...`` (exit 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{PROG}: error: {message} (see '{self.prog} --help')\n")


# -- small helpers -----------------------------------------------------------------
def _out(line: str = "") -> None:
    sys.stdout.write(line + "\n")


def _err(line: str) -> None:
    sys.stderr.write(f"{PROG}: {line}\n")
    sys.stderr.flush()



def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _oversample(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return _non_negative_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected an integer >= 0 or 'auto', got {text!r}") from None


def _cutoff(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def _wrap(*paragraphs: str) -> str:
    """Help text: prose paragraphs filled to 79 columns; indented blocks kept as written."""
    import textwrap

    return "\n\n".join(p if p.startswith("  ") else textwrap.fill(p, 79) for p in paragraphs)


def _one_line(err: BaseException) -> str:
    """An exception as one line: its message, with the type when that is not obvious."""
    msg = " ".join(str(err).split()) or type(err).__name__
    plain = (CLIError, ValueError, TypeError, OSError, RuntimeError, FloatingPointError,
             MemoryError)
    return msg if isinstance(err, plain) else f"{type(err).__name__}: {msg}"


# -- what is at a path ---------------------------------------------------------------
def _check_out(path: str, overwrite: bool, **checks: Any) -> None:
    """Refuse, before any work, an output path that ``storage.save`` would not write:
    something there without ``--overwrite``, or anything src_dask did not write
    (``checks``: what else ``storage.check_writable`` checks)."""
    from . import storage

    if os.path.lexists(path) and not overwrite:
        raise CLIError(f"{path}: already exists; pass --overwrite to replace it")
    storage.check_writable(path, overwrite=True, **checks)


# -- local clusters ------------------------------------------------------------------
def _check_local_options(args: argparse.Namespace) -> None:
    """Options of a local cluster given without one (--workers/--gpus) would be
    silently ignored: a usage error instead; then their defaults."""
    local = args.workers is not None or args.gpus is not None
    for name, flag in (("threads", "--threads"), ("memory_limit", "--memory-limit"),
                       ("local_directory", "--local-directory")):
        if getattr(args, name) is not None and not local:
            args.parser.error(f"{flag}: sets up the local cluster of --workers N or --gpus N; "
                              "add one of them (a --scheduler-file cluster has its own)")
    if args.threads is not None and args.gpus is not None:
        args.parser.error("--threads: is for --workers N (a GPU worker runs one thread)")
    args.threads = 1 if args.threads is None else args.threads
    args.memory_limit = "auto" if args.memory_limit is None else args.memory_limit


def _security(args: argparse.Namespace) -> Any:
    """The ``distributed.Security`` of ``--tls-ca-file/--tls-cert/--tls-key`` (TLS
    required, the one certificate for client, scheduler and workers), or None when
    they are not given: then Dask config (``distributed.comm.tls``) decides."""
    files = {"--tls-ca-file": args.tls_ca_file, "--tls-cert": args.tls_cert,
             "--tls-key": args.tls_key}
    if not any(files.values()):
        return None
    if not all(files.values()):
        missing = ", ".join(k for k, v in files.items() if not v)
        args.parser.error(f"--tls-ca-file, --tls-cert and --tls-key go together (missing "
                          f"{missing})")
    if not (args.scheduler_file or args.workers or args.gpus):
        args.parser.error("--tls-*: TLS is for a cluster; add --scheduler-file FILE, "
                          "--workers N or --gpus N")
    for option, path in files.items():
        if not os.path.isfile(path):
            raise CLIError(f"{option} {path}: no such file")
    from distributed import Security

    ca, cert, key = files.values()
    return Security(tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key,
                    tls_scheduler_cert=cert, tls_scheduler_key=key, tls_worker_cert=cert,
                    tls_worker_key=key, require_encryption=True)


def _check_tls(scheduler_file: str, security: Any) -> None:
    """A scheduler that takes TLS only, and no certificate to connect with: say so
    (Dask's own error speaks of an ``ssl_context``)."""
    from distributed import Security

    try:
        with open(scheduler_file) as f:
            address = str(json.load(f).get("address", ""))
    except (OSError, ValueError, AttributeError):
        return  # not ours to judge: Client reports it
    if address.startswith("tls://") and not (security or Security()).tls_client_cert:
        raise CLIError(f"{scheduler_file}: the scheduler at {address} takes TLS connections "
                       "only; pass --tls-ca-file, --tls-cert and --tls-key (or set "
                       "distributed.comm.tls in Dask config)")


# -- demo ------------------------------------------------------------------------------
def demo(args: argparse.Namespace) -> int:
    """MPO·MPS on a local cluster; the error against the exact product and the time."""
    from distributed.comm.addressing import unparse_host_port

    import src_dask
    from src_dask import problems
    from src_dask.trains import TensorTrain, exact_product

    # decaying bonds: a compressible product, so the errors are worth reading
    mpo = problems.random_mpo(args.sites, args.mpo_bond, seed=args.seed, decay=0.5)
    mps = problems.random_mps(args.sites, args.bond, seed=args.seed + 1, decay=0.9)
    mpo, mps = (TensorTrain(t.to_numpy(), t.kind) for t in (mpo, mps))  # in memory
    exact = exact_product(mpo, mps)

    def start() -> Any:
        return src_dask.cluster(gpus=0, n_workers=args.workers, threads_per_worker=1,
                                host=args.host,
                                dashboard_address=unparse_host_port(args.host, 0))

    with local_client(start) as client:
        out = sys.stdout
        out.write(f"dashboard: {client.dashboard_link}\n")
        out.write(f"problem:   MPO (bond {args.mpo_bond}) · MPS (bond {args.bond}), "
                  f"{args.sites} sites, complex128; exact product bond "
                  f"{max(exact.bond_dims)}\n")
        for oversample in (0, "auto"):
            t0 = time.perf_counter()
            y = src_dask.apply(mpo, mps, args.chi_out, oversample=oversample, seed=args.seed,
                               client=client)
            dt = time.perf_counter() - t0
            diff = y.norm() ** 2 + exact.norm() ** 2 - 2 * y.vdot(exact).real
            err = math.sqrt(max(diff, 0.0)) / exact.norm()
            out.write(f"chi_out={args.chi_out:<4d} oversample={oversample!s:<5} "
                      f"relative error {err:.3e}   time {dt:6.2f} s\n")
        if args.wait:
            input("press Enter to stop the cluster ")
    return 0


# -- generate ----------------------------------------------------------------------------
def _generate_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The kind's options (``problems.spec``); one that does not apply is a usage error."""
    from . import problems

    given = {name: getattr(args, name) for name in problems.SPEC_OPTIONS}
    try:
        return problems.spec(args.kind, **{k: v for k, v in given.items() if v is not None})
    except ValueError as err:
        args.parser.error(str(err))
        raise  # not reached: error() exits


def generate(args: argparse.Namespace) -> int:
    """Write a reference problem to ``args.path`` (a stack: one train per factor)."""
    from dask.utils import format_bytes

    from . import problems, storage

    spec = _generate_spec(args)
    if spec.get("sites", 2) < 2:
        args.parser.error(f"--sites: a train needs at least 2 sites, got {spec['sites']}")
    path = os.path.abspath(args.path)
    _check_out(path, args.overwrite, nbytes=problems.spec_bytes(spec))  # before drawing
    trains = problems.build(spec)
    need = sum(t.nbytes for t in trains.values())
    t0 = time.perf_counter()
    if spec["kind"] == "stack":
        storage.save_stack(trains, path, overwrite=args.overwrite, attrs={"generated": spec})
    else:
        storage.save(trains[""], path, overwrite=args.overwrite, attrs={"generated": spec})
    seconds = time.perf_counter() - t0
    what = "stack " + "·".join(trains) if spec["kind"] == "stack" else spec["kind"]
    first = next(iter(trains.values()))
    _out(f"wrote {what} to {args.path}: {len(first)} sites, {spec['dtype']}, "
         f"{format_bytes(need)} in {seconds:.1f} s")
    return 0


# -- run ------------------------------------------------------------------------------------
def _open_inputs(paths: Sequence[str]) -> list[Any]:
    """The saved trains at ``paths`` (``storage.open_trains``: a stack expands to its
    factors), lazily: nothing is read yet."""
    from . import storage

    try:
        return storage.open_trains(*paths)
    except StoreError as err:
        if "not a src_dask train" in str(err):
            raise CLIError(f"{err} or '{PROG} generate'") from None
        raise


@contextlib.contextmanager
def _compute_client(args: argparse.Namespace, dashboard: bool = True) -> Iterator[Any]:
    """The ``distributed.Client`` that ``run`` computes on, or None for Dask's
    threaded scheduler in this process; ``dashboard``: a local cluster's dashboard
    address on stderr (``plan`` computes nothing to watch: it says none). Not None
    for none: the scheduler's HTTP server would then take port 8787 all the same."""
    if args.scheduler_file is not None:
        from distributed import Client

        if not os.path.isfile(args.scheduler_file):
            raise CLIError(f"{args.scheduler_file}: no such scheduler file")
        _check_tls(args.scheduler_file, args.security)
        with Client(scheduler_file=args.scheduler_file, security=args.security) as client:
            _err(f"connected to {client.scheduler.address} "
                 f"({len(client.scheduler_info()['workers'])} workers); dashboard: "
                 f"{client.dashboard_link}")
            yield client
        return
    if args.gpus is not None or args.workers is not None:
        from distributed.comm.addressing import unparse_host_port

        import src_dask

        options: dict[str, Any] = {"memory_limit": args.memory_limit,
                                   "local_directory": args.local_directory,
                                   "host": args.host, "security": args.security,
                                   "dashboard_address": unparse_host_port(args.host, 0)}
        if args.gpus is not None:
            options.update(gpus=args.gpus, protocol=args.protocol)
        else:
            options.update(gpus=0, n_workers=args.workers, threads_per_worker=args.threads)

        def start() -> Any:
            try:
                return src_dask.cluster(**options)
            except ValueError as err:
                if "no usable GPU" in str(err):
                    raise CLIError("--gpus: no usable GPU here (CuPy and a CUDA device); "
                                   "use --workers N for a CPU cluster") from None
                raise

        with local_client(start) as client:
            if dashboard:
                _err(f"dashboard: {client.dashboard_link}")
            yield client
        return
    yield None


@contextlib.contextmanager
def _log_to_stderr(enabled: bool = True) -> Iterator[None]:
    """While the block runs, show the ``src_dask`` logger's INFO messages (what a run
    does) on stderr; afterwards the handler is removed and the logger's level restored,
    so ``main`` can be called in-process again and again (no handler is left behind on a
    stream that may since have been closed)."""
    if not enabled:
        yield
        return
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("src-dask: %(message)s"))
    logger = logging.getLogger("src_dask")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def run(args: argparse.Namespace) -> int:
    """SRC on saved trains; the result written to ``args.out`` (atomically)."""
    from dask.utils import format_bytes

    import src_dask

    from . import storage

    _check_local_options(args)
    args.security = _security(args)  # usage errors first
    if args.protocol is not None and args.gpus is None:
        args.parser.error("--protocol: chooses how the GPUs of --gpus N talk; add --gpus N")
    out = os.path.realpath(args.out)
    trains = _open_inputs(args.trains)
    # --out must not write over (or around) an input or the run store
    apart = {f"input {t.name}": t for t in trains}
    if args.store is not None:
        apart["--store"] = args.store
    _check_out(out, args.overwrite, apart_from=apart)  # before any work
    if args.report is not None and not (args.workers or args.gpus or args.scheduler_file):
        args.parser.error("--report: Dask's performance report needs a cluster; add "
                          "--workers N, --gpus N or --scheduler-file FILE")
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    options = {"chi_out": args.chi_out, "oversample": args.oversample, "cutoff": args.cutoff,
               "dtype": args.dtype, "seed": args.seed, "chunk": args.chunk}
    before = _store_progress(args.store)
    with _log_to_stderr(args.verbose), _compute_client(args) as client:
        t0 = time.perf_counter()
        try:
            result = src_dask.src(*trains, **options, client=client, store=args.store,
                                  overwrite=args.overwrite_store, progress=progress,
                                  performance_report=args.report)
        except OverwriteNeededError as err:
            # the API's option is this command's --overwrite-store
            raise CLIError(f"{err.reason}; pass --overwrite-store to replace it") from err
        options["seed"] = result.seed  # drawn by src when not given (a store keeps its own)
        made_by = {"command": "src-dask run", "inputs": [os.path.abspath(p) for p in args.trains],
                   "store": args.store and os.path.abspath(args.store), **options}
        storage.save(result, out, overwrite=args.overwrite, attrs={"made_by": made_by})
        seconds = time.perf_counter() - t0
        error = src_dask.distance(result, *trains, client=client) if args.check else None
    began = _how_it_began(before, args.store)
    if began is not None:
        _out(began)
    # the product computed: the factors in order, a bra where an MPS is on the left
    product = "·".join(t.kind.upper() for t in trains)
    side = "bra" if len(trains) > 1 and trains[0].kind == "mps" else "ket"
    _out(f"wrote {result.kind} ({product}, {side}) to {args.out}: {len(result)} sites, max bond "
         f"{max(result.bond_dims)}, {result.dtype}, {format_bytes(result.nbytes)} in "
         f"{seconds:.2f} s (seed {options['seed']})"
         + ("" if error is None else f"; relative error {error:.3e}"))
    return 0


def distance(args: argparse.Namespace) -> int:
    """The relative error of a saved result against the product of saved trains
    (``src_dask.distance``)."""
    import src_dask

    _check_local_options(args)
    args.security = _security(args)
    result, *trains = _open_inputs([args.result, *args.trains])
    with _compute_client(args) as client:
        error = src_dask.distance(result, *trains, client=client)
    product = "·".join(t.kind.upper() for t in trains)
    _out(f"{args.result} against {product}: relative error {error:.3e}")
    return 0


def plan(args: argparse.Namespace) -> int:
    """What ``run`` with the same arguments would need (``src_dask.plan``), printed;
    nothing is computed or written. A problem that cannot fit is an error (exit 1)."""
    import dataclasses

    import src_dask

    _check_local_options(args)
    args.security = _security(args)
    if args.protocol is not None and args.gpus is None:
        args.parser.error("--protocol: chooses how the GPUs of --gpus N talk; add --gpus N")
    trains = _open_inputs(args.trains)
    options = {"chi_out": args.chi_out, "oversample": args.oversample, "cutoff": args.cutoff,
               "dtype": args.dtype, "chunk": args.chunk, "store": args.store}
    with _compute_client(args, dashboard=False) as client:
        result = src_dask.plan(*trains, **options, client=client)
    _out(json.dumps(dataclasses.asdict(result), indent=1) if args.json else str(result))
    return 0


# -- info -------------------------------------------------------------------------------------
def info(args: argparse.Namespace) -> int:
    """Describe a saved train, a stack of trains, or a run store (``storage.describe``)."""
    from . import storage

    if not os.path.exists(args.path):
        raise CLIError(f"{args.path}: no such file or directory")
    data = storage.describe(args.path)
    _out(json.dumps(data, indent=2) if args.json else str(data))
    return 0


# -- the parser ---------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    """The command line's parser: one subcommand per function below."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error (for developers)")
    from . import __version__

    parser = _Parser(prog=PROG, description=__doc__, formatter_class=_FORMAT)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_demo, _add_generate, _add_run, _add_plan, _add_distance, _add_info):
        add(sub, common)
    return parser


#: Help text as written: prose is filled by :func:`_wrap`, tables kept.
_FORMAT = argparse.RawDescriptionHelpFormatter


def _add_demo(sub: Any, common: argparse.ArgumentParser) -> None:
    fmt = _FORMAT
    p = sub.add_parser("demo", parents=[common], formatter_class=fmt,
                       help="run SRC on a built-in MPO·MPS problem on a local cluster",
                       description=_wrap(
                           "MPO·MPS with decaying bonds (a compressible product) on a local "
                           "cluster: prints the dashboard address and, for plain and "
                           "oversampled SRC, the relative error against the exact product "
                           "and the time."))
    p.add_argument("--sites", type=_positive_int, default=40, help="sites (default 40)")
    p.add_argument("--bond", type=_positive_int, default=64,
                   help="MPS bond dimension (default 64)")
    p.add_argument("--mpo-bond", type=_positive_int, default=4,
                   help="MPO bond dimension (default 4)")
    p.add_argument("--chi-out", type=_positive_int, default=64,
                   help="bond dimension of the result (default 64)")
    p.add_argument("--workers", type=_positive_int, default=2,
                   help="worker processes of the local cluster (default 2)")
    p.add_argument("--seed", type=_non_negative_int, default=0, help="seed (default 0)")
    p.add_argument("--wait", action="store_true", help="keep the dashboard up until Enter")
    p.add_argument("--host", default="127.0.0.1", metavar="ADDR",
                   help="address the cluster and its dashboard listen on (default 127.0.0.1: "
                   "this machine only; 0.0.0.0 opens them to the network)")
    p.set_defaults(func=demo, parser=p)


def _add_generate(sub: Any, common: argparse.ArgumentParser) -> None:
    fmt = _FORMAT
    p = sub.add_parser(
        "generate", parents=[common], formatter_class=fmt,
        help="write a reference problem (random MPS/MPO, the src-method stack, "
             "Heisenberg or Ising MPO) to Zarr",
        description=_wrap(
            "Write a reference problem to PATH with src_dask.save (a Zarr group; PATH "
            "appears only once it is completely written).",
            "  mps         random MPS, complex Gaussian, bonds min(--bond, phys^k), norm ~1\n"
        "  mpo         random MPO, same, |A x| ~ |x|\n"
        "  stack       the src-method stack N·V·M·U: PATH/N, PATH/V, PATH/M, PATH/U;\n"
        "              legs 4x4, bonds --bond, --bond, --dm, --bond, entries\n"
        "              (N(0,1) + i N(0,1))/sqrt(bond*4); drawn site by site, never held\n"
        "              in memory ('src-dask run PATH' takes the four factors in order)\n"
        "  heisenberg  spin-1/2 XXZ chain, H = sum j (SxSx + SySy) + jz SzSz - field Sz\n"
        "              (quimb's MPO_ham_heis), exact MPO of bond 5\n"
        "  ising       spin-1/2 transverse-field Ising, H = sum j SzSz - field Sx\n"
        "              (quimb's MPO_ham_ising), exact MPO of bond 3",
            "Spin operators are S = sigma/2. Random problems are the same for the same "
            "options and seed. Defaults: 50 sites; mps bond 64, mpo bond 4, stack --dm 1000 "
            "(12 GB); complex128 for random problems, float64 for Hamiltonians."))
    p.add_argument("kind", choices=KINDS, metavar="KIND",
                   help="mps, mpo, stack, heisenberg or ising")
    p.add_argument("path", metavar="PATH", help="where to write (a Zarr group)")
    p.add_argument("--sites", type=_positive_int, metavar="N", help="number of sites (default 50)")
    p.add_argument("--bond", type=_positive_int, metavar="N",
                   help="bond dimension (mps 64, mpo 4; stack: of N, V and U, 4)")
    p.add_argument("--phys", type=_positive_int, metavar="N",
                   help="physical dimension (mps, mpo 2; stack 4)")
    p.add_argument("--dm", type=_positive_int, metavar="N",
                   help="stack: bond D_M of M (default 1000)")
    p.add_argument("--seed", type=_non_negative_int, metavar="N",
                   help="random problems: seed (default 0; the stack's factor i uses seed+i)")
    p.add_argument("--dtype", choices=DTYPES, help="dtype of the cores")
    p.add_argument("--j", type=float, help="Hamiltonians: coupling (default 1; > 0 is "
                   "antiferromagnetic)")
    p.add_argument("--jz", type=float, help="heisenberg: ZZ coupling (default --j; XXZ "
                   "anisotropy)")
    p.add_argument("--field", type=float, help="Hamiltonians: field, bz for heisenberg, "
                   "bx for ising (default 0)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace PATH if it holds a src_dask train or stack")
    p.set_defaults(func=generate, parser=p)


def _add_run(sub: Any, common: argparse.ArgumentParser) -> None:
    fmt = _FORMAT
    p = sub.add_parser(
        "run", parents=[common], formatter_class=fmt,
        help="compress the product of saved trains with SRC; write the result to Zarr",
        description=_wrap(
            "Compress the product TRAIN[0]·TRAIN[1]·… (leftmost first; a stack written by "
            "'generate stack' counts as its factors) to bond dimension --chi-out with "
            "src_dask.src, and write the result to --out with src_dask.save. The output "
            "appears only when the run has finished: a failed or interrupted run leaves "
            "nothing at --out. With --store, rerunning the same command resumes an "
            "interrupted run.",
            "Where it runs: --scheduler-file (a running cluster), --gpus (a local dask-cuda "
            "cluster, one worker per GPU), --workers (a local CPU cluster), else Dask's "
            "threaded scheduler in this process."))
    _add_problem_options(p, store="run store (Zarr) for environments and progress: bounded "
                         "memory, resumable")
    p.add_argument("--out", required=True, metavar="PATH", help="where to write the result")
    p.add_argument("--seed", type=_non_negative_int, metavar="N",
                   help="seed of the sketch (default: a fresh one, printed and recorded "
                   "with the output; with --store, the store's)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --out if it holds a src_dask train")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction,
                   help="a progress bar by pass and site on stderr (default: when stderr is "
                   "a terminal)")
    p.add_argument("--report", metavar="HTML",
                   help="write Dask's performance report of the run to this HTML file "
                   "(needs --workers, --gpus or --scheduler-file)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="log what the run does (problem, sketch, device) on stderr")
    p.add_argument("--overwrite-store", action="store_true",
                   help="replace a --store that holds a run of other inputs or options "
                   "(a store of the same run is resumed, not replaced)")
    p.add_argument("--check", action="store_true",
                   help="also print the result's relative error against the exact product "
                   "(src_dask.distance: streamed overlaps, about as dear as the run)")
    _add_cluster_options(p)
    p.set_defaults(func=run, parser=p)


def _add_distance(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "distance", parents=[common], formatter_class=_FORMAT,
        help="the relative error of a saved result against the product of saved trains",
        description=_wrap(
            "||RESULT - TRAIN[0]·TRAIN[1]·…|| / ||TRAIN[0]·TRAIN[1]·…||, exactly, by "
            "streamed overlaps (src_dask.distance), without forming the product; it "
            "resolves errors down to about 1e-7."))
    p.add_argument("result", metavar="RESULT", help="a saved train (e.g. run's --out)")
    p.add_argument("trains", nargs="+", metavar="TRAIN",
                   help="the factors as given to run, leftmost first")
    _add_cluster_options(p)
    p.set_defaults(func=distance, parser=p)


def _add_problem_options(p: argparse.ArgumentParser, store: str) -> None:
    """The trains and the options of ``src`` that ``run`` and ``plan`` share
    (``store``: the help of ``--store``)."""
    p.add_argument("trains", nargs="+", metavar="TRAIN",
                   help="saved trains (src_dask.save / 'src-dask generate'), leftmost first")
    p.add_argument("--chi-out", type=_positive_int, required=True, metavar="N",
                   help="bond dimension of the result")
    p.add_argument("--oversample", type=_oversample, default=0, metavar="N|auto",
                   help="extra sketch columns, or 'auto' = max(ceil(chi_out/2), 10); with "
                   "N > 0 the result is rounded exactly to chi_out (default 0)")
    p.add_argument("--cutoff", type=_cutoff, default=0.0, metavar="X",
                   help="relative singular-value threshold in [0, 1) (default 0)")
    p.add_argument("--dtype", choices=DTYPES,
                   help="working and output dtype (default: promoted from the inputs)")
    p.add_argument("--chunk", type=_positive_int, metavar="N",
                   help="sketch columns per block (default: one block per worker thread, "
                   "none over 256 MiB)")
    p.add_argument("--store", metavar="DIR", help=store)


def _add_plan(sub: Any, common: argparse.ArgumentParser) -> None:
    fmt = _FORMAT
    p = sub.add_parser(
        "plan", parents=[common], formatter_class=fmt,
        help="say what 'run' would need (memory per worker, disk, FLOPs, tasks); run nothing",
        description=_wrap(
            "The plan of 'src-dask run' with the same trains and options (src_dask.plan): "
            "sketch blocks, projected-core row blocks, the peak memory of each worker "
            "(host, and device on GPUs), the environments' bytes, the disk a --store "
            "needs, FLOPs per pass and the number of tasks. Nothing is computed; a "
            "problem that cannot fit the workers or the disk is refused (exit 1) with "
            "the numbers.",
            "The workers planned for: --scheduler-file (a running cluster), --gpus or "
            "--workers (a local cluster, started to ask its workers what they have), else "
            "Dask's threaded scheduler in this process."))
    _add_problem_options(p, store="plan a run with a run store there (its disk is checked)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    _add_cluster_options(p)
    p.set_defaults(func=plan, parser=p)


def _add_cluster_options(p: argparse.ArgumentParser) -> None:
    """Where ``run`` computes (a running cluster, local GPUs or CPU workers), how the
    local cluster is set up, and TLS."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--scheduler-file", metavar="FILE",
                       help="connect to the Dask cluster of this scheduler file")
    where.add_argument("--gpus", type=_positive_int, metavar="N",
                       help="start a local dask-cuda cluster on N GPUs (src_dask.cluster)")
    where.add_argument("--workers", type=_positive_int, metavar="N",
                       help="start a local CPU cluster of N worker processes")
    p.add_argument("--threads", type=_positive_int, metavar="N",
                   help="--workers: threads per worker (default 1)")
    p.add_argument("--protocol", choices=("ucx", "tcp"), default=None,
                   help="--gpus: how the GPUs talk (default: ucx on several GPUs when it is "
                   "installed, at NVLink speed, but it listens on every network interface "
                   "without authentication; tcp stays on --host, at about 1 GB/s)")
    p.add_argument("--memory-limit", metavar="BYTES",
                   help="--gpus/--workers: host memory per worker before spilling to disk "
                   "(default auto)")
    p.add_argument("--local-directory", metavar="DIR",
                   help="--gpus/--workers: under which folder workers spill to disk (in a "
                   "fresh subfolder only you can enter; default: the temporary directory)")
    p.add_argument("--host", default="127.0.0.1", metavar="ADDR",
                   help="--gpus/--workers: address the scheduler, workers and dashboard "
                   "listen on (default 127.0.0.1: this machine only; 0.0.0.0 opens them to "
                   "the network: add TLS)")
    tls = p.add_argument_group(
        "TLS", "Encrypt and authenticate the connections to the scheduler and between "
        "workers (--scheduler-file: the cluster's certificates; --gpus/--workers: the local "
        "cluster uses them). Give all three; without them, Dask config "
        "(distributed.comm.tls) decides.")
    tls.add_argument("--tls-ca-file", metavar="PEM", help="the certificate authority's "
                     "certificate")
    tls.add_argument("--tls-cert", metavar="PEM", help="this side's certificate (signed by "
                     "the CA)")
    tls.add_argument("--tls-key", metavar="PEM", help="its private key")


def _add_info(sub: Any, common: argparse.ArgumentParser) -> None:
    fmt = _FORMAT
    p = sub.add_parser("info", parents=[common], formatter_class=fmt,
                       help="describe a saved train, a stack or a run store",
                       description=_wrap(
                           "For a train: kind, sites, bond and physical dimensions, dtype "
                           "and size. For a stack: each factor. For a run store: the run's "
                           "options and inputs, its progress (pass 1 blocks done, pass 2 "
                           "next site), whether it is complete, and the bytes it plans to "
                           "use."))
    p.add_argument("path", metavar="PATH", help="a saved train, stack or run store")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=info, parser=p)


def _store_progress(store: str | None) -> tuple[bool, bool, str] | None:
    """Whether the run store at ``store`` is complete, whether its run has begun, and
    where it is ("pass 1, K of N blocks of sketch columns done" or "pass 2, at site S"),
    from ``storage.describe``; None without a store, or one with nothing to say."""
    from . import storage

    if store is None or not os.path.isdir(store):
        return None
    try:
        info = storage.describe(store)
    except Exception:  # noqa: BLE001 - set up only partly: nothing to report
        return None
    if info.get("what") != "run store":
        return None
    done, blocks = info["pass1_blocks_done"], info["pass1_blocks"]
    where = (f"pass 1, {done} of {blocks} blocks of sketch columns done" if done < blocks
             else f"pass 2, at site {info['pass2_next_site']}")
    return bool(info["complete"]), done > 0, where


def _where_it_stopped(store: str | None) -> str:
    """What an interrupted ``run --store`` keeps, and that the same command resumes it."""
    progress = _store_progress(store)
    if progress is None:
        return ""
    return f" in {progress[2]}; {store} keeps it: rerun the same command to resume"


def _how_it_began(before: tuple[bool, bool, str] | None, store: str) -> str | None:
    """The line ``run --store`` prints when the store held some of this run already
    (``before``: :func:`_store_progress` before the run, which then used it)."""
    if before is None or not (before[0] or before[1]):
        return None  # no store, or nothing done in it: a fresh start
    if before[0]:
        return f"{store} held this run, finished: its result, not recomputed"
    return f"resumed the run in {store} from {before[2]}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the subcommand's parser: its --help lists what it takes
        getattr(args, "parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
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
        _err(f"error: {_one_line(err)}")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
