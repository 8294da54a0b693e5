"""Task keys of the sweep graph, named and parsed in this one place.

A step's key name is ``<step>_site<j>-<token>`` (``token``: one per run), so
Dask's dashboard groups the tasks by step and site and shows where a run is (the
prefixes stay within the 15 characters its progress panel prints whole, up to
site 9999). Tuple keys carry more parts after the name (a block, a part of the
step). The steps:

``load_site<j>``
    read, pad and cast the input cores of site ``j`` (one task per factor;
    lazy inputs once per pass, on several GPUs once per worker);
``pass1_site<j>``
    the sketch chain ``C_j → C_{j+1}``, one task per block of sketch columns;
``pass2_site<j>``
    the sketch of site ``j`` against ``C_j``, its QR, the update of ``S`` and the
    projected core of the next site (parts: ``project``, ``sketch``, ``qr``,
    ``core``, ``update``, ``env``, ``fetch``, ``resume``);
``round_site<j>``
    the exact rounding sweep of oversampled runs;
``result_site<j>``
    the output core in quimb's layout.

Keys that are not steps: ``src_result-<token>`` (the list of output cores),
``src_read-…`` (a stored core read whole), ``src_input-…`` (an in-memory
core shared by several workers' loads) and ``src_after-<token>`` (the signal that
a task has run, for tasks that only wait for it).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

#: The steps, in the order the sweep runs them.
STEPS = ("load", "pass1", "pass2", "round", "result")
RESULT = "src_result"
DISCARDED = "src_discarded"
_STEP = re.compile(r"(load|pass1|pass2|round|result)_site(\d+)")


def new_token() -> str:
    """A fresh run token."""
    return uuid.uuid4().hex


def name(step: str, site: int, token: str) -> str:
    """The key name of ``step`` at ``site`` in run ``token``."""
    return f"{step}_site{site}-{token}"


def result(token: str) -> str:
    """The key of the list of output cores."""
    return f"{RESULT}-{token}"


def discarded(token: str) -> str:
    """The key of the list of weights the rounding sweep discards, one per bond."""
    return f"{DISCARDED}-{token}"


def read() -> tuple[str]:
    """A fresh key for reading a stored core."""
    return ("src_read-" + uuid.uuid4().hex,)


def after(key: tuple, token: str) -> tuple:
    """The key of the signal that task ``key`` of run ``token`` has run."""
    return (f"src_after-{token}", *key)


def shared_input() -> tuple[str]:
    """A fresh key for an in-memory core several workers use."""
    return ("src_input-" + uuid.uuid4().hex,)


def token_of(final_key: Any) -> str:
    """The run token of a graph, from its final key (:func:`result`)."""
    return str(final_key).rsplit("-", 1)[1]


def is_of_run(key: Any, token: str) -> bool:
    """Whether ``key`` belongs to run ``token``."""
    head = key[0] if isinstance(key, tuple) else key
    return isinstance(head, str) and head.endswith("-" + token)


def step_of(prefix: str) -> tuple[str, int] | None:
    """``(step, site)`` of a key prefix (``dask.utils.key_split(key)``, e.g.
    ``"pass2_site7"``); None for a key that is not a step."""
    m = _STEP.fullmatch(prefix)
    return None if m is None else (m[1], int(m[2]))
