"""`deepspeed.runtime.engine.DeepSpeedEngine` is zerolite's engine (isinstance checks in
Accelerate and Transformers then recognise it)."""
from zerolite.engine import ZeroEngine as DeepSpeedEngine

DeepSpeedOptimizerCallable = object
DeepSpeedSchedulerCallable = object

__all__ = ["DeepSpeedEngine"]
