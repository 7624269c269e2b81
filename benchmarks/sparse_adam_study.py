"""Why top-k 1% with error feedback misses dense under AdamW: a single-process simulation of
the world-2 sparse reduce, used to try the literature's fixes quickly before building one.

    python benchmarks/sparse_adam_study.py                      # every variant, ~1 min each
    python benchmarks/sparse_adam_study.py --variants dense ef_1%

It trains the `make demo` GPT exactly as benchmarks/sparse_grads.py does (same initial weights,
same byte windows, rank r's micro batch of 8, AdamW lr 3e-3 betas (0.9, 0.95) weight decay 0.1,
linear warmup 20 steps then linear decay, global clipping 1.0, 300 steps), but both "ranks"
run in one process and the optimizer is written out here, so its second moment, the residual
and the selection can be changed. Top-k is per gather unit (the root unit: embeddings and
final norm; one unit per block), k = ceil(ratio x unit numel) per rank, as comm/sparse.py.
Checked against the engine: dense 2.179 (engine 2.198), top-k 1% + EF 2.953 (engine 2.939),
without EF 2.590 (engine 2.613); the gaps to dense agree within 2 points.

Also tried: selection among DCT coefficients of 64- or 128-element chunks (DeMo's change of
basis; the transmitted coefficients decode to a dense update), and DeMo's owner rule (the
residual is a decayed sum of lr x gradient; the owner moves every coordinate by lr x sign of
the decoded average). `--steps 1000 --out ..._1000.json` checks whether a longer run closes
the gap.

Bytes: 8 per entry a rank selects over 4 per dense element (the engine counts only entries
leaving the rank, so its figures are a little lower); dense steps count 1.
Results: benchmarks/results/sparse_adam_study.json and .png.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zerolite.models import GPT, GPTConfig  # noqa: E402
from zerolite.models.byte_data import ByteWindows, stdlib_bytes  # noqa: E402

RAMP = (0.25, 0.0625, 0.015625)  # DGC's exponential sparsity warm-up, 5 steps each
VARIANTS = {  # name -> (label, options); options default to DEFAULTS
    "dense": ("dense AdamW", {"sparse": False}),
    "ef_1%": ("top-k 1% + EF (the engine's)", {}),
    "noef_1%": ("top-k 1%, no EF", {"ef": False}),
    "leak0.5_1%": ("top-k 1%, residual x0.5 per step", {"leak": 0.5}),
    "age_v": ("+ staleness-aware v (burst G after T silent steps adds G^2/T)", {"v": "age"}),
    "lazy_v": ("+ lazy v (decays only when the entry arrives)", {"v": "lazy"}),
    "block_v": ("+ v per 128-block from the dense local g^2 (Adam-mini-like)", {"v": "block"}),
    "frozen_v": ("9 dense steps, then v frozen (1-bit Adam)", {"warmup": 9, "v": "frozen"}),
    "score_vlocal": ("select by |acc| / sqrt(local v)", {"score": "vlocal"}),
    "score_tensor": ("select by |acc| / RMS of the tensor's grad", {"score": "tensor"}),
    "dgc_momentum": ("DGC momentum correction 0.9 + masking", {"dgc_momentum": 0.9}),
    "dgc_ramp": ("DGC sparsity warm-up 25%, 6.25%, 1.6% (5 steps each)", {"ramp": RAMP}),
    "residual_clip": ("DGC-style: residual norm <= unit grad norm", {"residual_clip": 1.0}),
    "sender_clip": ("local gradient clipped to 1.0 before EF", {"sender_clip": 1.0}),
    "lr_residual": ("residual x min(1, lr_t / lr_t+1) (warm-up lr)", {"lr_residual": True}),
    "update_ef": ("EF on the local AdamW update; owner: SGD", {"mode": "update",
                                                             "sender_clip": 1.0}),
    "update_ef_ramp": ("update EF + DGC warm-up", {"mode": "update", "sender_clip": 1.0,
                                                  "ramp": RAMP}),
    "update_noef": ("local AdamW update, no EF", {"mode": "update", "sender_clip": 1.0,
                                                 "ef": False}),
    "precond_ef": ("EF on g / sqrt(local v); owner: momentum", {"mode": "precond",
                                                              "sender_clip": 1.0}),
    "dct_ef": ("EF on gradients, top-k of 64-chunk DCT coefficients", {"basis": 64}),
    "sign_ef": ("DeMo-like: EF on decayed lr x grad; owner: lr x sign", {"mode": "sign"}),
    "sign_dct": ("DeMo-like, 1 of each 128-chunk's DCT coefficients (0.78%)",
                 {"mode": "sign", "basis": 128, "ratio": 1 / 128, "per_chunk": True}),
    "sign_dct2": ("DeMo-like, 2 of each 128-chunk's DCT coefficients (1.56%)",
                  {"mode": "sign", "basis": 128, "ratio": 2 / 128, "per_chunk": True}),
    "ef_10%": ("top-k 10% + EF (the engine's)", {"ratio": 0.1}),
    "update_ef_10%": ("EF on the local AdamW update at 10%", {"mode": "update",
                                                            "sender_clip": 1.0, "ratio": 0.1}),
}
DEFAULTS = dict(sparse=True, ratio=0.01, ef=True, leak=1.0, v="adam", warmup=0, score="mag",
                dgc_momentum=0.0, ramp=(), residual_clip=0.0, sender_clip=0.0,
                lr_residual=False, mode="grad", basis=0, per_chunk=False, decay=0.999)
B1, B2, EPS, WD, LR, CLIP, WARMUP, WORLD, MICRO, BLOCK = (0.9, 0.95, 1e-8, 0.1, 3e-3, 1.0, 20,
                                                          2, 8, 128)


def lr_at(step: int, steps: int) -> float:
    return LR * (step / WARMUP if step < WARMUP else max(0.0, (steps - step) / (steps - WARMUP)))


def dct_matrix(n: int) -> torch.Tensor:
    """Orthonormal DCT-II of size n (rows: frequencies): coefficients = D @ x, x = D.T @ c."""
    freq = torch.arange(n, dtype=torch.float64)[:, None]
    pos = torch.arange(n, dtype=torch.float64)[None, :]
    d = torch.cos(math.pi / n * (pos + 0.5) * freq) * math.sqrt(2.0 / n)
    d[0] /= math.sqrt(2.0)
    return d.float()


class ChunkDCT:
    """Each parameter's flat elements in consecutive chunks of `size` (the largest divisor of
    its numel not above `size`), each chunk replaced by its DCT coefficients: an orthogonal,
    numel-preserving change of basis (DeMo's 1-D transform), so units keep their bounds."""

    def __init__(self, numels: list[int], size: int):
        self.chunks = [max(d for d in range(1, min(n, size) + 1) if n % d == 0) for n in numels]
        self.numels = numels
        self.mats = {c: dct_matrix(c) for c in set(self.chunks)}
        ids, base = [], 0
        for n, c in zip(numels, self.chunks):
            ids.append(base + torch.arange(n) // c)
            base += n // c
        self.chunk_id = torch.cat(ids)
        self.sizes = torch.bincount(self.chunk_id)
        self.starts = torch.cumsum(self.sizes, 0) - self.sizes

    def _apply(self, x: torch.Tensor, inverse: bool) -> torch.Tensor:
        out = [seg.view(-1, c) @ (self.mats[c] if inverse else self.mats[c].T)
               for seg, c in zip(x.split(self.numels), self.chunks)]
        return torch.cat([o.reshape(-1) for o in out])

    def encode(self, x):
        return self._apply(x, False)

    def decode(self, x):
        return self._apply(x, True)

    def top_per_chunk(self, acc: torch.Tensor, ratio: float) -> torch.Tensor:
        """Mask of the ceil(ratio x chunk) largest |acc| of every chunk."""
        quota = (self.sizes.double() * ratio).ceil().long().clamp(min=1)
        order = torch.argsort(acc.abs(), descending=True, stable=True)
        order = order[torch.argsort(self.chunk_id[order], stable=True)]  # by chunk, largest first
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel()) - self.starts[self.chunk_id[order]]
        return rank < quota[self.chunk_id]


def run(opts: dict, steps: int) -> dict:
    o = {**DEFAULTS, **opts}
    torch.manual_seed(0)
    cfg = GPTConfig(seq_len=128, n_layer=4, n_head=4, d_model=128)
    model = GPT(cfg)
    data = ByteWindows(stdlib_bytes(), cfg.seq_len, num_windows=steps * WORLD * MICRO)
    units = [[model.tok_emb.weight, model.pos_emb.weight, model.ln_f.weight, model.ln_f.bias]]
    units += [list(b.parameters()) for b in model.blocks]
    plist = [p for u in units for p in u]
    bounds = [0]
    for u in units:
        bounds.append(bounds[-1] + sum(p.numel() for p in u))
    n = bounds[-1]
    theta = torch.cat([p.detach().reshape(-1) for p in plist])
    dct = ChunkDCT([p.numel() for p in plist], o["basis"]) if o["basis"] else None
    # the top-k's segments: one per gather unit, none when every chunk takes its own quota
    segments = [] if o["per_chunk"] else list(zip(bounds[:-1], bounds[1:]))
    z = lambda: torch.zeros(n)  # noqa: E731
    m, v, age = z(), z(), torch.ones(n)
    res, vel, lm, lv = ([z() for _ in range(WORLD)] for _ in range(4))
    losses, sent_frac = [], []
    for step in range(steps):
        off = 0
        for p in plist:
            p.data.copy_(theta[off:off + p.numel()].view_as(p))
            off += p.numel()
        grads, loss_sum = [], 0.0
        for r in range(WORLD):
            lo = (step * WORLD + r) * MICRO
            x, y = (torch.stack(t) for t in zip(*(data[i] for i in range(lo, lo + MICRO))))
            model.zero_grad(set_to_none=True)
            loss = model(x, y)
            loss.backward()
            loss_sum += loss.item()
            grads.append(torch.cat([p.grad.reshape(-1) for p in plist]))
        losses.append(loss_sum / WORLD)
        lr, t = lr_at(step, steps), step + 1
        ratio = o["ratio"]
        ramp_i = (step - o["warmup"]) // 5
        if o["ramp"] and 0 <= ramp_i < len(o["ramp"]):
            ratio = o["ramp"][ramp_i]
        dense = not o["sparse"] or step < o["warmup"]
        if dense:
            g, sent = sum(grads) / WORLD, 1.0
        else:
            g, entries = z(), 0
            for r in range(WORLD):
                gr = grads[r]
                if o["sender_clip"]:
                    gr = gr * min(1.0, o["sender_clip"] / gr.double().norm().item())
                if o["mode"] == "update":  # this rank's own AdamW direction
                    lm[r].mul_(B1).add_(gr, alpha=1 - B1)
                    lv[r].mul_(B2).addcmul_(gr, gr, value=1 - B2)
                    gr = (lm[r] / (1 - B1 ** t)) / ((lv[r] / (1 - B2 ** t)).sqrt() + EPS)
                elif o["mode"] == "precond":
                    lv[r].mul_(B2).addcmul_(gr, gr, value=1 - B2)
                    gr = gr / ((lv[r] / (1 - B2 ** t)).sqrt() + EPS)
                if dct is not None:
                    gr = dct.encode(gr)
                if o["dgc_momentum"]:
                    gr = vel[r].mul_(o["dgc_momentum"]).add_(gr)
                if o["mode"] == "sign":  # DeMo: the residual is a decayed sum of lr x grad
                    acc = res[r].mul_(o["decay"]).add_(gr, alpha=lr)
                else:
                    acc = res[r] + gr if o["ef"] else gr.clone()
                scale = None
                if o["score"] == "vlocal":
                    lv[r].mul_(B2).addcmul_(grads[r], grads[r], value=1 - B2)
                    scale = lv[r].sqrt() + 1e-12
                elif o["score"] == "tensor":
                    scale = torch.cat([q.pow(2).mean().sqrt().add(1e-12).expand(q.numel())
                                       for q in grads[r].split([p.numel() for p in plist])])
                if o["per_chunk"]:
                    mask = dct.top_per_chunk(acc, ratio) & (acc != 0)
                    g += torch.where(mask, acc, 0.0)
                    entries += int(mask.sum())
                    acc[mask] = 0
                for s, e in segments:
                    seg = acc[s:e]
                    if o["residual_clip"] and o["ef"]:
                        cap = o["residual_clip"] * gr[s:e].norm()
                        if seg.norm() > cap:
                            seg.mul_(cap / seg.norm())
                    key = seg.abs() if scale is None else seg.abs() / scale[s:e]
                    k = max(1, math.ceil(ratio * (e - s)))
                    mask = (key >= key.topk(k).values.min()) & (seg != 0)  # zeros: not sent
                    g[s:e] += torch.where(mask, seg, 0.0)
                    entries += int(mask.sum())
                    seg[mask] = 0
                    if o["dgc_momentum"]:
                        vel[r][s:e][mask] = 0  # momentum factor masking
                if o["ef"] and o["mode"] != "sign":
                    res[r] = acc.mul_(o["leak"])
                    if o["lr_residual"]:
                        nxt = lr_at(step + 1, steps)
                        res[r].mul_(0.0 if nxt == 0 else min(1.0, lr / nxt))
            g /= WORLD
            if dct is not None:
                g = dct.decode(g)
            sent = 2 * entries / WORLD / n
        sent_frac.append(sent)
        nz = g != 0
        theta.mul_(1 - lr * WD)
        if o["mode"] == "sign" and not dense:  # owner: signum on the decoded average
            theta.add_(g.sign(), alpha=-lr)
            continue
        if o["mode"] in ("update", "precond") and not dense:
            if o["mode"] == "precond":  # owner: momentum on the preconditioned stream
                g = m.mul_(B1).add_(g, alpha=1 - B1) / (1 - B1 ** t)
            theta.add_(g, alpha=-lr)  # owner: SGD on the averaged update, no global clipping
            continue
        gn = g.double().norm().item()
        if gn > CLIP:
            g = g * (CLIP / (gn + 1e-6))
        m.mul_(B1).add_(g, alpha=1 - B1)
        if o["v"] == "age" and not dense:
            v.mul_(B2).add_((1 - B2) * g * g / age)
        elif o["v"] == "lazy" and not dense:
            keep = torch.where(nz, B2 ** age, torch.ones(n))
            v.mul_(keep).add_(torch.where(nz, (1 - B2 ** age) * g * g / age, torch.zeros(n)))
        elif o["v"] == "block":
            pad = -n % BLOCK
            stat = sum(torch.nn.functional.pad(x * x, (0, pad)).view(-1, BLOCK).mean(1)
                       for x in grads) / WORLD * min(1.0, CLIP / gn) ** 2
            vb = stat if step == 0 else vb.mul_(B2).add_(stat, alpha=1 - B2)  # noqa: F821
            v = vb.repeat_interleave(BLOCK)[:n]
        elif not (o["v"] == "frozen" and not dense):
            v.mul_(B2).addcmul_(g, g, value=1 - B2)
        age = torch.where(nz, torch.ones(n), age + 1)
        theta.addcdiv_(m / (1 - B1 ** t), (v / (1 - B2 ** t)).sqrt().add_(EPS), value=-lr)
    return {"losses": losses, "bytes_vs_dense": sum(sent_frac) / steps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--last", type=int, default=20)
    ap.add_argument("--out", type=Path,
                    default=ROOT / "benchmarks" / "results" / "sparse_adam_study.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    result = {"steps": args.steps, "last": args.last, "world": WORLD, "micro_batch": MICRO,
              # every run of a file comes from this command (--variants picks which)
              "command": "python benchmarks/sparse_adam_study.py"
              + (f" --steps {args.steps}" if args.steps != 300 else ""), "runs": {}}
    if args.out.exists():  # keep other variants' runs of the same workload
        old = json.loads(args.out.read_text())
        if old.get("steps") == args.steps:
            result["runs"] = old["runs"]
    for name in args.variants:
        t0 = time.perf_counter()
        r = run(VARIANTS[name][1], args.steps)
        r["label"] = VARIANTS[name][0]
        r["final_loss"] = sum(r["losses"][-args.last:]) / args.last
        result["runs"][name] = r
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        dense = result["runs"].get("dense")
        vs = f" ({r['final_loss'] / dense['final_loss'] - 1:+.1%} vs dense)" if dense else ""
        print(f"{name:>14}: final {r['final_loss']:.3f}{vs}, bytes {r['bytes_vs_dense']:.4f}"
              f" of dense, {time.perf_counter() - t0:.0f}s", flush=True)
    try:
        from benchmarks.plots import save
        from benchmarks.plots.sparse import study_figure

        save(study_figure(result, source=args.out.name), args.out.with_suffix(".png"))
    except ImportError as exc:
        print(f"no picture: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
