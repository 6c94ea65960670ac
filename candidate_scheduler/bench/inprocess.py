"""The in-process sglang pipeline of the method benchmark: quiet logs, a timer of the stages before
denoising, and the compute thread every in-process model call runs on."""

from __future__ import annotations

import logging
import threading
import time


def quiet_logs() -> None:
    for name in ("sglang", "diffusers", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)


def quiet_sglang() -> None:
    """Silence sglang's per-request info logs and its per-request denoise progress bar in this
    process, so (a) and (b) measure compute, not terminal writes (it flatters sglang, not us)."""
    quiet_logs()
    try:
        from sglang.multimodal_gen.runtime.pipelines_core.stages import base as stage_base

        original = stage_base.tqdm
        if not getattr(original, "_bench_quiet", False):
            def quiet_tqdm(*args, **kwargs):
                kwargs["disable"] = True
                return original(*args, **kwargs)

            quiet_tqdm._bench_quiet = True
            stage_base.tqdm = quiet_tqdm
    except ImportError:  # pragma: no cover - layout of another sglang version
        pass


class StageTimer:
    """Accumulates wall time spent in the pipeline's stages before denoising (image preprocess,
    tokenization, latent preparation incl. the VAE encode and the noise draw, timesteps): the
    conditioning cost of one sglang request."""

    def __init__(self, pipeline):
        self.total = 0.0
        names = [type(s).__name__ for s in pipeline.stages]
        stop = next((i for i, n in enumerate(names) if "Denois" in n), len(names))
        self.stages = names[:stop]
        for stage in pipeline.stages[:stop]:
            self._wrap(stage)

    def _wrap(self, stage) -> None:
        forward = stage.forward

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return forward(*args, **kwargs)
            finally:
                self.total += time.perf_counter() - t0

        stage.forward = timed


class ComputeThread:
    """One long-lived thread that runs every in-process model call, as the worker process runs its
    batches on its compute thread, so (a), (b), (c) and (d) share one threading setup. (Measured here:
    torch work issued from the main thread of a process on a 2-core machine shared with other busy
    processes stalls 10-20x at OpenMP barriers; from a worker-style thread it does not.)"""

    def __init__(self):
        import queue

        self._inbox: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="bench-compute", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            job = self._inbox.get()
            if job is None:
                return
            fn, args, done = job
            try:
                done["result"] = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                done["error"] = exc
            done["event"].set()

    def call(self, fn, *args):
        done = {"event": threading.Event()}
        self._inbox.put((fn, args, done))
        done["event"].wait()
        if "error" in done:
            raise done["error"]
        return done["result"]

    def close(self) -> None:
        self._inbox.put(None)
        self._thread.join(timeout=10)

