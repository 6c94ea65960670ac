"""Seed policies and generator snapshots."""


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from candidate_scheduler.core import rng
from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.spec import SeedPolicy

SETTINGS = settings(max_examples=60, deadline=None)
seeds64 = st.integers(min_value=0, max_value=2**64 - 1)
seeds_moderate = st.integers(min_value=0, max_value=2**64 - 1 - 1000)


def test_splitmix64_known_values():
    # Reference outputs of the standard splitmix64 generator seeded with 0 (state advances by the
    # golden gamma each call): 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4.
    assert rng.splitmix64(0) == 0xE220A8397B1DCDAF
    assert rng.splitmix64(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4


@SETTINGS
@given(seeds64)
def test_splitmix64_is_64_bit(x):
    assert 0 <= rng.splitmix64(x) < 2**64


@SETTINGS
@given(seeds64)
def test_count_one_is_the_base_seed(base):
    assert rng.candidate_seeds(base, 1, "per_candidate") == (base,)
    assert rng.candidate_seeds(base, 1, SeedPolicy.PER_CANDIDATE) == (base,)
    assert rng.candidate_seeds(base, 1, "offset") == (base,)


@SETTINGS
@given(seeds_moderate, st.integers(min_value=1, max_value=64))
def test_offset_matches_sglang_seed_plus_i(base, count):
    # sglang's request_utils.normalize_output_seeds: output i of num_outputs_per_prompt gets seed + i.
    assert rng.candidate_seeds(base, count, SeedPolicy.OFFSET) == tuple(base + i for i in range(count))


@SETTINGS
@given(seeds64, st.integers(min_value=2, max_value=64))
def test_per_candidate_seeds_are_distinct_and_in_range(base, count):
    seeds = rng.candidate_seeds(base, count)
    assert seeds[0] == base
    assert len(set(seeds)) == count
    assert all(0 <= s < rng.DERIVED_SEED_LIMIT for s in seeds[1:])


@SETTINGS
@given(seeds64, st.integers(min_value=1, max_value=300))
def test_group_seeds_are_each_candidates_seed(base, count):
    """candidate_seeds checks the base once and mixes each index from a table (up to 256 and past it):
    the same seeds as asking candidate_seed for each candidate, the formula the workers' parity rests on."""
    assert rng.candidate_seeds(base, count) == tuple(rng.candidate_seed(base, i) for i in range(count))
    assert rng.candidate_seeds(base, count) == tuple(
        base if i == 0 else rng.splitmix64(base ^ rng.splitmix64(i)) >> 1 for i in range(count))


@SETTINGS
@given(st.integers(min_value=0, max_value=2**64 - 2))
def test_consecutive_base_seeds_never_share_streams(base):
    # Under `offset`, base b's candidate 1 IS base b+1's candidate 0; per_candidate must not do that.
    a = set(rng.candidate_seeds(base, 65))
    b = set(rng.candidate_seeds(base + 1, 65))
    assert not a & b


def test_offset_does_share_streams_across_consecutive_bases():
    # The reason per_candidate exists: this overlap is what it avoids.
    assert set(rng.candidate_seeds(7, 4, "offset")) & set(rng.candidate_seeds(8, 4, "offset"))


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=0, max_value=2**64 - 1 - 256))
def test_derived_seeds_avoid_index0_seeds_of_nearby_bases(start):
    # Every base in a window of 256 consecutive seeds, candidates 1..16: no derived seed equals any
    # base in the window (each base is some request's candidate 0), and no two derived seeds collide.
    bases = range(start, start + 256)
    derived = [s for b in bases for s in rng.candidate_seeds(b, 17)[1:]]
    assert not set(derived) & set(bases)
    assert len(set(derived)) == len(derived)


def test_small_bases_are_disjoint_exhaustively():
    # The common case (seeds 0..2047, counts up to 64): all derived seeds are globally unique.
    derived = [s for b in range(2048) for s in rng.candidate_seeds(b, 64)[1:]]
    assert len(set(derived)) == len(derived)
    assert not set(derived) & set(range(2048))


@SETTINGS
@given(st.lists(seeds64, min_size=1, max_size=16), seeds64)
def test_explicit_policy_uses_given_seeds(seeds, base):
    assert rng.candidate_seeds(base, len(seeds), "explicit", seeds) == tuple(seeds)


@pytest.mark.parametrize(
    "args, field, code",
    [
        ((-1, 2, "per_candidate"), "seed", "invalid_seed"),
        ((2**64, 2, "per_candidate"), "seed", "invalid_seed"),
        ((True, 2, "per_candidate"), "seed", "invalid_seed"),
        ((1, 0, "per_candidate"), "count", "invalid_count"),
        ((1, 2, "sometimes"), "seed_policy", "seed_policy"),
        ((1, 2, "explicit"), "seeds", "seeds_length"),
        ((2**64 - 1, 2, "offset"), "seed+1", "invalid_seed"),
    ],
)
def test_bad_seed_inputs_name_the_field(args, field, code):
    with pytest.raises(CandidateContractError) as info:
        rng.candidate_seeds(*args)
    assert info.value.field == field
    assert info.value.code == code
    assert field in str(info.value)


def test_explicit_seed_out_of_range_names_its_index():
    with pytest.raises(CandidateContractError) as info:
        rng.candidate_seeds(0, 2, "explicit", [1, -5])
    assert info.value.field == "seeds[1]" and "-5" in str(info.value)
