"""Peak memory of one benchmark call: CUDA max allocated, or on CPU the peak RSS over the RSS before."""

from __future__ import annotations

import ctypes


def _proc_status(pid: int | str = "self") -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0]) * 1024
    return out


class MemoryProbe:
    """Peak memory of one call. CUDA: torch.cuda.max_memory_allocated (reset before the call).
    CPU: the process's peak RSS (VmHWM, reset through /proc/PID/clear_refs) minus its RSS before the
    call; in this process glibc's free heap is trimmed first, so the delta is what the call itself
    touched. Another process (the (d) worker) cannot be trimmed: its delta is a lower bound and its
    absolute peak RSS is reported too."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        try:
            self._libc = ctypes.CDLL("libc.so.6")
        except OSError:
            self._libc = None

    def _reset_hwm(self, pid) -> bool:
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def begin(self, pid: int | None = None) -> dict:
        if self.cuda and pid is None:
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return {"kind": "cuda_max_allocated", "base": int(torch.cuda.memory_allocated())}
        target = "self" if pid is None else pid
        if pid is None and self._libc is not None:
            self._libc.malloc_trim(0)
        reset = self._reset_hwm(target)
        return {"kind": "rss_peak" if reset else "rss_hwm_unreset", "base": _proc_status(target)["VmRSS"],
                "pid": target}

    def end(self, token: dict) -> dict:
        if token["kind"] == "cuda_max_allocated":
            import torch

            torch.cuda.synchronize()
            peak = int(torch.cuda.max_memory_allocated())
        else:
            peak = _proc_status(token["pid"])["VmHWM"]
        return {"kind": token["kind"], "peak_bytes": peak, "delta_bytes": max(0, peak - token["base"])}
