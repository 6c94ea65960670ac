"""On CUDA a step returns only once its kernels have run (worker/cosmos3.py `step`): the time taken
around a step -- the warm-up profile, the step records, the cost model's forecasts -- is then the step's
own, not its launch's. The model is not loaded: the step's work is stood in for, the adapter's own
`step` runs."""

from __future__ import annotations

import contextlib
import threading
import types

from candidate_scheduler.worker import cosmos3


class _Torch:
    """What `step` uses of torch, recording the device waits."""

    def __init__(self, log: list):
        self.cuda = types.SimpleNamespace(synchronize=lambda device: log.append(("synchronize", device)))

    @staticmethod
    def inference_mode():
        return contextlib.nullcontext()


def _adapter(device: str, log: list, monkeypatch) -> cosmos3.Cosmos3CandidateAdapter:
    adapter = object.__new__(cosmos3.Cosmos3CandidateAdapter)  # no checkpoint: only what `step` reads
    adapter.device, adapter._lock, adapter._torch = device, threading.Lock(), _Torch(log)
    monkeypatch.setattr(cosmos3, "run_step", lambda _adapter, groups: log.append(("forward", len(groups))) or 2)
    return adapter


def test_a_cuda_step_waits_for_its_kernels_on_its_device(monkeypatch):
    log: list = []
    assert _adapter("cuda:1", log, monkeypatch).step([object(), object()]) == 2
    assert log == [("forward", 2), ("synchronize", "cuda:1")]


def test_a_cpu_step_has_nothing_to_wait_for(monkeypatch):
    log: list = []
    adapter = _adapter("cpu", log, monkeypatch)
    assert adapter.step([object()]) == 2 and adapter.step([]) == 0
    assert log == [("forward", 1)]
