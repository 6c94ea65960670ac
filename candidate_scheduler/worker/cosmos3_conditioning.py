"""A Cosmos3 group's conditioning: the UND text pathway K/V and each observation's VAE latent.

Both are computed once when a group joins a running batch (`cosmos3_rows.start_group`) and served from
there to every forward that needs them:

- Text K/V. The transformer computes its UND K/V itself whenever a forward's cache key is missing from
  `transformer.cached_kv`, by calling `language_model(text_ids, text_mask, text_pos_ids)`. We wrap that
  call (`TextPathway.hook`). Inside our own forwards it assembles the K/V of the forward's rows from
  the rows its running groups computed when they joined (keyed by content: ids, mask and positions);
  anywhere else (sglang's own pipeline, the reference) it runs each distinct text row once and expands
  the result (with `by_request_rows`, below: the call as given). On the CPU a row computed in a batch
  of U rows is bitwise the row computed alone (notes §5b: the UND pathway is row independent), so K/V
  may be assembled from rows of different calls. On CUDA that is not known to hold (batched candidates
  were not bitwise there, cause not found yet), so there (`by_request_rows`) a row is keyed by the
  whole call sglang's request computes it in and its place there (`call_row_keys`: [cond], or batched
  CFG's [uncond; cond], one observation's), and a group computes such a call whole whenever a row of
  it is missing: a row is only ever served where sglang's own request computes it beside the same rows.
- VAE latents. sglang's latent stage encodes the observation for every candidate it prepares (we run
  it at batch 1 per candidate for the candidate's own noise). `VaeEncoder.observation()` scopes one
  observation of one group: the first candidate encodes it, the others reuse that latent.

With a `ConditioningCache` (conditioning_cache.py) both also survive across groups: a robot repeating
its instruction, or RL rollouts of one observation, skip the text pathway and the VAE encode.
"""

from __future__ import annotations

import hashlib
import threading
from contextlib import contextmanager

import torch

from candidate_scheduler.worker.conditioning_cache import ModelCache


def _unique_rows(rows: torch.Tensor) -> tuple[list[int], list[int]]:
    """First-seen indices of distinct rows, and for every row the position of its distinct row."""
    seen: dict[bytes, int] = {}
    unique: list[int] = []
    inverse: list[int] = []
    data = rows.cpu().numpy()
    for i in range(data.shape[0]):
        key = data[i].tobytes()
        if key not in seen:
            seen[key] = len(unique)
            unique.append(i)
        inverse.append(seen[key])
    return unique, inverse


