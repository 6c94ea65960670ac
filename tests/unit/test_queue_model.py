"""The deadline benchmark's queue model against the losses queueing theory gives in closed form."""

import pytest

from candidate_scheduler.bench.queue_model import loss


@pytest.mark.parametrize("rho", [0.5, 1.0, 2.0])
def test_one_place_loses_rho_over_one_plus_rho(rho):
    # M/G/1/1 (Erlang's loss formula, any service distribution): rho / (1 + rho)
    assert loss(rho, 1.0, 1, arrivals=100_000) == pytest.approx(rho / (1 + rho), abs=0.01)


def test_more_room_loses_less_and_overload_loses_at_least_the_excess():
    assert loss(1.5, 1.0, 3) < loss(1.5, 1.0, 2) < loss(1.5, 1.0, 1)
    # a server that is never idle under overload still refuses 1 - 1/rho of the arrivals, or more
    assert loss(2.0, 1.0, 3) >= 0.5 - 0.01
