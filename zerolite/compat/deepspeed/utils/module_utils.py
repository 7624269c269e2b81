"""`deepspeed.utils.module_utils`: dotted-path attribute helpers and RepeatingLoader."""
from __future__ import annotations


def recursive_getattr(model, module_name: str):
    """`model.a.b.c` for `module_name` "a.b.c"."""
    obj = model
    for part in module_name.split("."):
        obj = getattr(obj, part)
    return obj


def recursive_setattr(model, module_name: str, module) -> None:
    """Set `model.a.b.c = module` for `module_name` "a.b.c"."""
    parent, _, leaf = module_name.rpartition(".")
    setattr(recursive_getattr(model, parent) if parent else model, leaf, module)


class RepeatingLoader:
    """Iterate `loader` forever, starting it again each time it runs out (DeepSpeed's
    deepspeed.utils.RepeatingLoader, for pipeline-style `engine.train_batch` loops)."""

    def __init__(self, loader):
        self.loader = loader
        self.data_iter = iter(self.loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)
