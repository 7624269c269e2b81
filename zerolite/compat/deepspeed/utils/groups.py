"""`deepspeed.utils.groups`: zerolite has one data-parallel group, the world; model,
expert and sequence parallel groups are refused."""
import torch.distributed as dist

from zerolite.compat.deepspeed._refused import refused_function


def _get_data_parallel_group():
    return dist.group.WORLD


def _get_data_parallel_world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _get_data_parallel_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def get_data_parallel_group():
    return _get_data_parallel_group()


def get_data_parallel_world_size() -> int:
    return _get_data_parallel_world_size()


def get_data_parallel_rank() -> int:
    return _get_data_parallel_rank()


def get_model_parallel_world_size() -> int:
    return 1  # data parallelism only: every rank is its own model-parallel group


def get_model_parallel_rank() -> int:
    return 0


get_tensor_model_parallel_world_size = get_model_parallel_world_size
get_tensor_model_parallel_rank = get_model_parallel_rank


def _get_model_parallel_world_size() -> int:
    return 1


def _get_model_parallel_rank() -> int:
    return 0


def _get_sequence_parallel_world_size() -> int:
    return 1


_get_sequence_parallel_group = refused_function(
    "deepspeed.utils.groups._get_sequence_parallel_group", "sequence parallelism (Ulysses)")
_get_expert_parallel_group = refused_function(
    "deepspeed.utils.groups._get_expert_parallel_group", "mixture-of-experts parallelism")
_create_expert_and_data_parallel = refused_function(
    "deepspeed.utils.groups._create_expert_and_data_parallel", "mixture-of-experts parallelism")
