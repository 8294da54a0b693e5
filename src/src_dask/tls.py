"""TLS for the clusters a client connects to or starts: a ``distributed.Security``
of three certificate files, and whether a scheduler takes TLS only.

Dask reads certificate files only when it first connects, and then speaks of an
``ssl_context``; these check what they can before that, so that a missing file or a
missing certificate is said in one line naming it (the command line's ``--tls-*``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

__all__ = ["scheduler_tls_address", "security"]


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
    if address.startswith("tls://") and not (security or Security()).tls_client_cert:
        return address
    return None
