"""`python -m candidate_scheduler.bench.gpu_ceiling`: what the device itself allows a batched Cosmos3
denoise step, measured without the model: the figures behind issue 24's batching targets.

For the full preset's generation layers (full_checkpoint.FULL_TRANSFORMER_CONFIG) and the tokens one
candidate carries at a shape (TOKENS: measured on the tiny checkpoint, whose VAE factors and patch size
are the full preset's), it measures with torch alone (no sglang, no checkpoint):
- the layer's GEMMs at M = tokens x N rows: TFLOP/s, and the least time a forward of N candidates can
  take at that rate (attention and elementwise work left out: a lower bound), so the least N=8 / N=1
  latency ratio batching can give;
- the layer's attention (SDPA with grouped-query heads, as sglang's torch_sdpa backend calls it) at N;
- batch invariance: whether each candidate's rows come out bitwise the same computed alone or beside
  N-1 others, for every GEMM of a layer (with and without bf16 reduced-precision reductions, which
  sglang's ServerArgs allow by default, and with sglang's batch-invariant matmul where sglang is
  importable on CUDA, timed too) and for that attention.

`--dry-run`: the same on the CPU with small dimensions (no figures), for `make test`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

# Generation-path tokens per candidate (the DiT's gen_layers input) and the cached text/image tokens
# they attend to, from a forward hook on the tiny checkpoint (2026-12-04).
TOKENS = {"480x832": 1966, "256x256": 336}
UND_TOKENS = 298
NS = (1, 2, 4, 8, 16)


def dims(dry_run: bool) -> dict:
    from candidate_scheduler.worker.full_checkpoint import FULL_TRANSFORMER_CONFIG as cfg

    if dry_run:
        return {"hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "intermediate": 128, "layers": 2}
    return {"hidden": cfg["hidden_size"], "heads": cfg["num_attention_heads"], "kv_heads": cfg["num_key_value_heads"],
            "head_dim": cfg["head_dim"], "intermediate": cfg["intermediate_size"], "layers": cfg["num_hidden_layers"]}


def gemm_shapes(d: dict) -> dict[str, tuple[int, int]]:
    """(in, out) of each generation-layer GEMM: q, k+v, o, and the dense relu2 MLP's up and down."""
    q, kv = d["heads"] * d["head_dim"], 2 * d["kv_heads"] * d["head_dim"]
    return {"q": (d["hidden"], q), "kv": (d["hidden"], kv), "o": (q, d["hidden"]),
            "up": (d["hidden"], d["intermediate"]), "down": (d["intermediate"], d["hidden"])}


class BatchInvariant:
    """sglang's batch-invariant kernels (Triton matmuls in place of cuBLAS), on and off again whole:
    its own context manager leaves torch.bmm patched. `available` is False off CUDA or without sglang."""

    def __init__(self, device: str, wanted: bool = True):
        self.ops = None
        if wanted and device.startswith("cuda"):
            try:
                from sglang.srt import batch_invariant_ops
            except Exception:  # sglang absent, or not importable on this machine: the other rows still stand
                batch_invariant_ops = None
            self.ops = batch_invariant_ops

    @property
    def available(self) -> bool:
        return self.ops is not None

    def __enter__(self):
        self.ops.enable_batch_invariant_mode()
        return self

    def __exit__(self, *exc) -> None:
        self.ops.disable_batch_invariant_mode()


class Timer:
    def __init__(self, device: str):
        import torch

        self.torch, self.cuda = torch, device.startswith("cuda")

    def ms(self, fn, reps: int) -> float:
        fn()  # warm-up: cuBLAS picks and caches its algorithm
        if self.cuda:
            start, end = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / reps
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) * 1e3 / reps


def _layer_ms(timer: Timer, xs: dict, weights: dict, reps: int) -> float:
    import torch.nn.functional as F

    total = 0.0
    for k in weights:
        x, w = xs[k], weights[k]
        total += timer.ms(lambda x=x, w=w: F.linear(x, w), reps)
    return total


