"""Where a text row's K/V may depend on its call (`TextPathway.by_request_rows`, on for CUDA), a call whose
rows repeat one another runs as sglang's request runs it: whole, not deduplicated to fewer rows.

A batched-CFG request whose negative prompt tokenizes like its prompt has the call [uncond; cond] with
two equal rows. sglang's own pipeline computes it at B=2. Before the fix the wrapper ran the one
distinct row at B=1 and copied it, both for the group's rows (`acquire`) and inside sglang's own
pipeline (the reference), so the K/V were those of another call shape than sglang's. A fake language
model whose K/V carry the call's row count shows it, as in test_text_pathway.py. By content (the CPU,
where rows are row independent) running each distinct row once stays.
"""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")

from tests.unit.test_text_pathway import CallDependentLM, pathway, rows  # noqa: E402 - K/V carry the call's rows


def test_a_call_of_equal_rows_is_acquired_and_served_as_sglangs_call_computes_it():
    lm, tp = pathway(keyed=True)
    want = lm.forward(*rows(7, 7))[0][0]  # sglang's [uncond; cond] call, uncond == cond: B=2
    lm.calls.clear()
    held = tp.acquire(*rows(7, 7), types.SimpleNamespace(text_encodes=0))
    assert lm.calls == [2]
    tp.serve(2)
    try:
        got = tp.hook(*rows(7, 7))[0][0]
    finally:
        tp.serving = False
    assert torch.equal(got, want)
    tp.release(held)
    assert not tp.live


@pytest.mark.parametrize("keyed", [True, False])
def test_sglangs_own_calls_through_the_wrapper(keyed):
    """Outside our forwards (sglang's pipeline): by request call the call runs as given; by content each
    distinct row once (row independent there), expanded to the call's rows."""
    lm, tp = pathway(keyed)
    got = tp.hook(*rows(7, 7))[0][0]
    if keyed:
        assert lm.calls == [2] and torch.equal(got, CallDependentLM().forward(*rows(7, 7))[0][0])
    else:
        assert lm.calls == [1] and got.shape[0] == 2
