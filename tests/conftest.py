import os
import sys

import torch

# One intra-op thread in the parent too: forked ranks must not inherit a busy OpenMP pool,
# and 2 cores are shared by up to 4 ranks.
torch.set_num_threads(1)
os.environ.setdefault("ZEROLITE_TIMEOUT", "60")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` skip cleanly where no CUDA device is usable."""
    if torch.cuda.is_available():
        return
    import pytest

    skip = pytest.mark.skip(reason="needs a CUDA device (run `make gpu-check` on a GPU)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_process_group_left_in_pytest():
    """A test that leaves a process group in pytest's own process makes every forked rank after
    it fail with "default process group twice", far from the cause: fail that test instead."""
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        pytest.fail("this test left a torch.distributed process group in pytest's own process "
                    "(every later multi-rank test would fail): run engines through "
                    "zerolite.testing.multiprocess.run_ranks")
