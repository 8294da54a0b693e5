"""src_dask: compressed products of tensor trains by successive randomized
compression (SRC), run as a Dask task graph.

>>> import src_dask
>>> y = src_dask.apply(mpo, mps, chi_out=64)           # doctest: +SKIP
>>> y = src_dask.src(A, B, C, psi, chi_out=128, oversample="auto")  # doctest: +SKIP
>>> H = src_dask.problems.heisenberg(50)              # reference problems  # doctest: +SKIP
"""

import logging

from . import problems
from ._api import apply, compress, plan, src
from ._cluster import cluster, cluster_options
from ._estimate import RunPlan
from ._overlap import distance
from .storage import open, open_stack, save, save_stack
from .trains import TensorTrain

__all__ = ["RunPlan", "TensorTrain", "apply", "cluster", "cluster_options", "compress",
           "distance", "open", "open_stack", "plan", "problems", "save", "save_stack", "src"]
__version__ = "0.1.0"

logging.getLogger("src_dask").addHandler(logging.NullHandler())
