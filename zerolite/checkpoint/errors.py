"""The checkpoint package's error type."""
from zerolite.errors import ZeroliteError


class ZeroliteCheckpointError(ZeroliteError):
    """A checkpoint could not be written or read: the message names the file and the problem."""
