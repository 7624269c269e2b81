"""`deepspeed.utils.z3_leaf_module`: ZeRO-3 leaf modules (zerolite/zero/leaf_modules.py says
what a leaf changes in zerolite)."""
from zerolite.zero.leaf_modules import (  # noqa: F401
    get_z3_leaf_modules, set_z3_leaf_module, set_z3_leaf_modules, set_z3_leaf_modules_by_name,
    set_z3_leaf_modules_by_suffix, unset_z3_leaf_modules, z3_leaf_module, z3_leaf_parameter,
)

__all__ = ["z3_leaf_module", "z3_leaf_parameter", "get_z3_leaf_modules", "set_z3_leaf_module",
           "set_z3_leaf_modules", "unset_z3_leaf_modules", "set_z3_leaf_modules_by_name",
           "set_z3_leaf_modules_by_suffix"]
