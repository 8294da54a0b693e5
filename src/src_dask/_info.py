"""What a path holds — a saved train, a stack of them, a run store — as plain data
that prints as text (``src-dask info``; ``--json`` prints the data itself)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any


class Info(dict):
    """A description (``what``: "train", "stack" or "run store"): a dict of JSON
    values whose ``str()`` is the text ``src-dask info`` prints."""

    def __str__(self) -> str:
        path = self["path"]
        if self["what"] == "train":
            return "\n".join([f"{path}: src_dask train", *_train_lines(self)])
        if self["what"] == "stack":
            names = list(self["factors"])
            lines = [f"{path}: src_dask stack {'·'.join(names)} ('src-dask run' takes it as "
                     f"{len(names)} factors, in this order)"]
            if self.get("generated"):
                lines.append("  generated   " + _pairs(self["generated"]))
            for name, part in self["factors"].items():
                lines += [f"  {name}:", *_train_lines(part, indent="    ")]
            return "\n".join(lines)
        return "\n".join([f"{path}: src_dask run store", *_run_lines(self)])

    def summary(self) -> str:
        """One line on a train or a stack (what ``src-dask generate`` and ``run`` print
        after "wrote"): kind (and the product that made it), path, sites, bonds, dtype,
        bytes."""
        from dask.utils import format_bytes

        if self["what"] == "stack":
            parts = list(self["factors"].values())
            return (f"stack {'·'.join(self['factors'])} to {self['path']}: "
                    f"{parts[0]['sites']} sites, {parts[0]['dtype']}, "
                    f"{format_bytes(sum(p['bytes'] for p in parts))}")
        if self["what"] != "train":
            return f"run store {self['path']}"
        product = (self.get("made_by") or {}).get("product")
        return (f"{self['kind']}{f' ({product})' if product else ''} to {self['path']}: "
                f"{self['sites']} sites, max bond {max(self['bond_dims'])}, {self['dtype']}, "
                f"{format_bytes(self['bytes'])}")


def stack(path: str, factors: dict[str, dict[str, Any]], attrs: dict[str, Any]) -> Info:
    """The description of a stack from its factors' (``storage.describe`` of each; the
    stack's own ``generated`` is said once, not with every factor)."""
    for part in factors.values():
        part.pop("generated", None)
    info = Info(path=os.fspath(path), what="stack", factors=factors)
    if attrs.get("generated"):
        info["generated"] = attrs["generated"]
    return info


def nbytes(n: int) -> str:
    """``1.50 MiB (1572864 bytes)``."""
    from dask.utils import format_bytes

    return f"{format_bytes(n)} ({n} bytes)"


def _pairs(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items() if v is not None)


def _ints(values: Sequence[Any], head: int = 6) -> str:
    """A long list of bonds or legs, shortened in the middle."""
    items = [str(v) for v in values]
    if len(items) > 2 * head + 1:
        items = [*items[:head], "…", *items[-head:]]
    return " ".join(items)


def _phys_text(phys: Sequence[Sequence[int]]) -> str:
    def one(p: Sequence[int]) -> str:
        return "×".join(str(x) for x in p)

    shapes = [tuple(p) for p in phys]
    if len(set(shapes)) == 1:
        return f"{one(shapes[0])} at every site"
    return _ints([one(p) for p in shapes])


def _train_lines(info: dict[str, Any], indent: str = "  ") -> list[str]:
    lines = [f"{indent}kind        {info['kind'].upper()}",
             f"{indent}sites       {info['sites']}",
             f"{indent}bond dims   {_ints(info['bond_dims'])}  (max {max(info['bond_dims'])})",
             f"{indent}phys dims   {_phys_text(info['phys_dims'])}",
             f"{indent}dtype       {info['dtype']}",
             f"{indent}bytes       {nbytes(info['bytes'])}"]
    for key, label in (("generated", "generated"), ("made_by", "made by")):
        if key in info:
            lines.append(f"{indent}{label:<11} {_pairs(info[key])}")
    return lines


def _run_lines(info: dict[str, Any]) -> list[str]:
    n = info["sites"]
    status = "complete" if info["complete"] else "not complete (running, or interrupted: " \
        "run the same command again to resume)"
    lines = [f"  status      {status}",
             f"  options     {', '.join(f'{k}={v}' for k, v in info['options'].items())}",
             f"  sketch      {info['sketch']} columns in blocks of {info['chunk']}, "
             f"seed {info['seed']}",
             f"  sites       {n}"]
    for i, item in enumerate(info["inputs"]):
        bra = ", transposed (bra)" if item["transposed"] else ""
        lines.append(f"  input {i:<5} {item['kind'].upper()}, bond dims "
                     f"{_ints(item['bond_dims'], 3)}, phys "
                     f"{_phys_text(item['phys_dims'])}{bra}")
    done, blocks = info["pass1_blocks_done"], info["pass1_blocks"]
    lines.append(f"  pass 1      {done} of {blocks} blocks of sketch columns done")
    nxt = info["pass2_next_site"]
    if nxt <= 0:
        lines.append(f"  pass 2      done ({n - 1} of {n - 1} sites)")
    else:
        lines.append(f"  pass 2      next site {nxt} ({n - 1 - nxt} of {n - 1} sites done)")
    lines.append(f"  planned     {nbytes(info['bytes_planned'] or 0)} on disk")
    if "result" in info:
        r = info["result"]
        lines.append(f"  result      {r['kind'].upper()}, bond dims {_ints(r['bond_dims'])}, "
                     f"{r['dtype']}, {nbytes(r['bytes'])}")
    return lines
