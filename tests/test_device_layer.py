"""The device layer's ordering rules, checked on a recording backend (what a GPU would be
told to do), plus its CPU implementation and, where CUDA exists, the real thing."""
import gc
import time
import weakref

import pytest
import torch

from zerolite.device import DeviceLayer, HostBackend, default_device
from zerolite.testing.fake_device import FakeWork, RecordingBackend


def _layer(eager: bool):
    backend = RecordingBackend()
    return backend, DeviceLayer("cpu", eager=eager, backend=backend)


def _gather(backend, layer, name):
    """Submit a gather of unit `name` whose finishing step (qwZ dequantize) is an op too."""
    def finish(value):
        backend.op(f"dequant {value}")
        return value

    return layer.gather.submit(lambda: ([FakeWork(backend, f"all_gather {name}")], name),
                               finish=finish, name=name)


@pytest.mark.parametrize("eager", [True, False], ids=["nccl", "gloo"])
def test_compute_waits_for_gather_ready(eager):
    backend, layer = _layer(eager)
    ticket = _gather(backend, layer, "u1")
    backend.op("forward u0")  # overlaps the gather: not ordered after it
    assert ticket.wait() == "u1"
    read = backend.op("forward u1")
    gathered, deq = backend.index_of("all_gather u1"), backend.index_of("dequant u1")
    assert backend.happens_before(gathered, read)
    assert backend.happens_before(deq, read)
    assert not backend.happens_before(gathered, backend.index_of("forward u0"))
    # The collective and its dequantization ran on the gather stream, not on compute.
    assert backend.log[gathered][1] == backend.log[deq][1] == "all_gather"


@pytest.mark.parametrize("eager", [True, False], ids=["nccl", "gloo"])
def test_buffer_not_rewritten_before_consumer_is_done(eager):
    backend, layer = _layer(eager)
    first = _gather(backend, layer, "u1")
    first.wait()
    last_read = backend.op("backward u1")  # the last read of u1's full buffer
    # u1 released (host side): its memory may back u2's buffer, gathered next.
    _gather(backend, layer, "u2")
    assert backend.happens_before(last_read, backend.index_of("all_gather u2"))


def test_deferred_finish_waits_for_compute_again():
    # gloo: the dequantization runs at wait time and may reuse the memory of a buffer
    # released after the submit; compute's reads of that buffer must be done first.
    backend, layer = _layer(eager=False)
    ticket = _gather(backend, layer, "u2")
    last_read = backend.op("forward u1")  # then u1 is released
    ticket.wait()
    assert backend.happens_before(last_read, backend.index_of("dequant u2"))


@pytest.mark.parametrize("eager", [True, False], ids=["nccl", "gloo"])
def test_reduce_reads_finished_grads_and_keeps_buffer(eager):
    backend, layer = _layer(eager)
    backend.op("grad hook u1")  # writes the full gradient buffer
    buf = torch.empty(8)
    alive = weakref.ref(buf)
    ticket = layer.reduce.submit(lambda: ([FakeWork(backend, "reduce_scatter u1")], None),
                                 keep=(buf,), name="u1")
    del buf
    gc.collect()
    assert alive() is not None, "grad buffer freed while the reduce stream may still read it"
    ticket.wait()
    gc.collect()
    assert alive() is None, "ticket kept the grad buffer after compute waited for it"
    reuse = backend.op("optimizer step")  # e.g. an allocation reusing the buffer's memory
    reduced = backend.index_of("reduce_scatter u1")
    assert backend.happens_before(backend.index_of("grad hook u1"), reduced)
    assert backend.happens_before(reduced, reuse)
    assert backend.log[reduced][1] == "reduce"


def test_checker_sees_missing_order():
    # The happens-before check itself can say no: a side op with no event is unordered.
    backend = RecordingBackend()
    with backend.use_stream("all_gather"):
        side = backend.op("all_gather")
    compute = backend.op("forward")
    assert not backend.happens_before(side, compute)
    ev = backend.record("all_gather")
    backend.wait(ev)
    assert backend.happens_before(side, backend.op("forward again"))


