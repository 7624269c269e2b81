"""`deepspeed.runtime.base_optimizer`: DeepSpeed's base classes of its optimizers, which
programs use to recognise an engine's optimizer (Lightning Fabric's load_checkpoint checks
`isinstance(x, (Optimizer, DeepSpeedOptimizer))`). Both are zerolite's ZeroOptimizer, the
class of `engine.optimizer` (zerolite/optim/zero_optimizer.py)."""
from zerolite.optim.zero_optimizer import ZeroOptimizer

DeepSpeedOptimizer = ZeroOptimizer
ZeROOptimizer = ZeroOptimizer

__all__ = ["DeepSpeedOptimizer", "ZeROOptimizer"]
