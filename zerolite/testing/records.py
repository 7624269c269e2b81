"""Compare what a program observed under DeepSpeed with what it observed under zerolite.

A record is the JSON a client script writes (numbers, strings, lists, dicts). `differences`
walks two records and lists every place they disagree: numbers within a relative tolerance,
everything else exactly. `Explanations` holds the places where zerolite differs on purpose,
each with its reason, as fnmatch patterns over paths like `scenario.steps[*].grad_norm`
(`[*]` stands for any list index); an explanation nothing matched is stale and is reported, so
the list stays the truth.
"""
from __future__ import annotations

import fnmatch
import math
import re
from typing import Callable

FP32 = (1e-5, 1e-6)
"""Relative and absolute tolerance of fp32 numbers (the largest gap seen is about 2e-7)."""
BF16 = (2e-2, 5e-2)
"""bf16 values: the engines may round at different points in the last bit of 8."""


def fp32_unless_bf16(path: str) -> tuple[float, float]:
    """BF16 where the path names bf16 (bf16 training or bf16 gradient communication), FP32
    elsewhere."""
    return BF16 if "bf16" in path else FP32


def differences(want, got, path: str = "", out: list | None = None,
                tolerance: Callable[[str], tuple[float, float]] = fp32_unless_bf16
                ) -> list[tuple[str, str]]:
    """Every place `got` (zerolite's record) differs from `want` (DeepSpeed's), as
    (path, what) pairs appended to `out` (returned). Where both records hold an "error" the
    program was refused in both; the messages are each engine's own."""
    out = [] if out is None else out
    if isinstance(want, dict) and isinstance(got, dict):
        if "error" in want and "error" in got:
            return out
        for k in sorted(set(want) | set(got)):
            sub = f"{path}.{k}" if path else k
            if k not in got:
                out.append((sub, f"only under DeepSpeed: {str(want[k])[:160]}"))
            elif k not in want:
                out.append((sub, f"only under zerolite: {str(got[k])[:160]}"))
            else:
                differences(want[k], got[k], sub, out, tolerance)
    elif isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            out.append((path, f"{len(want)} items under DeepSpeed, {len(got)} under zerolite: "
                              f"{str(want)[:160]} vs {str(got)[:160]}"))
            return out
        for i, (a, b) in enumerate(zip(want, got)):
            differences(a, b, f"{path}[{i}]", out, tolerance)
    elif (isinstance(want, float) or isinstance(got, float)) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in (want, got)):
        rel, abs_ = tolerance(path)
        both_nan = math.isnan(want) and math.isnan(got)  # a NaN recorded on both sides agrees
        if not both_nan and not math.isclose(want, got, rel_tol=rel, abs_tol=abs_):
            out.append((path, f"{want!r} under DeepSpeed, {got!r} under zerolite"))
    elif type(want) is not type(got) or want != got:
        out.append((path, f"{want!r} under DeepSpeed, {got!r} under zerolite"))
    return out


class Explanations:
    """Path pattern -> why zerolite differs there (see the module docstring)."""

    def __init__(self, table: dict[str, str]):
        self.table = table

    def reason(self, path: str) -> str | None:
        """The pattern that explains `path`, or None."""
        general = re.sub(r"\[\d+\]", "[*]", path)  # a.steps[3].b -> a.steps[*].b
        for pattern in self.table:
            if fnmatch.fnmatchcase(general, pattern.replace("[*]", "[[]*[]]")):
                return pattern
        return None

    def split(self, found: list[tuple[str, str]]) -> tuple[list[str], set[str]]:
        """(the differences no pattern explains, as text; the patterns that explained one)."""
        unexplained, used = [], set()
        for path, what in found:
            pattern = self.reason(path)
            if pattern is None:
                unexplained.append(f"{path}: {what}")
            else:
                used.add(pattern)
        return unexplained, used
