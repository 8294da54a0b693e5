"""The client a computation runs on: a running cluster's, by its scheduler file, or a
local cluster's, started for it (:func:`client`, its keywords from the command line's
where-to-run flags by :func:`client_options`, the line that says where it runs by
:func:`describe`); and TLS, a ``distributed.Security`` of three certificate files, for
either.

Dask reads certificate files only when it first connects, and then speaks of an
``ssl_context``; these check what they can before that, so that a missing file, a
missing scheduler file or a missing certificate is said in one line naming it (in the
words of the command line, whose ``--scheduler-file`` and ``--tls-*`` they serve).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["client", "client_options", "describe", "scheduler_client", "scheduler_tls_address",
           "security"]
#: The command line's TLS flags, for the three files of :func:`security` in order.
TLS_FLAGS = ("--tls-ca-file", "--tls-cert", "--tls-key")


def security(ca_file: str, cert: str, key: str, *,
             names: Sequence[str] = ("ca_file", "cert", "key")) -> Any:
    """A ``distributed.Security`` that requires TLS, with one certificate and key for
    the client, the scheduler and the workers, signed by the authority of
    ``ca_file``: one user's own cluster. Each file must exist: a
    ``FileNotFoundError`` names the first that does not, as ``names`` call the three
    (the command line passes its flags)."""
    for name, path in zip(names, (ca_file, cert, key), strict=True):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{name} {path}: no such file")
    from distributed import Security

    return Security(tls_ca_file=ca_file, tls_client_cert=cert, tls_client_key=key,
                    tls_scheduler_cert=cert, tls_scheduler_key=key, tls_worker_cert=cert,
                    tls_worker_key=key, require_encryption=True)


def scheduler_tls_address(scheduler_file: str | os.PathLike, security: Any = None) -> str | None:
    """The address in ``scheduler_file`` when that scheduler takes TLS connections only
    (``tls://``) and ``security`` (None: what Dask config says, ``distributed.comm.tls``)
    has no client certificate to connect with: a connection that cannot succeed. None
    otherwise, a file that cannot be read included (``distributed.Client`` says why)."""
    from distributed import Security

    try:
        with open(scheduler_file) as f:
            address = str(json.load(f).get("address", ""))
    except (OSError, ValueError, AttributeError):
        return None
    if _is_tls(address) and not (security or Security()).tls_client_cert:
        return address
    return None


def scheduler_client(scheduler_file: str | os.PathLike, security: Any = None) -> Any:
    """A ``distributed.Client`` on the cluster of ``scheduler_file`` (``security``:
    its TLS; None: Dask config's), checked first: a ``FileNotFoundError`` where there
    is no such file, a ``ValueError`` where the scheduler takes TLS only and there is
    no client certificate to connect with (:func:`scheduler_tls_address`)."""
    from distributed import Client

    if not os.path.isfile(scheduler_file):
        raise FileNotFoundError(f"{os.fspath(scheduler_file)}: no such scheduler file")
    address = scheduler_tls_address(scheduler_file, security)
    if address is not None:
        raise ValueError(f"{os.fspath(scheduler_file)}: the scheduler at {address} takes TLS "
                         "connections only; pass --tls-ca-file, --tls-cert and --tls-key (or "
                         "set distributed.comm.tls in Dask config)")
    return Client(scheduler_file=os.fspath(scheduler_file), security=security)


def describe(client: Any) -> str:
    """A line on ``client`` (of :func:`client`) for the one who started it: a running
    cluster's address, its number of workers and its dashboard; a local cluster's
    dashboard."""
    if client.cluster is not None:
        return f"dashboard: {client.dashboard_link}"
    from ._cluster import workers_info

    n_workers = len(workers_info(client))
    return (f"connected to {client.scheduler.address} ({n_workers} workers); dashboard: "
            f"{client.dashboard_link}")


@contextlib.contextmanager
def client(scheduler_file: str | os.PathLike | None = None, *, security: Any = None,
           **cluster_options: Any) -> Iterator[Any]:
    """A ``distributed.Client`` for the block: on the running cluster of
    ``scheduler_file`` (:func:`scheduler_client`); else, given ``cluster_options``, on
    ``src_dask.cluster(security=security, **cluster_options)``, started for the block
    and closed after it, a Ctrl-C included (:func:`src_dask.interrupts.local_client`),
    its dashboard on a free port of its ``host`` unless ``dashboard_address`` is given
    (None would take port 8787 all the same); else None: Dask's threaded scheduler in
    this process."""
    if scheduler_file is not None:
        with scheduler_client(scheduler_file, security) as connected:
            yield connected
    elif cluster_options:
        from distributed.comm.addressing import unparse_host_port

        import src_dask

        from ._cluster import LOOPBACK
        from .interrupts import local_client

        host = cluster_options.setdefault("host", LOOPBACK)
        cluster_options.setdefault("dashboard_address", unparse_host_port(host, 0))
        with local_client(lambda: src_dask.cluster(security=security, **cluster_options)) as c:
            yield c
    else:
        yield None


def client_options(scheduler_file: str | os.PathLike | None = None, *,
                   workers: int | None = None, gpus: int | None = None,
                   threads: int | None = None, memory_limit: str | int | None = None,
                   local_directory: str | None = None, protocol: str | None = None,
                   host: str | None = None,
                   tls: Sequence[str | None] = (None, None, None)) -> dict[str, Any]:
    """The keywords of :func:`client` for where a command runs, from the command line's
    where-to-run flags (``client(**client_options(...))``): the cluster of
    ``scheduler_file``; or a local cluster, on ``host``, of ``workers`` CPU processes
    with ``threads`` threads each (default 1) or of ``gpus`` GPUs that talk by
    ``protocol``, each worker with ``memory_limit`` (default ``"auto"``) and spilling
    under ``local_directory``; or neither (Dask's threaded scheduler). ``tls``: the
    files of :func:`security` (CA certificate, certificate, key), all three or none.

    Flags that do not go together, or that would be ignored, raise a ``ValueError``
    naming them as the command line does (its usage errors), before anything is
    started; a missing certificate file, a ``FileNotFoundError``."""
    local = workers is not None or gpus is not None
    if sum(x is not None for x in (scheduler_file, workers, gpus)) > 1:
        raise ValueError("--scheduler-file FILE, --workers N and --gpus N: one at most")
    for flag, value in (("--threads", threads), ("--memory-limit", memory_limit),
                        ("--local-directory", local_directory)):
        if value is not None and not local:
            raise ValueError(f"{flag}: sets up the local cluster of --workers N or --gpus N; "
                             "add one of them (a --scheduler-file cluster has its own)")
    if threads is not None and gpus is not None:
        raise ValueError("--threads: is for --workers N (a GPU worker runs one thread)")
    if any(tls) and not all(tls):
        raise ValueError("--tls-ca-file, --tls-cert and --tls-key go together (missing "
                         f"{', '.join(k for k, v in zip(TLS_FLAGS, tls, strict=True) if not v)})")
    if any(tls) and not (scheduler_file or local):
        raise ValueError("--tls-*: TLS is for a cluster; add --scheduler-file FILE, "
                         "--workers N or --gpus N")
    tls_security = security(*tls, names=TLS_FLAGS) if all(tls) else None  # type: ignore[arg-type]
    if protocol is not None and gpus is None:
        raise ValueError("--protocol: chooses how the GPUs of --gpus N talk; add --gpus N")
    if not local:
        return {"scheduler_file": scheduler_file, "security": tls_security}
    where = {"gpus": gpus, "protocol": protocol} if gpus is not None else \
        {"gpus": 0, "n_workers": workers, "threads_per_worker": 1 if threads is None else threads}
    return {"security": tls_security, **({} if host is None else {"host": host}),
            "memory_limit": "auto" if memory_limit is None else memory_limit,
            "local_directory": local_directory, **where}


def _is_tls(address: str) -> bool:
    """Whether ``address`` is a TLS one (distributed's ``parse_address``)."""
    from distributed.comm.addressing import parse_address

    try:
        return parse_address(address, strict=True)[0] == "tls"
    except ValueError:  # no scheme: not TLS
        return False
