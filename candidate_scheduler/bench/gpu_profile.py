"""Where a batched group's device time goes: one `run_batch` under torch.profiler, its kernels ranked by
their own time and put in classes (GEMM, attention, the rest).

The second H200 loan measured a denoise step at about three times the time its GEMMs alone take
(bench/results/gpu_check_20261204b): this says what the other two thirds are, for N=1 and N=8.
"""

from __future__ import annotations

import re

TOP = 12
# kernel-name patterns, first match wins (cuBLAS/CUTLASS GEMMs, Triton matmuls of the batch-invariant ops,
# flash/cuDNN/efficient attention, and everything else: elementwise, reductions, copies, the VAE's convs)
CLASSES = (
    ("attention", re.compile(r"flash|fmha|attention|sdpa|softmax", re.I)),
    ("gemm", re.compile(r"gemm|xmma|cutlass|cublas|matmul|wgmma|(^|::)(add)?b?mm$", re.I)),
    ("conv", re.compile(r"conv|implicit_convolve|cudnn", re.I)),
)


def kind_of(kernel: str) -> str:
    return next((name for name, pattern in CLASSES if pattern.search(kernel)), "other")


def kernel_profile(adapter, item, device: str, top: int = TOP) -> dict:
    """Run `item` (a GroupWork) once under torch.profiler; its kernels by self time on the device (on
    the CPU: the operators by self CPU time)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        adapter.run_batch([item])
        if cuda:
            torch.cuda.synchronize()

    def own_us(event) -> float:
        if not cuda:
            return event.self_cpu_time_total
        return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0)

    timed = sorted(((e.key, own_us(e), e.count) for e in prof.key_averages() if own_us(e) > 0), key=lambda r: -r[1])
    total_us = sum(us for _k, us, _c in timed)
    by_kind: dict[str, float] = {}
    for key, us, _count in timed:
        by_kind[kind_of(key)] = by_kind.get(kind_of(key), 0.0) + us
    return {"n": len(item.candidates), "clock": "device" if cuda else "cpu", "total_ms": total_us / 1e3,
            "by_kind_ms": {k: v / 1e3 for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "top": [{"kernel": key[:120], "ms": us / 1e3, "calls": count, "kind": kind_of(key)}
                    for key, us, count in timed[:top]]}


def markdown(profiles: list[dict]) -> list[str]:
    lines = ["## Where a group's device time goes (torch.profiler, one run each)", "",
             "| N | clock | total ms | " + " | ".join(f"{k} ms" for k in ("gemm", "attention", "conv", "other")) + " |",
             "|---|---|---|---|---|---|---|"]
    for p in profiles:
        kinds = " | ".join(f"{p['by_kind_ms'].get(k, 0.0):.1f}" for k in ("gemm", "attention", "conv", "other"))
        lines.append(f"| {p['n']} | {p['clock']} | {p['total_ms']:.1f} | {kinds} |")
    for p in profiles:
        lines += ["", f"N={p['n']}, the kernels with the most time:", "", "| kernel | kind | ms | calls |",
                  "|---|---|---|---|"]
        lines += [f"| `{t['kernel']}` | {t['kind']} | {t['ms']:.1f} | {t['calls']} |" for t in p["top"]]
    return lines + [""]
