"""The engine's gathers and reductions go through the device layer's side streams: every
gather and reduction result is waited for by compute on its "ready" event, and training is
unchanged (checked with the recording backend standing in for CUDA, NCCL-style eager)."""
import pytest
import torch

import zerolite
from zerolite.device import DeviceLayer
from zerolite.testing.fake_device import RecordingBackend
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine

from gpt_cases import batches, ds_config, tiny_gpt


def _train(rank, world, record, quantized):
    import zerolite.engine as engine_mod

    backend = RecordingBackend() if record else None
    if record:
        engine_mod.make_device_layer = lambda device: DeviceLayer(device, eager=True,
                                                                  backend=backend)
    extra = {"zero_quantized_gradients": True, "zero_quantized_weights": True} if quantized else {}
    cfg = ds_config(world)
    cfg["zero_optimization"].update(extra)
    model = tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, config=cfg)
    losses = train_engine(engine, batches(2), rank, world)
    if not record:
        return losses, None
    layer = engine.device_layer
    recorded_on = {e[2]: e[1] for e in backend.log if e[0] == "record"}
    compute_waits = [recorded_on[e[2]] for e in backend.log
                     if e[0] == "wait" and e[1] == "compute"]
    side_waits = [recorded_on[e[2]] for e in backend.log if e[0] == "wait" and e[1] != "compute"]
    return losses, (layer.gather.submitted, layer.reduce.submitted,
                    compute_waits.count("all_gather"), compute_waits.count("reduce"),
                    set(side_waits))


@pytest.mark.parametrize("quantized", [False, True], ids=["exact", "qgZ+qwZ"])
def test_every_side_result_is_waited_for(quantized):
    plain = run_ranks(_train, 2, False, quantized)
    recorded = run_ranks(_train, 2, True, quantized)
    for (losses, _), (rec_losses, counts) in zip(plain, recorded):
        assert losses == rec_losses  # the layer changes where work runs, not what it computes
        gathers, reduces, gather_waits, reduce_waits, side_waits = counts
        assert gathers > 0 and reduces > 0
        assert gather_waits == gathers and reduce_waits == reduces
        assert side_waits == {"compute"}  # side streams only ever wait for compute


@pytest.mark.parametrize("quantized", [False, True], ids=["exact", "qwz"])
def test_gatherer_is_built_on_the_layers_gather_communicator(quantized):
    """On NCCL the layer's gathers have a communicator of their own (device/__init__.py); the
    gatherer gets it when it is built, whichever gather the config asks for."""
    from zerolite.comm.build import build_param_gatherer
    from zerolite.config import load_config

    cfg = ds_config(2)
    cfg["zero_optimization"]["zero_quantized_weights"] = quantized
    layer = DeviceLayer(torch.device("cpu"))
    layer.gather.group = sentinel = object()
    streamed = build_param_gatherer(load_config(cfg, 2), layer)
    assert streamed.inner.group is sentinel
    assert build_param_gatherer(load_config(cfg, 2)).group is None
