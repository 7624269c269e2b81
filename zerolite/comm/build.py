"""Pick the gradient reducer and parameter gatherer a config asks for."""
from __future__ import annotations

from zerolite.comm.quantized import QuantizedGradReducer, QuantizedParamGatherer
from zerolite.comm.reducers import GradReducer, ParamGatherer
from zerolite.comm.sparse import SparseGradReducer
from zerolite.comm.streamed import StreamedGatherer, StreamedReducer


def build_grad_reducer(config, world_size: int, layer=None, wire=None):
    """Exact reducer (optionally 16-bit on the wire), or ZeRO++ qgZ when
    `zero_optimization.zero_quantized_gradients` is on (bits, block size and error feedback
    from the top-level `zerolite` block), or top-k sparsified gradients when
    `zerolite.sparse_gradients` is set (the config refuses it together with qgZ). Note: quantized gradients take precedence over
    `communication_data_type` and `prescale_gradients`; they send codes, not 16-bit values.
    With a device layer, the reducer's work runs on its reduce stream (comm/streamed.py).
    `wire`: the WireCounter its bytes go to (comm/wire_count.py; one of its own if None)."""
    reducer = _grad_reducer(config, world_size, wire)
    return reducer if layer is None else StreamedReducer(reducer, layer)


def _grad_reducer(config, world_size: int, wire) -> GradReducer:
    if config.zero_optimization.zero_quantized_gradients:
        extras = config.zerolite
        return QuantizedGradReducer(world_size, bits=extras.quantized_gradients_bits,
                                    block_size=extras.quantized_block_size,
                                    error_feedback=extras.quantized_error_feedback, wire=wire)
    comm_dtype = config.communication_torch_dtype
    predivide = config.gradient_predivide_factor if config.prescale_gradients else 1.0
    sparse = config.zerolite.sparse_gradients
    if sparse is not None:
        # Note: values go as fp32 (8 bytes per entry with the index); communication_data_type
        # applies to the dense warmup steps only.
        per_step = (1 if config.zerolite.reduce_once_per_step
                    else config.gradient_accumulation_steps)
        return SparseGradReducer(world_size, ratio=sparse.ratio,
                                 error_feedback=sparse.error_feedback,
                                 warmup_reduces=sparse.warmup_steps * per_step,
                                 predivide=predivide, wire=wire)
    return GradReducer(world_size, comm_dtype=comm_dtype, predivide=predivide, wire=wire)


def build_param_gatherer(config, layer=None, wire=None, secondary=None):
    """Exact all-gather, or ZeRO++ qwZ (int8 blocks) when
    `zero_optimization.zero_quantized_weights` is on; with a device layer, on its all-gather
    stream and communicator. `secondary`: this rank's hpZ group (comm/topology.py), over
    which flats holding a secondary shard are gathered, exactly in both cases."""
    group = None if layer is None else layer.gather.group
    if config.zero_optimization.zero_quantized_weights:
        gatherer = QuantizedParamGatherer(bits=8, block_size=config.zerolite.quantized_block_size,
                                          wire=wire, secondary=secondary, group=group)
    else:
        gatherer = ParamGatherer(wire=wire, secondary=secondary, group=group)
    return gatherer if layer is None else StreamedGatherer(gatherer, layer)
