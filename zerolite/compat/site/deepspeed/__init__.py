"""`deepspeed` in processes started as DeepSpeed by zerolite.

The modules live in `zerolite/compat/deepspeed/`. Importing this package makes `deepspeed` and
every `deepspeed.X` the very module objects `zerolite.compat.deepspeed[.X]` (one copy of each,
so `deepspeed.comm is zerolite.compat.deepspeed.comm`)."""
import importlib
import importlib.abc
import importlib.util
import sys

_PREFIX, _TARGET = "deepspeed", "zerolite.compat.deepspeed"


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):
        pass  # already executed under its zerolite name

    def get_code(self, fullname):
        # `python -m deepspeed.launcher.runner`: runpy runs the target's code as __main__.
        return importlib.util.find_spec(self.target).loader.get_code(self.target)


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_PREFIX + "."):
            return None
        real = _TARGET + fullname[len(_PREFIX):]
        if importlib.util.find_spec(real) is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(real))


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())
sys.modules[__name__] = importlib.import_module(_TARGET)
