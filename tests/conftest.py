import os
import sys

import torch

# One intra-op thread in the parent too: forked ranks must not inherit a busy OpenMP pool,
# and 2 cores are shared by up to 4 ranks.
torch.set_num_threads(1)
os.environ.setdefault("ZEROLITE_TIMEOUT", "60")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
