"""Launch one tiny Triton kernel and check its result (run by `zerolite report` in a child
process, so a crash or a hang cannot take the report down). Prints one line; exit 0 = ok."""
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _add_one(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.arange(100, dtype=torch.float32, device=device)
    out = torch.empty_like(x)
    _add_one[(triton.cdiv(100, 64),)](x, out, 100, BLOCK=64)
    if not torch.equal(out.cpu(), x.cpu() + 1):
        print(f"kernel ran on {device} but returned wrong values")
        return 1
    print(f"ok ({device})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
