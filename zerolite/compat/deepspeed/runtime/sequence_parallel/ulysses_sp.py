"""`deepspeed.runtime.sequence_parallel.ulysses_sp`: the names Accelerate imports for
`sp_backend="deepspeed"`; using them raises (zerolite has data parallelism only)."""
from zerolite.compat.deepspeed._refused import refused_class

UlyssesSPAttentionHF = refused_class(
    "deepspeed.runtime.sequence_parallel.ulysses_sp.UlyssesSPAttentionHF",
    "Ulysses sequence parallelism")
UlyssesSPDataLoaderAdapter = refused_class(
    "deepspeed.runtime.sequence_parallel.ulysses_sp.UlyssesSPDataLoaderAdapter",
    "Ulysses sequence parallelism")


def _register_refused(*_args, **_kwargs):
    UlyssesSPAttentionHF()


UlyssesSPAttentionHF.register_with_transformers = staticmethod(_register_refused)
