"""src_dask: compressed products of tensor trains by successive randomized
compression (SRC), run as a Dask task graph.

>>> import src_dask
>>> y = src_dask.apply(mpo, mps, chi_out=64)           # doctest: +SKIP
>>> y = src_dask.src(A, B, C, psi, chi_out=128, oversample="auto")  # doctest: +SKIP
>>> H = src_dask.problems.heisenberg(50)              # reference problems  # doctest: +SKIP

The names are imported on first use (the command line's ``--help`` then needs
neither Dask's arrays nor NumPy).
"""

import importlib
import logging
from typing import Any

# Dask's defaults of the src_dask.* keys, at once: loaded later, inside a caller's
# ``dask.config.set`` block, they would vanish with it when the block ends.
from . import config  # noqa: F401

#: Each public name and the module that defines it.
_WHERE = {"RunPlan": "._estimate", "TensorTrain": ".trains", "apply": "._api",
          "cluster": "._cluster", "cluster_options": "._cluster", "compress": "._api",
          "distance": "._overlap", "open": ".storage", "open_stack": ".storage",
          "plan": "._api", "problems": ".problems", "save": ".storage",
          "save_stack": ".storage", "src": "._api"}

__all__ = sorted(_WHERE)
__version__ = "0.1.0"

logging.getLogger("src_dask").addHandler(logging.NullHandler())


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'src_dask' has no attribute {name!r}")
    module = importlib.import_module(_WHERE[name], __name__)
    value = module if name == "problems" else getattr(module, name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
