"""`deepspeed.utils.init_on_device`: OnDevice (zerolite/device/on_device.py)."""
from zerolite.device.on_device import OnDevice  # noqa: F401

__all__ = ["OnDevice"]
