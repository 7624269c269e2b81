"""The batch triangle: train_batch_size = micro_batch * gradient_accumulation_steps * world_size.

Derivation follows DeepSpeed's rules (any two keys give the third; train alone -> gas 1;
micro alone -> gas 1), except that zerolite refuses sizes that do not divide exactly instead of
silently rounding down.
"""

from __future__ import annotations

from zerolite.errors import ZeroliteConfigError

from ._util import check_int, is_auto, logger

TRAIN = "train_batch_size"
MICRO = "train_micro_batch_size_per_gpu"
GAS = "gradient_accumulation_steps"
BATCH_KEYS = (TRAIN, MICRO, GAS)

_HINT = ("this is usually caused by launching with a different number of processes than the config "
         "was written for (torchrun --nproc_per_node / WORLD_SIZE); fix the numbers or drop one "
         "of the keys so zerolite derives it")


def _given(raw: dict, key: str) -> int | None:
    value = raw.get(key)
    if value is None or is_auto(value):
        return None
    return check_int(key, value, gt=0)


def derive_batch(raw: dict, world_size: int) -> tuple[int, int, int]:
    """Return (train_batch_size, micro_batch_per_gpu, gradient_accumulation_steps)."""
    train, micro, gas = (_given(raw, k) for k in BATCH_KEYS)
    autos = [k for k in BATCH_KEYS if is_auto(raw.get(k))]
    ws = world_size

    def err(detail: str):
        shown = f"{TRAIN}={train}, {MICRO}={micro}, {GAS}={gas}, world_size={ws}"
        raise ZeroliteConfigError(f"{TRAIN}/{MICRO}/{GAS}: {detail} ({shown}); {_HINT}")

    if train is not None and micro is not None and gas is not None:
        if train != micro * gas * ws:
            err(f"{TRAIN} must equal {MICRO} * {GAS} * world_size = {micro * gas * ws}")
        return train, micro, gas
    if train is None and micro is None:
        if autos:
            raise ZeroliteConfigError(
                f"{TRAIN}/{MICRO}: all batch keys are 'auto' or missing (auto: {', '.join(autos)}); "
                f"set {MICRO} (or {TRAIN}) to a number, zerolite cannot infer batch sizes")
        alone = f" ({GAS} alone is not enough)" if gas is not None else ""
        raise ZeroliteConfigError(f"{TRAIN}/{MICRO}: neither is given{alone}; set {MICRO} "
                                  f"(and optionally {GAS}) or {TRAIN}")
    derived = ""
    if train is not None and micro is not None:
        if train % (micro * ws):
            err(f"{TRAIN} is not divisible by {MICRO} * world_size = {micro * ws}")
        gas, derived = train // (micro * ws), GAS
    elif train is not None and gas is not None:
        if train % (gas * ws):
            err(f"{TRAIN} is not divisible by {GAS} * world_size = {gas * ws}")
        micro, derived = train // (gas * ws), MICRO
    elif micro is not None and gas is not None:
        train, derived = micro * gas * ws, TRAIN
    elif train is not None:
        gas = 1
        if train % ws:
            err(f"{TRAIN} is not divisible by world_size")
        micro, derived = train // ws, f"{MICRO} (with {GAS}=1)"
    else:
        gas = 1
        train, derived = micro * ws, f"{TRAIN} (with {GAS}=1)"
    logger.info("zerolite config: derived %s: %s=%d, %s=%d, %s=%d at world_size=%d", derived,
                TRAIN, train, MICRO, micro, GAS, gas, ws)
    return train, micro, gas
