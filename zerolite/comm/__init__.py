"""Collectives and process-group setup."""
from zerolite.comm.collectives import (all_gather_flat, all_reduce_sum, broadcast, gather_full_flat,
                                       reduce_scatter_flat, start_full_flat_gather)
from zerolite.comm.process_group import default_backend, init_distributed

__all__ = ["all_gather_flat", "all_reduce_sum", "broadcast", "gather_full_flat",
           "reduce_scatter_flat", "start_full_flat_gather", "default_backend", "init_distributed"]
