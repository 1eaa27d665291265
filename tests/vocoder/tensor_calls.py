"""Counting the tensor calls Python code makes (each gives the GIL away and takes it back), for
the vocoder tests."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from torch.overrides import TorchFunctionMode

import chorus

_PACKAGE = str(Path(chorus.__file__).resolve().parent)


class TensorCalls(TorchFunctionMode):
    """While active, counts tensor calls (torch functions and tensor methods, indexing included)
    by name and by call site (the innermost ``chorus`` function on the stack). Attribute reads
    (``tensor.shape`` and the like: ``__get__``), which keep the GIL, are counted apart, and so
    are calls inside the functions :meth:`count_apart` wraps (``model``)."""

    def __init__(self):
        super().__init__()
        self.host, self.sites = Counter(), Counter()
        self.model = self.attribute_reads = self._depth = 0

    @classmethod
    def for_passes(cls, stage) -> "TensorCalls":
        """A counter for a vocoder stage's passes: the calls inside its two model calls
        (``PassGraphs.run_flow`` and ``run_hift``, a graph replay each on a GPU, eager here)
        counted apart as ``model``."""
        counter = cls()
        counter.count_apart(stage.graphs, "run_flow")
        counter.count_apart(stage.graphs, "run_hift")
        return counter

    @property
    def host_total(self) -> int:
        """The tensor calls counted by name (neither attribute reads nor model calls)."""
        return sum(self.host.values())

    @property
    def total(self) -> int:
        """Every call counted, of all three kinds."""
        return self.host_total + self.attribute_reads + self.model

    def clear(self) -> None:
        self.host.clear()
        self.sites.clear()
        self.model = self.attribute_reads = 0

    def count_apart(self, owner, name: str) -> None:
        """Count the calls made inside ``owner.name`` (replaced by a wrapper) as ``model``."""
        inner = getattr(owner, name)

        def wrapped(*args, **kwargs):
            self._depth += 1
            try:
                return inner(*args, **kwargs)
            finally:
                self._depth -= 1

        setattr(owner, name, wrapped)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if self._depth:
            self.model += 1
        elif name == "__get__":
            self.attribute_reads += 1
        else:
            self.host[name] += 1
            self.sites[_site(sys._getframe(1))] += 1
        return func(*args, **(kwargs or {}))


def _site(frame) -> str:
    """``file:function`` of the innermost frame in the chorus package."""
    while frame is not None and not frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
    return "?" if frame is None else f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"
