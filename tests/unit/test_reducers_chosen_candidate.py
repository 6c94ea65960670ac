"""A selection reducer's chosen candidate reaches the reply as a plain int, whatever integer type the
model reducer returned; anything else is refused as a bad reducer output."""

import msgspec
import numpy as np
import pytest

from candidate_scheduler import protocol
from candidate_scheduler.core import reducers
from candidate_scheduler.core.errors import CandidateContractError

CANDS = np.array([[3.0], [1.0], [2.0]])


@pytest.fixture
def registered():
    names = []

    def register(name, chosen):
        reducers.register_reducer(name, lambda s: reducers.Reduction(s[1].copy(), chosen))
        names.append(name)
        return name

    yield register
    for name in names:
        reducers.unregister_reducer(name)


def test_a_numpy_argmin_is_served_as_an_int_the_wire_can_carry(registered):
    name = registered("pick_np_test", np.argmin(CANDS[:, 0]))
    r = reducers.reduce_full(name, CANDS)
    assert type(r.chosen_candidate) is int and r.chosen_candidate == 1
    wire = msgspec.msgpack.encode(protocol.GroupResult(request_id="r", status="done", chosen_candidate=r.chosen_candidate))
    assert msgspec.msgpack.decode(wire, type=protocol.GroupResult).chosen_candidate == 1


@pytest.mark.parametrize("chosen", [1.0, True, np.bool_(True), "1"])
def test_a_chosen_candidate_that_is_no_integer_is_refused(registered, chosen):
    name = registered("pick_bad_test", chosen)
    with pytest.raises(CandidateContractError) as exc:
        reducers.reduce_full(name, CANDS)
    assert exc.value.code == "bad_reducer_output"
