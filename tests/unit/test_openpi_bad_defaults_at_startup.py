"""A server-wide sampling default the scheduler could never run is a start-up error of the openpi front.

`FrontDefaults` validated the defaults only as wire types (msgspec), while `OpenpiFront.metadata` resolves
them as the scheduler does (`convert.sampling_from_wire`: the embodiment name, the horizon rule). A default
such as `--domain-name bogus` or `--horizon 5` started the front, and then every robot's connection was
closed with 1011 (internal error) before its metadata frame: the front served nobody, and said so only in
its log."""

from __future__ import annotations

import pytest

from candidate_scheduler import convert
from candidate_scheduler.service.openpi import launch, observation

BAD = [({"domain_name": "bogus"}, "domain name"), ({"horizon": 5}, "horizon"), ({"horizon": 0}, "horizon"),
       # a known embodiment without a width of its own: sglang needs raw_action_dim given
       ({"domain_name": "libero"}, "raw action dim")]


@pytest.mark.parametrize("sampling, what", BAD)
def test_a_default_the_metadata_cannot_resolve_is_refused_at_startup(sampling, what):
    with pytest.raises(ValueError, match=what):
        observation.FrontDefaults(sampling=sampling)


@pytest.mark.parametrize("flag", ["--domain-name=bogus", "--horizon=5"])
def test_the_front_command_line_refuses_it_before_serving(flag, capsys):
    args = launch.build_parser().parse_args(["--scheduler-request", "tcp://127.0.0.1:1", flag])
    with pytest.raises(ValueError):
        launch.front_defaults(args)  # main() prints it as "bad openpi default" and exits 2


@pytest.mark.parametrize("sampling", [{}, {"domain_name": "droid_lerobot"},
                                      {"domain_name": "libero", "raw_action_dim": 7},
                                      {"horizon": 8, "raw_action_dim": 7}])
def test_good_defaults_still_start_and_resolve(sampling):
    defaults = observation.FrontDefaults(sampling=sampling)
    # what metadata() computes for every connection: it must not raise
    convert.sampling_from_wire(observation.sampling_msg(defaults.sampling, {}))


# The candidate defaults were checked as wire types too: `--count 0`, `--seed-policy explicit` (no seeds) or a
# count over the scheduler's limit started the front, and the scheduler then refused every call it was sent.
BAD_CANDIDATES = [({"count": 0}, "count"), ({"count": 257}, "count"), ({"seed_policy": "explicit"}, "seeds"),
                  ({"count": 2, "seeds": [1]}, "seeds"), ({"min_count": 2}, "min_count")]


@pytest.mark.parametrize("candidates, what", BAD_CANDIDATES)
def test_a_candidate_default_the_scheduler_would_refuse_is_refused_at_startup(candidates, what):
    with pytest.raises(ValueError, match=what):
        observation.FrontDefaults(candidates=candidates)


def test_the_count_limit_is_the_schedulers():
    from candidate_scheduler import protocol

    assert BAD_CANDIDATES[1][0]["count"] == protocol.MAX_CANDIDATES + 1
    observation.FrontDefaults(candidates={"count": protocol.MAX_CANDIDATES})


@pytest.mark.parametrize("candidates", [{}, {"count": 8, "reducer": "medoid"},
                                        {"count": 2, "seed_policy": "explicit", "seeds": [4, 9]},
                                        # a reducer registered in the scheduler only: the scheduler judges it
                                        {"count": 4, "reducer": "my_plugin_reducer"}])
def test_good_candidate_defaults_still_start(candidates):
    observation.FrontDefaults(candidates=candidates)


def test_an_empty_image_key_is_refused_at_startup():
    """`--openpi-image-key ""` (an unset shell variable) failed every call "no image", while the metadata
    advertised the default keys."""
    with pytest.raises(ValueError, match="image_key"):
        observation.FrontDefaults(image_key="")
    assert observation.FrontDefaults(image_key="observation/wrist_image").image_key == "observation/wrist_image"
