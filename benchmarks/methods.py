"""The compression methods the benchmarks time, as no-argument functions: quimb's
(``src``, ``src-oversample``, ``zipup`` on MPO·MPS; ``src`` on a whole stack) and
src_dask's (plain and ``oversample="auto"``), on the same inputs and device."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from device import Device
from flops import plan_flops
from memory import PeakMemory
from problems import tiny_stack
from timing import best_of

#: The MPO·MPS methods, in the order they run: quimb's src first (ratios refer to it),
#: compared pairs back to back (quimb src then ours, then both oversampled), zipup last,
#: so that a ratio compares two runs made under the same conditions (an earlier order
#: ran ours after ~80 s of quimb's zipup and oversampled SVDs).
MPO_MPS_METHODS = ("quimb_src", "src_dask", "quimb_src_oversample", "src_dask_oversample",
                   "quimb_zipup")
QUIMB_METHOD = {"quimb_src": "src", "quimb_src_oversample": "src-oversample",
                "quimb_zipup": "zipup"}


def method_flops(method: str, A, psi, chi: int) -> dict[str, Any] | None:
    """FLOPs of a method's SRC step on ``A psi`` (:func:`flops.plan_flops`, with the
    method's sketch width; the rounding sweep of oversampled runs not in ``total``);
    None for zipup, whose FLOPs are not counted."""
    if method == "quimb_zipup":
        return None
    if method == "quimb_src_oversample":  # quimb's default max_bond_oversample
        return plan_flops(A, psi, chi_out=max(round(1.5 * chi), chi + 10))
    return plan_flops(A, psi, chi_out=chi,
                      oversample="auto" if method == "src_dask_oversample" else 0)


def mpo_mps_runner(method: str, A, psi, chi: int, device: Device, seed: int,
                   client=None) -> Callable[[], Any]:
    """A no-argument function computing ``A psi`` compressed to ``chi`` by ``method``
    (src_dask on ``device``, through ``client`` when given)."""
    if method in QUIMB_METHOD:
        options = {"seed": seed} if method != "quimb_zipup" else {}
        return lambda: psi.gate_with_mpo(A, method=QUIMB_METHOD[method], max_bond=chi,
                                         **options)
    import dask

    import src_dask

    oversample = "auto" if method == "src_dask_oversample" else 0

    def run():
        with dask.config.set({"src_dask.device": device.name}):
            return src_dask.apply(A, psi, chi_out=chi, seed=seed, oversample=oversample,
                                  client=client)

    return run


# -- quimb on the whole stack ---------------------------------------------------------
def quimb_stack(trains, device: Device):
    """N V M U as one quimb network (four MPO layers) with its arrays on ``device``."""
    import quimb.tensor as qtn

    layers = [device.to_device(t.to_quimb()) for t in trains]
    stack = layers[-1]
    for layer in reversed(layers[:-1]):  # N (V (M U))
        stack = qtn.tensor_network_apply_op_op(layer, stack)
    return stack


def quimb_stack_fits(inputs: int, envs: int, device: Device,
                     host_memory: int) -> tuple[bool, str]:
    """Whether quimb's run (``inputs`` and all sketch environments, ``envs`` bytes, in
    memory) fits."""
    need = inputs + envs
    if device.is_gpu:
        have, where = 0.7 * device.describe()["memory_bytes"], "70% of device memory"
    else:
        have, where = 0.5 * host_memory, "half the host memory"
    return need <= have, f"needs {need / 1e9:.1f} GB; {where} is {have / 1e9:.1f} GB"


def run_quimb_stack(trains, chi_out: int, phys: int, seed: int, repeats: int,
                    device: Device) -> dict[str, Any]:
    """quimb's SRC on the whole stack, in this process: a tiny warm-up, then
    ``repeats`` timed runs with their peak memory."""
    import quimb.tensor as qtn

    def compress(stack, chi):
        return qtn.tensor_network_1d_compress(stack, max_bond=chi, method="src", seed=seed)

    compress(quimb_stack(tiny_stack(phys), device), 4)
    stack = quimb_stack(trains, device)
    device.free_pool()
    with PeakMemory(device) as memory:
        timing, _ = best_of(lambda: compress(stack, chi_out), repeats, sync=device.sync,
                            warmup=False)
    stack = None
    device.free_pool()
    return {**timing, "memory": memory.result(), "spilled_bytes": 0,
            "spill_note": "quimb in this process: nothing spills"}
