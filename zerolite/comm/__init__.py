"""Collectives and process-group setup."""
from zerolite.comm.collectives import all_gather_flat, all_reduce_sum, broadcast, reduce_scatter_flat
from zerolite.comm.process_group import default_backend, init_distributed

__all__ = ["all_gather_flat", "all_reduce_sum", "broadcast", "reduce_scatter_flat",
           "default_backend", "init_distributed"]