def gemm_rates(d: dict, device: str, reps: int, ns=NS, tokens=TOKENS, invariant_kernels: bool = True) -> list[dict]:
    import torch

    timer, invariant = Timer(device), BatchInvariant(device, invariant_kernels)
    shapes = gemm_shapes(d)
    weights = {k: torch.randn(o, i, device=device, dtype=torch.bfloat16) * 0.02 for k, (i, o) in shapes.items()}
    layer_flop_per_row = 2 * sum(i * o for i, o in shapes.values())
    rows = []
    for shape, t in tokens.items():
        for n in ns:
            m = t * n
            xs = {k: torch.randn(m, i, device=device, dtype=torch.bfloat16) for k, (i, _o) in shapes.items()}
            layer_ms = _layer_ms(timer, xs, weights, reps)
            flop = layer_flop_per_row * m
            row = {"shape": shape, "n": n, "rows": m, "layer_gemm_ms": layer_ms,
                   "tflops": flop / (layer_ms * 1e-3) / 1e12, "forward_gemm_ms": layer_ms * d["layers"]}
            if invariant.available:
                with invariant:
                    row["forward_gemm_ms_batch_invariant"] = _layer_ms(timer, xs, weights, reps) * d["layers"]
            rows.append(row)
            del xs
    for row in rows:
        one = next(r for r in rows if r["shape"] == row["shape"] and r["n"] == 1)
        row["over_n1"] = row["forward_gemm_ms"] / one["forward_gemm_ms"]
    return rows


def _compare(op: str, t: int, setting: str, n: int, pairs) -> dict:
    """pairs: (alone, beside the others) for every candidate."""
    diffs = [float((a.float() - b.float()).abs().max()) for a, b in pairs]
    return {"op": op, "tokens": t, "setting": setting, "n": n, "bitwise": all(d == 0.0 for d in diffs),
            "max_abs": max(diffs), "candidates_differing": sum(d != 0.0 for d in diffs)}


def _gemm_pairs(x, w, t: int, n: int) -> list:
    """(alone, beside the others) for each candidate's t rows of x."""
    import torch.nn.functional as F

    batched = F.linear(x, w)
    return [(F.linear(x[j * t:(j + 1) * t], w), batched[j * t:(j + 1) * t]) for j in range(n)]


def _qkv(d: dict, device: str, t: int, n: int):
    """A layer's attention inputs for n candidates: grouped-query heads, keys over the cached prefix too."""
    import torch

    q = torch.randn(n, d["heads"], t, d["head_dim"], device=device, dtype=torch.bfloat16)
    k = torch.randn(n, d["kv_heads"], t + UND_TOKENS, d["head_dim"], device=device, dtype=torch.bfloat16)
    return q, k, torch.randn_like(k)


