"""Which tag a save goes under when ranks pass different ones: DeepSpeed's
`checkpoint.tag_validation` ("WARN" by default, "IGNORE", "FAIL").

[Note: one directory] DeepSpeed lets each rank write under its own tag (a checkpoint that
loads only by hand); zerolite's checkpoint is one directory with one meta.json for all ranks,
so WARN and IGNORE save every rank's part under rank 0's tag (WARN says so, naming the tags),
and FAIL raises on every rank with DeepSpeed's message (an AssertionError, as its assert)."""
from __future__ import annotations

import logging

from zerolite.checkpoint.errors import ZeroliteCheckpointError

logger = logging.getLogger("zerolite")


class CheckpointTagMismatch(ZeroliteCheckpointError, AssertionError):
    """checkpoint.tag_validation "Fail": the ranks passed different tags."""


def agreed_tag(tags: list[str], rank: int, mode: str) -> str:
    """The tag every rank saves under, given each rank's tag (same list on every rank)."""
    if len(set(tags)) == 1:
        return tags[0]
    msg = (f"[rank={rank}] The checkpoint tag name '{tags[rank]}' is not consistent across all "
           f"ranks (tags by rank: {tags}). Including rank unique information in checkpoint tag "
           "could cause issues when restoring with different world sizes.")
    if mode == "FAIL":
        raise CheckpointTagMismatch(f"{msg} (checkpoint.tag_validation is 'Fail')")
    if mode == "WARN":
        logger.warning("%s zerolite saves every rank's part under rank 0's tag %r (set "
                       "checkpoint.tag_validation to 'Ignore' to silence this, 'Fail' to "
                       "raise)", msg, tags[0])
    return tags[0]
