"""The text pathway's row keys where a row's K/V may depend on the call that computes it
(`TextPathway.by_request_rows`, on for CUDA), against a fake language model whose K/V do: a row's
value carries its call's row count and its neighbours' tokens. Serving a row from another call shape
or another neighbour then shows as a wrong value, which a CPU model (row independent) cannot show."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")

from candidate_scheduler.worker.conditioning_cache import ConditioningCache  # noqa: E402
from candidate_scheduler.worker.cosmos3_conditioning import TextPathway  # noqa: E402


class CallDependentLM:
    """K/V of a row = its tokens + 1000 x the call's rows + 10 x the sum of the call's first tokens."""

    def __init__(self):
        self.calls: list[int] = []

    def forward(self, ids, mask, pos, *args, **kwargs):
        self.calls.append(int(ids.shape[0]))
        kv = ids.float().unsqueeze(-1) + 1000.0 * ids.shape[0] + 10.0 * float(ids[:, 0].sum())
        return [(kv, kv + 0.5)]


def rows(*tokens: int, s: int = 4):
    ids = torch.tensor([[t] * s for t in tokens])
    return ids, torch.ones_like(ids), torch.zeros(3, len(tokens), s, dtype=torch.long)


def pathway(keyed: bool = True, cache_mb: float = 0.0):
    lm = CallDependentLM()
    cache = ConditioningCache(int(cache_mb * 2**20)).for_model(b"model")
    return lm, TextPathway(lm, {"text": 0}, cache, by_request_rows=keyed)


def report():
    return types.SimpleNamespace(text_encodes=0)


def served(tp, request_rows: int, *tokens: int):
    tp.serve(request_rows)
    try:
        return tp.hook(*rows(*tokens))
    finally:
        tp.serving = False


@pytest.mark.parametrize("keyed", [True, False])
def test_a_row_is_served_only_from_a_call_like_its_request(keyed):
    lm, tp = pathway(keyed)
    tp.acquire(*rows(7), report())  # cond alone (a step without CFG)
    tp.acquire(*rows(3, 7), report())  # [uncond; cond] (batched CFG)
    tp.acquire(*rows(4, 7), report())  # another request: the same cond beside another uncond
    for request_rows, tokens in ((2, (3, 7)), (2, (4, 7)), (1, (7,))):
        lm.calls.clear()
        got = served(tp, request_rows, *tokens)[0][0]
        want = lm.forward(*rows(*tokens))[0][0]
        if keyed:
            assert torch.equal(got, want), tokens  # from the live rows, as sglang's own call computes them
            assert lm.calls == [len(tokens)]  # (only the reference call above: nothing computed to serve)
    if not keyed:  # by content: the cond row is served from whichever call computed it first
        assert not torch.equal(served(tp, 2, 3, 7)[0][0], lm.forward(*rows(3, 7))[0][0])


def test_batched_cfg_forwards_pair_the_halves_into_calls():
    lm, tp = pathway()
    tp.acquire(*rows(3, 7), report())
    tp.acquire(*rows(4, 8), report())
    lm.calls.clear()
    got = served(tp, 2, 3, 4, 7, 8)[0][0]  # [uncond rows; cond rows] of two requests' rows
    assert lm.calls == []  # every row live
    first, second = lm.forward(*rows(3, 7))[0][0], lm.forward(*rows(4, 8))[0][0]
    assert torch.equal(got, torch.cat([first[:1], second[:1], first[1:], second[1:]]))


@pytest.mark.parametrize("fail", ["call", "copy"])
def test_a_failing_acquire_gives_back_what_it_took(fail):
    """A group whose call finds one row live and computes the other, and fails doing so (in the call,
    or copying a row out of it): the live row's holders are as before. By content, where a call can
    be part live (by request call a whole call is live or none of it)."""
    lm, tp = pathway(keyed=False, cache_mb=1)
    held = tp.acquire(*rows(7), report())
    before = {k: v[1] for k, v in tp.live.items()}

    class Broken:
        def __getitem__(self, _):
            raise MemoryError("a row's copy")

    def broken(*_args, **_kwargs):
        if fail == "call":
            raise MemoryError("the text call")
        return [(Broken(), Broken())]

    tp.original = broken
    with pytest.raises(MemoryError):
        tp.acquire(*rows(3, 7), report())
    assert {k: v[1] for k, v in tp.live.items()} == before
    tp.release(held)
    assert not tp.live
