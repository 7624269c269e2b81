"""`deepspeed.runtime.sequence_parallel`: refused (Ulysses sequence parallelism)."""
