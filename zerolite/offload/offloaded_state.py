"""`optimizer.state` of the chunked offload optimizer (chunked_optimizer.py): a mapping keyed by
master shard, as torch and zerolite.checkpoint expect, over state that lives in chunks."""
from __future__ import annotations

from collections.abc import MutableMapping


class OffloadedState(MutableMapping):
    """`optimizer.state` keyed by master shard, as torch and zerolite.checkpoint expect.

    Reading an entry assembles the whole shard's state from its chunks (a temporary copy);
    writing one stores it into the chunks' files. Membership tests read nothing.
    """

    def __init__(self, opt):  # a ChunkedOffloadOptimizer
        self._opt = opt

    def __getitem__(self, master):
        state = self._opt._gather_state(master)
        if state is None:
            raise KeyError(master)
        return state

    def __setitem__(self, master, state):
        self._opt._scatter_state(master, state)

    def __delitem__(self, master):
        if not self._opt._drop_state(master):
            raise KeyError(master)

    def pop(self, master, *default):
        # Note: a torn shard can still be dropped (checkpoint load does that); only reading it fails.
        if master not in self:
            if default:
                return default[0]
            raise KeyError(master)
        value = None if master in self._opt._torn else self[master]
        del self[master]
        return value

    def __contains__(self, master):
        chunks = self._opt._by_master.get(master)
        return bool(chunks) and chunks[0].has_state

    def __iter__(self):
        return iter([m for m in self._opt._by_master if m in self])

    def __len__(self):
        return sum(1 for m in self._opt._by_master if m in self)
