"""`deepspeed.runtime`: engine, lr_schedules, zero.partition_parameters, activation checkpointing."""
