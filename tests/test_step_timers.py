"""StepStats timers come from the device layer (CUDA events on GPU, host clock on CPU)."""
import zerolite
from zerolite.device import DeviceLayer
from zerolite.testing.fake_device import FakeWork, RecordingBackend
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine
from zerolite.zero.step_stats import StatsRecorder

from gpt_cases import batches, ds_config, tiny_gpt


def test_waits_and_side_streams_are_timed_by_the_device():
    # The recording backend's clock counts logged stream operations, not seconds: what the
    # recorder reports must be that device clock.
    backend = RecordingBackend()
    layer = DeviceLayer("cpu", eager=True, backend=backend)
    stats = StatsRecorder(layer=layer)
    with stats.timed_wait("all_gather_wait_s"):
        for i in range(3):
            backend.op(f"stall {i}")
    layer.gather.submit(lambda: ([FakeWork(backend, "all_gather")], None))
    layer.reduce.submit(lambda: ([FakeWork(backend, "reduce")], None))
    assert stats.current.all_gather_wait_s == 0.0  # resolved at the end of the step
    last = stats.end_step()
    assert last.all_gather_wait_s == 3.0
    # gather span: begin mark, the collective, its wait, the ready record -> 3 entries
    assert last.all_gather_stream_s == 3.0 and last.reduce_stream_s == 3.0
    assert stats.end_step().all_gather_wait_s == 0.0  # nothing carried into the next step


def _step_stats(rank, world, prefetch):
    cfg = ds_config(world)
    cfg["zero_optimization"]["stage3_prefetch_bucket_size"] = prefetch
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=cfg)
    train_engine(engine, batches(2), rank, world)
    return engine.last_step_stats.as_dict()


def test_engine_fills_stream_times_on_cpu():
    st = run_ranks(_step_stats, 2, 0)[0]
    assert st["all_gather_wait_s"] > 0 and st["reduce_scatter_wait_s"] >= 0
    assert st["all_gather_stream_s"] > 0 and st["reduce_stream_s"] > 0
