"""A bounded LRU cache of conditioning (text pathway K/V, VAE latents) shared across groups.

Entries are charged by their tensor bytes and evicted least recently used first once the total passes
`max_bytes` (0 turns the cache off: nothing is stored, every lookup misses without counting). Every key
starts with the model's identity (its resolved checkpoint path and the size and mtime of every weight
file, see `model_identity`) and sglang's weights epoch (bumped by `invalidate_conditioning_caches()`
on every in-place weight update), so an entry never serves another model, another checkpoint, or the
same model after its weights changed. A value whose epoch moved between its miss and its `put` (the
weights changed while it was computed) is not stored at all (`ModelCache`).
"""

from __future__ import annotations

import hashlib
import numbers
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".json", ".model")


def model_identity(model_dir: str | os.PathLike) -> bytes:
    """A digest naming one checkpoint on disk: its resolved path and, for every weight or config file
    under it, the relative path, the file it resolves to, size and mtime (cheap even for a full-size
    checkpoint: no reads)."""
    root = Path(model_dir).resolve()
    h = hashlib.sha256(str(root).encode())
    files = []
    # followlinks: a checkpoint assembled with `ln -s` (a component folder pointing at one training
    # run's weights) must change identity when the link is repointed; Path.rglob does not enter
    # symlinked folders. `seen` stops a link back up the tree from walking forever.
    seen: set[str] = set()
    for folder, dirs, names in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            dirs.clear()
            continue
        seen.add(real)
        files += [Path(folder) / name for name in names if Path(name).suffix in WEIGHT_SUFFIXES]
    for path in sorted(files):
        if path.is_file():
            st = path.stat()
            h.update(f"{path.relative_to(root)}>{path.resolve()}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.digest()


def device_name(device: str, current_cuda_index: int | None) -> str:
    """One name per device, for a cache identity: "cuda" is the CUDA device current when the model was
    placed (`current_cuda_index`; None: no CUDA to ask, left as named), any "cpu:N" is "cpu". `device` is
    torch's spelling of it (`str(torch.device(...))`), so this needs no torch."""
    kind, _, index = device.partition(":")
    if kind == "cpu":
        return "cpu"
    if kind == "cuda" and not index and current_cuda_index is not None:
        return f"cuda:{int(current_cuda_index)}"
    return device


class ConditioningCache:
    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"conditioning cache size must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self.bytes = 0
        self.hits = {"text": 0, "vae": 0}
        self.misses = {"text": 0, "vae": 0}
        self.evictions = 0
        self._entries: OrderedDict[tuple, tuple[object, int]] = OrderedDict()
        # starts look up and fill it on the worker's conditioning thread; heartbeats read its counters
        self._lock = threading.RLock()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def get(self, key: tuple):
        with self._lock:
            if not self.enabled:
                return None
            entry = self._entries.get(key)
            kind = key[0]
            if entry is None:
                self.misses[kind] = self.misses.get(kind, 0) + 1
                return None
            self._entries.move_to_end(key)
            self.hits[kind] = self.hits.get(kind, 0) + 1
            return entry[0]

    def put(self, key: tuple, value, nbytes: int) -> None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral) or nbytes < 0:
            # a negative charge would lower `bytes` and let real entries pile up past the budget
            raise ValueError(f"a conditioning cache entry must be >= 0 bytes, got {nbytes!r}")
        with self._lock:
            if not self.enabled or nbytes > self.max_bytes or key in self._entries:
                return
            self._entries[key] = (value, int(nbytes))
            self.bytes += int(nbytes)
            while self.bytes > self.max_bytes:
                _old, (_value, size) = self._entries.popitem(last=False)
                self.bytes -= size
                self.evictions += 1

    def resize(self, max_bytes: int) -> None:
        """A new limit; entries past it are evicted (least recently used first), 0 empties the cache."""
        if max_bytes < 0:
            raise ValueError(f"conditioning cache size must be >= 0 bytes, got {max_bytes}")
        with self._lock:
            self.max_bytes = int(max_bytes)
            while self._entries and self.bytes > self.max_bytes:
                _old, (_value, size) = self._entries.popitem(last=False)
                self.bytes -= size
                self.evictions += 1

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0

    def drop(self, kind: str) -> None:
        """Forget every entry of one kind ("text" or "vae"): a benchmark whose next run must pay its own
        observation encode, as a client's fresh observation would."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == kind]:
                _value, size = self._entries.pop(key)
                self.bytes -= size

    def stats(self) -> dict:
        """Counters for metrics: hits and misses per kind, evictions, entries, bytes in use, limit."""
        with self._lock:
            return {
                "enabled": self.enabled,
                "text_hits": self.hits.get("text", 0),
                "text_misses": self.misses.get("text", 0),
                "vae_hits": self.hits.get("vae", 0),
                "vae_misses": self.misses.get("vae", 0),
                "evictions": self.evictions,
                "entries": len(self._entries),
                "bytes": self.bytes,
                "max_bytes": self.max_bytes,
            }

    def for_model(self, identity: bytes, epoch: Callable[[], int] = lambda: 0) -> ModelCache:
        return ModelCache(self, identity, epoch)


class ModelCache:
    """One model's view of a (possibly shared) cache: every key is prefixed with the model identity
    and the weights epoch at the time of the lookup."""

    # how many missed keys remember the epoch they missed at (a start misses a few keys at a time)
    MISSES_KEPT = 4096

    def __init__(self, cache: ConditioningCache, identity: bytes, epoch: Callable[[], int]):
        self.cache = cache
        self.identity = identity
        self.epoch = epoch
        self._missed: OrderedDict[tuple[str, bytes], int] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, kind: str, key: bytes):
        epoch = self.epoch()
        value = self.cache.get((kind, self.identity, epoch, key))
        if value is None and self.cache.enabled:
            with self._lock:
                self._missed[(kind, key)] = epoch
                self._missed.move_to_end((kind, key))
                while len(self._missed) > self.MISSES_KEPT:
                    self._missed.popitem(last=False)
        return value

    def put(self, kind: str, key: bytes, value, nbytes: int) -> None:
        # The caller computed `value` after its miss. If the weights changed since (the epoch moved),
        # the value may be of the old weights: stored under the new epoch it would be served as theirs.
        now = self.epoch()
        with self._lock:
            missed_at = self._missed.pop((kind, key), now)
        if missed_at != now:
            return
        self.cache.put((kind, self.identity, now, key), value, nbytes)
