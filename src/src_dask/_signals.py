"""The old private name of :mod:`src_dask.interrupts`, kept for the modules that
import from it (``_cluster``); new code imports :mod:`src_dask.interrupts`."""

from .interrupts import (
    forget,
    local_client,
    quiet_logs,
    quiet_worker,
    sigint_deferred,
    sigint_quiets,
)

__all__ = ["forget", "local_client", "quiet_logs", "quiet_worker", "sigint_deferred",
           "sigint_quiets"]
