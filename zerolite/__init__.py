"""zerolite: a small, readable ZeRO-3 engine with DeepSpeed's interface.

    import zerolite as deepspeed
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, config="ds.json",
                                                           model_parameters=model.parameters())
"""
from zerolite import checkpointing, zero
from zerolite.comm.process_group import init_distributed
from zerolite.config import add_config_arguments
from zerolite.engine import ZeroEngine
from zerolite.errors import ZeroliteConfigError, ZeroliteError, ZeroliteStateError
from zerolite.initialize import initialize
from zerolite.version import __version__

__all__ = ["initialize", "zero", "checkpointing", "init_distributed", "add_config_arguments", "ZeroEngine",
           "ZeroliteError", "ZeroliteConfigError", "ZeroliteStateError", "__version__"]