def invariance(d: dict, device: str, t: int, n: int, invariant_kernels: bool = True) -> list[dict]:
    """Each candidate's outputs computed alone against beside n-1 others (the worker stacks candidates
    on the batch dimension, so a GEMM sees their rows together), for every GEMM of a layer and for the
    layer's attention as sglang's SDPA backend calls it (grouped-query heads, enable_gqa)."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    out, invariant = [], BatchInvariant(device, invariant_kernels)
    saved = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    try:
        for name, (i, o) in gemm_shapes(d).items():
            x = torch.randn(n * t, i, device=device, dtype=torch.bfloat16)
            w = torch.randn(o, i, device=device, dtype=torch.bfloat16) * 0.02
            for reduced in (True, False):
                torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = reduced
                out.append(_compare(f"gemm {name}", t, f"allow_bf16_reduced_precision_reduction={reduced}", n,
                                    _gemm_pairs(x, w, t, n)))
            if invariant.available:
                with invariant:
                    pairs = _gemm_pairs(x, w, t, n)
                out.append(_compare(f"gemm {name}", t, "sglang batch-invariant matmul", n, pairs))
    finally:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = saved
    q, k, v = _qkv(d, device, t, n)
    batched = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    pairs = [(F.scaled_dot_product_attention(q[j:j + 1], k[j:j + 1], v[j:j + 1], enable_gqa=True), batched[j:j + 1])
             for j in range(n)]
    out.append(_compare("sdpa (gqa)", t, "torch's default backend choice", n, pairs))
    return out


def attention_ms(d: dict, device: str, reps: int, ns, tokens) -> list[dict]:
    """The layer's attention as sglang's SDPA backend calls it, per forward (x layers), at each N."""
    import torch.nn.functional as F

    timer, rows = Timer(device), []
    for shape, t in tokens.items():
        for n in ns:
            q, k, v = _qkv(d, device, t, n)
            ms = timer.ms(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), reps)
            rows.append({"shape": shape, "n": n, "forward_attention_ms": ms * d["layers"]})
    return rows


def measure(dry_run: bool, invariant_kernels: bool = True) -> dict:
    """Everything above; `invariant_kernels` False leaves out sglang's batch-invariant kernels (their
    Triton builds are the slow part: gpu_phases.ceiling keeps a result without them first)."""
    import torch

    device = "cpu" if dry_run else "cuda"
    d = dims(dry_run)
    tokens = {k: (8 if dry_run else v) for k, v in TOKENS.items()}
    t0 = time.perf_counter()
    result = {"dry_run": dry_run, "torch": torch.__version__, "dims": d, "tokens": tokens, "und_tokens": UND_TOKENS,
              "device": torch.cuda.get_device_name(0) if not dry_run else "cpu",
              "gemm": gemm_rates(d, device, 2 if dry_run else 10, (1, 2) if dry_run else NS, tokens,
                                 invariant_kernels),
              "attention": attention_ms(d, device, 2 if dry_run else 10, (1, 2) if dry_run else NS, tokens),
              "invariance": [r for shape_t in tokens.values()
                             for r in invariance(d, device, shape_t, 8, invariant_kernels)]}
    result["wall_s"] = time.perf_counter() - t0
    return result


def markdown(r: dict) -> str:
    lines = [f"# Device ceiling for a batched Cosmos3 denoise step ({'DRY RUN' if r['dry_run'] else r['device']})", "",
             f"torch {r['torch']}; the full preset's generation layers ({r['dims']}); tokens per candidate "
             f"{r['tokens']}. GEMMs only: attention and elementwise work are left out, so a forward takes at "
             "least this long.", "",
             "| shape | N | rows | GEMM TFLOP/s | least forward ms | / N=1 | SDPA ms per forward | "
             "GEMMs ms, batch-invariant kernels |", "|---|---|---|---|---|---|---|---|"]
    attention = {(a["shape"], a["n"]): a["forward_attention_ms"] for a in r.get("attention", [])}
    for g in r["gemm"]:
        sdpa, bi = attention.get((g["shape"], g["n"])), g.get("forward_gemm_ms_batch_invariant")
        lines.append(f"| {g['shape']} | {g['n']} | {g['rows']} | {g['tflops']:.0f} | {g['forward_gemm_ms']:.1f} | "
                     f"{g['over_n1']:.2f}x | {'-' if sdpa is None else f'{sdpa:.1f}'} | "
                     f"{'-' if bi is None else f'{bi:.1f}'} |")
    inv = r["invariance"]
    n = inv[0]["n"] if inv else 1
    who = "each candidate" if inv and "candidates_differing" in inv[0] else "candidate 0"  # older files: 0 only
    lines += ["", f"## Batch invariance ({who} alone against beside {n - 1} others)", "",
              "| op | tokens per candidate | setting | bitwise | candidates differing | max abs diff |",
              "|---|---|---|---|---|---|"]
    for v in r["invariance"]:
        lines.append(f"| {v['op']} | {v['tokens']} | {v['setting']} | {v['bitwise']} | "
                     f"{v.get('candidates_differing', '-')} | {v['max_abs']:.3g} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m candidate_scheduler.bench.gpu_ceiling", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench/results", help="where gpu_ceiling.json and gpu_ceiling.md go")
    p.add_argument("--dry-run", action="store_true", help="on the CPU with small dimensions: no figures")
    args = p.parse_args(argv)
    result = measure(args.dry_run)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "_dry" if args.dry_run else ""
    (out / f"gpu_ceiling{suffix}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"gpu_ceiling{suffix}.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
