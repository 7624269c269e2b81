"""`deepspeed.checkpoint.utils.clone_tensors_for_torch_save`."""
import torch


def clone_tensors_for_torch_save(item, device=torch.device("cpu")):
    """Detached copies of every tensor in `item` (nested dicts/lists/tuples) on `device`, so a
    saved state dict does not drag along the (larger) storages its views belong to."""
    if torch.is_tensor(item):
        return item.detach().clone().to(device)
    if isinstance(item, dict):
        return type(item)({k: clone_tensors_for_torch_save(v, device) for k, v in item.items()})
    if isinstance(item, (list, tuple)):
        return type(item)(clone_tensors_for_torch_save(v, device) for v in item)
    return item