def text_row_key(ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> bytes:
    """Content key of one text row: token ids [S], mask [S] and mRoPE positions [3, S]."""
    h = hashlib.sha256()
    for t in (ids, mask, pos):
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.digest()


def call_row_keys(ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> list[bytes]:
    """Keys of the rows of one call ([U, S], [U, S], [3, U, S]) that name the whole call and each row's
    place in it (TextPathway.by_request_rows)."""
    content = [text_row_key(ids[u], mask[u], pos[:, u]) for u in range(ids.shape[0])]
    call = hashlib.sha256(b"call:" + b"".join(content)).digest()
    return [hashlib.sha256(call + u.to_bytes(4, "big")).digest() for u in range(len(content))]


def kv_nbytes(kv) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


class TextPathway:
    """The wrapper around `transformer.language_model.forward`, and the K/V rows of running groups."""

    def __init__(self, language_model, counts: dict, cache: ModelCache, by_request_rows: bool = False):
        self.original = language_model.forward
        self.counts = counts
        self.cache = cache
        self.by_request_rows = by_request_rows  # key rows by the request call that computes them (module docstring)
        # `serving` is True only inside our own forwards (see module docstring), and per thread: a group
        # starting on the conditioning thread while the compute thread's forward serves never takes
        # the serving path
        self._thread = threading.local()
        # (weights epoch, row key) -> [K/V of that row at batch 1, number of running groups that hold
        # it]; starts add holders on the conditioning thread while the compute thread's leaving groups
        # drop theirs. The epoch (the cache's, bumped by sglang before every in-place weight update)
        # keeps a row computed with the old weights, still held by a group that runs on, from serving
        # a group that starts after the update.
        self.live: dict[tuple[int, bytes], list] = {}
        self._live_lock = threading.Lock()
        language_model.forward = self.hook

    @property
    def serving(self) -> bool:
        return getattr(self._thread, "serving", False)

    @serving.setter
    def serving(self, value: bool) -> None:
        self._thread.serving = value

    def serve(self, request_rows: int) -> None:
        """Serve our own forwards from here on (until `serving` is set False), with rows acquired in
        request calls of `request_rows` rows: 2 for batched CFG's [uncond; cond], else 1."""
        self._thread.request_rows = request_rows
        self._thread.serving = True

    def _served_keys(self, ids, mask, pos) -> tuple[list[bytes], list[int]]:
        """The row keys a forward's rows are served from (live under this weights epoch), and each row's
        place among them. With `by_request_rows` every row by its request call: a forward's rows are one
        row a call, or [uncond rows; cond rows] whose i-th of each half made one call (batched CFG,
        `serve(2)`)."""
        if not self.by_request_rows:
            unique, inverse = _unique_rows(torch.cat([ids, mask], dim=1))
            return [text_row_key(ids[u], mask[u], pos[:, u]) for u in unique], inverse
        n, request_rows = ids.shape[0], getattr(self._thread, "request_rows", 1)
        keys: list[bytes] = [b""] * n
        if request_rows == 2 and n % 2 == 0:
            half = n // 2
            for i in range(half):
                pair = torch.as_tensor([i, half + i], device=ids.device)
                keys[i], keys[half + i] = call_row_keys(ids[pair], mask[pair], pos[:, pair])
        else:
            for i in range(n):
                keys[i] = call_row_keys(ids[i : i + 1], mask[i : i + 1], pos[:, i : i + 1])[0]
        return keys, list(range(n))

    def hook(self, text_ids, text_mask, text_pos_ids, *args, **kwargs):
        if self.serving and not args and not kwargs:
            keys, inverse = self._served_keys(text_ids, text_mask, text_pos_ids)
            epoch = self.cache.epoch()
            found = [self.live.get((epoch, key)) for key in keys]
            if all(entry is not None for entry in found):
                return _gather([entry[0] for entry in found], inverse, text_ids.device)
        self.counts["text"] += 1
        if self.by_request_rows:
            # a row's bits may depend on its call: run the call as given, equal rows and all (a
            # batched-CFG call whose negative prompt tokenizes like its prompt is B=2 in sglang)
            return self.original(text_ids, text_mask, text_pos_ids, *args, **kwargs)
        rows = torch.cat([text_ids, text_mask], dim=1)
        unique, inverse = _unique_rows(rows)
        # Rows of one group carry the same text; run each distinct row once, in first-seen order
        # (so a CFG batch [uncond, cond] runs exactly as sglang's own B=2 call), then expand: rows are
        # row independent here (module docstring).
        if len(unique) == rows.shape[0]:
            return self.original(text_ids, text_mask, text_pos_ids, *args, **kwargs)
        idx = torch.as_tensor(unique, device=text_ids.device)
        kv = self.original(text_ids[idx], text_mask[idx], text_pos_ids[:, idx], *args, **kwargs)
        gather = torch.as_tensor(inverse, device=text_ids.device)
        return [(k.index_select(0, gather), v.index_select(0, gather)) for k, v in kv]

    def acquire(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, report) -> list[tuple[int, bytes]]:
        """Make the K/V of these rows ([U, S], [U, S], [3, U, S]) live for a joining group: with
        `by_request_rows`, the rows of one call of sglang's request, else any. Rows no running group
        holds and the cache does not know are computed in ONE call, in order (with `by_request_rows`: the
        whole call, when any of them is missing). Returns the live keys (weights epoch, row key) the
        group now holds (give them back with `release`)."""
        if self.by_request_rows:
            rows_keys = call_row_keys(ids, mask, pos)
        else:
            rows_keys = [text_row_key(ids[u], mask[u], pos[:, u]) for u in range(ids.shape[0])]
        epoch = self.cache.epoch()
        keys = [(epoch, key) for key in rows_keys]
        missing, wanted, held = [], set(), []
        with self._live_lock:  # rows held now cannot leave before the group holds them too
            for u, key in enumerate(keys):
                if key in self.live:
                    self.live[key][1] += 1
                    held.append(key)
                    continue
                if key in wanted:
                    continue
                cached = self.cache.get("text", key[1])
                if cached is not None:
                    self.live[key] = [cached, 1]
                    held.append(key)
                else:
                    missing.append(u)
                    wanted.add(key)
        if missing and self.by_request_rows:
            missing = list(range(ids.shape[0]))  # computed as sglang computes the call: the call may decide the bits
        if missing:
            idx = torch.as_tensor(missing, device=ids.device)
            rows = {}
            try:  # out of memory, say, in the call or a row's copy: what this group took hold of goes back
                kv = self.hook(ids[idx], mask[idx], pos[:, idx])
                for j, u in enumerate(missing):
                    if keys[u] in wanted:  # (a row of the call that is live already keeps what it holds)
                        rows[keys[u]] = row = [(k[j : j + 1].clone(), v[j : j + 1].clone()) for k, v in kv]
                        self.cache.put("text", keys[u][1], row, kv_nbytes(row))
            except BaseException:
                self.release(held)
                raise
            report.text_encodes += 1
            with self._live_lock:
                for key in keys:
                    if key in rows:
                        self.live.setdefault(key, [rows[key], 0])[1] += 1
        return keys

    def release(self, keys: list[tuple[int, bytes]]) -> None:
        with self._live_lock:
            for key in keys:
                entry = self.live.get(key)
                if entry is None:
                    continue
                entry[1] -= 1
                if entry[1] <= 0:
                    del self.live[key]


def _gather(rows: list, inverse: list[int], device) -> list:
    """Per layer, the K/V of a forward's rows from distinct rows at batch 1."""
    gather = torch.as_tensor(inverse, device=device)
    out = []
    for layer in range(len(rows[0])):
        k = torch.cat([r[layer][0] for r in rows], dim=0)
        v = torch.cat([r[layer][1] for r in rows], dim=0)
        out.append((k.index_select(0, gather), v.index_select(0, gather)))
    return out


class VaeEncoder:
    """The wrapper around the latent stage's `_vae_encode`: once per observation of a group."""

    def __init__(self, latent_stage, counts: dict, cache: ModelCache):
        self.original = latent_stage._vae_encode
        self.counts = counts
        self.cache = cache
        self._slot: list | None = None  # [cache key, latent or None] while one observation is prepared
        self._report = None
        latent_stage._vae_encode = self.encode

    def encode(self, video):
        slot = self._slot
        if slot is None:  # outside a group's start (sglang's own pipeline): unchanged
            self.counts["vae"] += 1
            return self.original(video)
        if slot[1] is None:
            latent = self.cache.get("vae", slot[0])
            if latent is None:
                self.counts["vae"] += 1
                if self._report is not None:
                    self._report.vae_encodes += 1
                latent = self.original(video)
                self.cache.put("vae", slot[0], latent, latent.numel() * latent.element_size())
            slot[1] = latent
        return slot[1]

    @contextmanager
    def observation(self, key: bytes, report):
        """Encode at most once inside this block; `key` names the observation (image digest, shape,
        the sampling fields that change the VAE input) for the cross-group cache."""
        self._slot, self._report = [key, None], report
        try:
            yield
        finally:
            self._slot, self._report = None, None


def observation_key(image, height: int, width: int) -> bytes:
    """What decides an observation's VAE latent: its pixels and the target size it is resized to."""
    h = hashlib.sha256()
    h.update(f"{image.dtype}{tuple(image.shape)}:{height}x{width}".encode())
    h.update(image.tobytes())
    return h.digest()
