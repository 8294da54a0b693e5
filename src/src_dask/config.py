"""src_dask's settings: Dask config keys under ``src_dask``, with defaults in
``src_dask.yaml`` beside this module (loaded into Dask's defaults on import, so
``dask.config.get("src_dask")`` shows them all).

=========================  =======================================================
key                        meaning
=========================  =======================================================
``device``                 ``auto``, ``cpu`` or ``gpu``: where the kernels run
``keep-inputs``            ``auto``, ``true`` or ``false``: lazy inputs kept for pass 2
``keep-inputs-fraction``   ``auto`` keeps them up to this share of a worker's memory
``direct-reads``           whole stored arrays read from their chunk files
``memory-fraction``        share of a worker's free memory its tasks may use at once
``device-headroom``        share of a GPU's memory no budget counts on
``memory-limit``           bytes that override a worker's free memory (or ``auto``)
``shared-memory``          a one-task run's data to a worker of this host through ``/dev/shm``
``block-size``             largest environment block a default ``chunk`` aims for
``projection-block-size``  largest projected core made in one piece
``copy-inputs``            ``auto``, ``true`` or ``false``: inputs copied between GPUs
``pass2-split``            ``auto``, ``true`` or ``false``: pass 2 split by rows of ``Z``
``ucx-sync``               ``stream`` or ``device``: what Dask's UCX comm waits for
``complex-products``       ``auto``, ``3m`` or ``native``: complex products from real ones
=========================  =======================================================
"""

from __future__ import annotations

import os
from typing import Any

import dask
import dask.utils
import yaml

_FILE = os.path.join(os.path.dirname(__file__), "src_dask.yaml")

with open(_FILE, encoding="utf-8") as _f:
    defaults = yaml.safe_load(_f)

dask.config.update_defaults(defaults)


def get(key: str) -> Any:
    """The setting ``src_dask.<key>``."""
    return dask.config.get(f"src_dask.{key}")


def get_bytes(key: str) -> int:
    """A size setting (``"256 MiB"`` or a number of bytes) in bytes."""
    return int(dask.utils.parse_bytes(get(key)))


def get_choice(key: str, choices: tuple[Any, ...]) -> Any:
    """A setting that must be one of ``choices``; anything else is a ValueError
    naming the key."""
    value = get(key)
    if value not in choices:
        names = ", ".join(str(c) for c in choices[:-1]) + f" or {choices[-1]}"
        raise ValueError(f"dask config src_dask.{key}: expected {names}, got {value!r}")
    return value