def test_eager_finishes_at_submit_deferred_at_wait():
    for eager, finished_early in ((True, True), (False, False)):
        backend, layer = _layer(eager)
        ticket = _gather(backend, layer, "u1")
        assert any(e[0] == "op" and e[2] == "dequant u1" for e in backend.log) is finished_early
        ticket.wait()
        ticket.wait()  # idempotent: one dequantization, one compute wait
        assert sum(e[0] == "op" and e[2] == "dequant u1" for e in backend.log) == 1


class _HostWork:
    def __init__(self):
        self.waits = 0

    def wait(self):
        self.waits += 1

    def is_completed(self):
        return self.waits > 0


def test_cpu_layer_is_host_waits_only():
    layer = DeviceLayer("cpu")
    assert layer.kind == "cpu" and not layer.gather.eager and layer.gather.stream is None
    work = _HostWork()
    ticket = layer.gather.submit(lambda: ([work, None], torch.ones(3)),
                                 finish=lambda t: t * 2)
    assert work.waits == 0 and not ticket.is_completed()
    torch.testing.assert_close(ticket.wait(), torch.full((3,), 2.0))
    assert work.waits == 1 and ticket.is_completed()
    assert "rss" in layer.memory_stats()
    layer.synchronize()


def test_cpu_timer_reads_host_clock():
    layer = DeviceLayer("cpu")
    timer = layer.timer().start()
    time.sleep(0.02)
    assert 0.015 < timer.stop().seconds() < 1.0
    assert layer.timer().seconds() == 0.0  # never started


def test_side_marks_time_each_submit():
    backend, layer = _layer(True)
    _gather(backend, layer, "u1")
    (name, seconds), = layer.side_seconds(layer.gather)
    assert name == "u1" and seconds > 0
    assert layer.side_seconds(layer.gather) == []


def test_gloo_gather_through_layer():
    from zerolite.testing.multiprocess import run_ranks

    assert run_ranks(_gloo_gather, 2) == [[0.0, 0.0, 1.0, 1.0]] * 2


def _gloo_gather(rank, world):
    from zerolite.comm.collectives import all_gather_flat

    layer = DeviceLayer("cpu")
    full = torch.empty(2 * world)
    shard = torch.full((2,), float(rank))
    ticket = layer.gather.submit(lambda: ([all_gather_flat(full, shard, async_op=True)], full))
    return ticket.wait().tolist()


def test_default_device(monkeypatch):
    if not torch.cuda.is_available():
        assert default_device() == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert default_device() == torch.device("cuda", 1)


def test_unknown_device_is_refused():
    with pytest.raises(ValueError, match="cpu or cuda"):
        DeviceLayer("meta")
    assert isinstance(DeviceLayer("cpu").backend, HostBackend)


# -- on a GPU ---------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("eager", [True, False], ids=["nccl", "gloo"])
def test_cuda_side_stream_result_is_never_read_early(eager):
    """The gather stream sleeps ~50 ms before writing: without the ready event the compute
    stream would read the buffer's old contents (zeros)."""
    layer = DeviceLayer("cuda:0", eager=eager)
    out = torch.zeros(1 << 20, device="cuda:0")

    def start():
        torch.cuda._sleep(50_000_000)
        out.fill_(1.0)
        return [], out

    ticket = layer.gather.submit(start, finish=lambda t: t.mul_(3.0))
    result = ticket.wait()
    assert result.sum().item() == 3.0 * out.numel()
    assert layer.side_seconds(layer.gather)[0][1] > 0.01  # CUDA events saw the sleep


@pytest.mark.cuda
def test_cuda_timer_measures_gpu_time_not_host_time():
    layer = DeviceLayer("cuda:0")
    timer = layer.timer().start()
    torch.cuda._sleep(100_000_000)
    host_queued = time.perf_counter()
    timer.stop()
    assert time.perf_counter() - host_queued < 0.01  # the host did not wait
    assert timer.seconds() > 0.02
