"""Issue 3, "Done means" 1-6: the Cosmos3 candidate adapter on sglang 0.5.23's real Cosmos3 code.

Every candidate is compared against sglang's OWN `Cosmos3Pipeline` run alone with that candidate's
seed (`adapter.reference_actions`), on the tiny local checkpoint, CPU, default bf16 path.
One adapter (one sglang import, one loaded pipeline) serves the whole module.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["SGLANG_DISABLE_COSMOS3_GUARDRAILS"] = "1"

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from candidate_scheduler import rng  # noqa: E402
from candidate_scheduler.work import CandidateWork, GroupWork, SamplingSpec  # noqa: E402

pytestmark = pytest.mark.sglang

torch = pytest.importorskip("torch")
pytest.importorskip("sglang.multimodal_gen")

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINT = ROOT / ".cache" / "tiny-cosmos3"

STEPS = 4
SAMPLING = SamplingSpec(height=64, width=64, steps=STEPS, horizon=16, guidance_scale=1.0)
SAMPLING_CFG = SamplingSpec(height=64, width=64, steps=STEPS, horizon=16, guidance_scale=2.0)
PROMPT = "pick up the red cube"
# The tiny tokenizer is character level: equal character counts give equal tokenized lengths.
PROMPT_SAME_LEN = "pick up the big cube"
PROMPT_OTHER_LEN = "open the drawer"
assert len(PROMPT) == len(PROMPT_SAME_LEN) != len(PROMPT_OTHER_LEN)


# ---- fixtures (kept in this file on purpose: conftest.py files belong to others) -----------------
@pytest.fixture(scope="module")
def adapter():
    from workers.cosmos3 import Cosmos3CandidateAdapter
    from workers.tiny_checkpoint import ensure_checkpoint

    model_dir = ensure_checkpoint(CHECKPOINT)
    return Cosmos3CandidateAdapter(model_dir, device="cpu", max_candidates_per_batch=8)


@pytest.fixture(scope="module")
def reference(adapter):
    """reference(image, prompt, sampling, seed) -> float32 [horizon, raw_dim] from sglang's own
    pipeline, memoised per module (the same reference is asked for by several tests)."""
    memo: dict = {}

    def ref(image: np.ndarray, prompt: str, sampling: SamplingSpec, seed: int) -> np.ndarray:
        key = (image.tobytes(), image.shape, prompt, sampling, int(seed))
        if key not in memo:
            memo[key] = adapter.reference_actions(image, prompt, sampling, int(seed))
        return memo[key]

    return ref


def image(k: int) -> np.ndarray:
    """A deterministic 64x64 RGB uint8 observation; different k give different images."""
    return np.random.default_rng(1000 + k).integers(0, 256, size=(64, 64, 3), dtype=np.uint8)


def seeds_for(base: int, n: int) -> tuple[int, ...]:
    return rng.candidate_seeds(base, n, "per_candidate")


def group(request_id, images, prompts, seeds, sampling=SAMPLING, ids=None) -> GroupWork:
    ids = list(range(len(seeds))) if ids is None else list(ids)
    return GroupWork(
        request_id=request_id,
        images=images,
        prompts=prompts,
        sampling=sampling,
        candidates=[CandidateWork(candidate_id=i, seed=int(s)) for i, s in zip(ids, seeds)],
    )


def assert_bitwise(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert actual.dtype == expected.dtype == np.float32, what
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if not np.array_equal(actual, expected):
        diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
        pytest.fail(f"{what}: not bitwise equal (max abs diff {diff.max():.3g}, {int((diff > 0).sum())} elements differ)")


def run_ok(adapter, items, **kwargs):
    outputs, report = adapter.run_batch(items, **kwargs)
    for item, out in zip(items, outputs):
        assert out.request_id == item.request_id
        assert out.status == "ok", f"{item.request_id}: {out.status} {out.error_code} {out.error}"
    return outputs, report


# ---- 1. count=1 == sglang's own pipeline -------------------------------------------------------
def test_count_one_is_bitwise_sglang_pipeline(adapter, reference):
    img, seed = image(0), 1234
    (out,), report = run_ok(adapter, [group("one", img, [PROMPT], [seed])])
    assert out.candidate_ids == [0]
    assert out.actions.dtype == np.float32
    assert out.actions.shape == (1, 1, 16, 7)
    expected = reference(img, PROMPT, SAMPLING, seed)
    assert np.isfinite(expected).all()
    assert_bitwise(out.actions[0, 0], expected, "count=1 vs sglang pipeline")
    # The comparison can fail: another seed gives other actions.
    assert not np.array_equal(out.actions[0, 0], reference(img, PROMPT, SAMPLING, seed + 1))
    assert report.rows == 1 and report.steps_run == STEPS and report.transformer_forwards == STEPS


# ---- 2. N candidates in one batch == N sglang runs, per candidate, bitwise ---------------------
@pytest.mark.parametrize(
    "n, sampling",
    [(2, SAMPLING), (4, SAMPLING), (8, SAMPLING), (4, SAMPLING_CFG)],
    ids=["N2-g1", "N4-g1", "N8-g1", "N4-g2cfg"],
)
def test_batched_candidates_bitwise_equal_sglang_per_seed(adapter, reference, n, sampling):
    img, seeds = image(1), seeds_for(77, n)
    assert len(set(seeds)) == n
    (out,), report = run_ok(adapter, [group(f"n{n}", img, PROMPT, seeds, sampling)])
    assert out.candidate_ids == list(range(n))
    assert out.actions.shape == (n, 1, 16, 7)
    for c, s in enumerate(seeds):
        assert_bitwise(out.actions[c, 0], reference(img, PROMPT, sampling, s), f"N={n} g={sampling.guidance_scale} candidate {c}")
    # candidates really are different samples
    assert len({out.actions[c].tobytes() for c in range(n)}) == n
    assert report.rows == n and report.steps_run == STEPS
    assert report.transformer_forwards == STEPS  # one forward per step for the whole physical batch


# ---- 3. microbatched == atomic; snapshots ------------------------------------------------------
def test_microbatched_3_3_2_equals_atomic_8(adapter):
    img, seeds = image(2), seeds_for(2024, 8)
    (atomic,), _ = run_ok(adapter, [group("g", img, PROMPT, seeds)])
    pieces = {}
    for part in ([0, 1, 2], [3, 4, 5], [6, 7]):
        (out,), report = run_ok(adapter, [group("g", img, PROMPT, [seeds[i] for i in part], ids=part)])
        assert out.candidate_ids == part
        assert report.rows == len(part)
        for row, cid in enumerate(part):
            pieces[cid] = out.actions[row]
    assert sorted(pieces) == list(range(8))
    for cid in range(8):
        assert_bitwise(pieces[cid], atomic.actions[cid], f"microbatch candidate {cid}")


def test_snapshot_slice_equals_seed_slice_and_drawn_snapshot_differs(adapter):
    img, seeds = image(2), seeds_for(2024, 8)
    part = [3, 4, 5]
    (by_seed,), _ = run_ok(adapter, [group("g", img, PROMPT, [seeds[i] for i in part], ids=part)])

    # Snapshots win over seeds: give a wrong seed so equality proves the snapshot was used.
    snap_items = GroupWork("g", img, [PROMPT], SAMPLING, [
        CandidateWork(candidate_id=i, seed=0, snapshot=rng.fresh_snapshot(seeds[i])) for i in part
    ])
    (by_snapshot,), _ = run_ok(adapter, [snap_items])
    assert by_snapshot.candidate_ids == part
    assert_bitwise(by_snapshot.actions, by_seed.actions, "fresh snapshots vs seeds")

    # A snapshot of a generator that has already drawn is a different start: results differ.
    drawn = []
    for i in part:
        g = torch.Generator().manual_seed(seeds[i])
        torch.randn(1, generator=g)
        drawn.append(CandidateWork(candidate_id=i, seed=seeds[i], snapshot=rng.snapshot(g)))
    (by_drawn,), _ = run_ok(adapter, [GroupWork("g", img, [PROMPT], SAMPLING, drawn)])
    for row in range(len(part)):
        assert not np.array_equal(by_drawn.actions[row], by_seed.actions[row]), f"row {row}"


# ---- 4. conditioning once per group; one forward per step per physical batch --------------------
def test_conditioning_once_and_one_forward_per_step(adapter, reference):
    img, n = image(3), 8
    seeds = seeds_for(31, n)
    with adapter.counting() as batched:
        (out,), report = run_ok(adapter, [group("cond", img, PROMPT, seeds)])
    assert batched == {"forwards": STEPS, "text": 1, "vae": 1}, batched
    assert report.transformer_forwards == STEPS and report.steps_run == STEPS
    assert report.text_encodes == 1 and report.vae_encodes == 1 and report.rows == n

    with adapter.counting() as sequential:
        refs = [adapter.reference_actions(img, PROMPT, SAMPLING, s) for s in seeds]
    assert sequential == {"forwards": n * STEPS, "text": n, "vae": n}, sequential
    for c in range(n):
        assert_bitwise(out.actions[c, 0], refs[c], f"candidate {c}")


# ---- 5. bad observation batches -----------------------------------------------------------------
BAD_GROUPS = [
    ("float-image", lambda: image(4).astype(np.float32) / 255.0, PROMPT, "bad_dtype", "uint8"),
    ("hw-image", lambda: image(4)[:, :, 0], PROMPT, "bad_shape", "[H, W, 3]"),
    ("hw4-image", lambda: np.concatenate([image(4), image(4)[:, :, :1]], axis=2), PROMPT, "bad_shape", "[H, W, 3]"),
    ("empty-list", lambda: [], PROMPT, "empty_observations", "empty"),
    ("empty-array", lambda: np.zeros((0, 64, 64, 3), np.uint8), PROMPT, "empty_observations", "empty"),
    ("3-images-2-prompts", lambda: [image(4), image(5), image(6)], [PROMPT, PROMPT], "prompt_count_mismatch", "2 prompt"),
    ("prompt-lengths", lambda: [image(4), image(5)], [PROMPT, PROMPT_OTHER_LEN], "prompt_length_mismatch", "same length"),
]


def test_bad_observations_error_and_valid_group_still_runs(adapter, reference):
    img, seeds = image(7), seeds_for(5, 2)
    items = [group(name, make(), prompts, [11]) for name, make, prompts, _, _ in BAD_GROUPS]
    items.insert(3, group("valid", img, PROMPT, seeds))  # a valid group in the middle of the same call
    outputs, report = adapter.run_batch(items)
    assert [o.request_id for o in outputs] == [it.request_id for it in items]
    by_id = {o.request_id: o for o in outputs}
    for name, _, _, code, needle in BAD_GROUPS:
        out = by_id[name]
        assert out.status == "error", name
        assert out.error_code == code, f"{name}: {out.error_code} ({out.error})"
        assert needle in out.error, f"{name}: message {out.error!r} lacks {needle!r}"
        assert out.actions is None and out.candidate_ids == []
    valid = by_id["valid"]
    assert valid.status == "ok", valid.error
    for c, s in enumerate(seeds):
        assert_bitwise(valid.actions[c, 0], reference(img, PROMPT, SAMPLING, s), f"valid candidate {c}")
    assert report.rows == 2 and report.steps_run == STEPS

    # The adapter keeps working afterwards.
    (after,), _ = run_ok(adapter, [group("after", img, PROMPT, seeds)])
    assert_bitwise(after.actions, valid.actions, "run after errors")


def test_group_without_candidates_is_an_error(adapter):
    item = GroupWork("none", image(0), [PROMPT], SAMPLING, [])
    (out,), report = adapter.run_batch([item])
    assert out.status == "error" and out.error_code == "no_candidates"
    assert report.rows == 0 and report.transformer_forwards == 0


# ---- 6. in-request observation batching (B x N) -----------------------------------------------
@pytest.mark.parametrize("as_array", [False, True], ids=["list", "BHWC-array"])
def test_observation_batch_b2_n3(adapter, reference, as_array):
    imgs = [image(8), image(9)]
    seeds = seeds_for(99, 3)
    images = np.stack(imgs) if as_array else imgs
    (out,), report = run_ok(adapter, [group("obs", images, PROMPT, seeds)])  # scalar prompt broadcasts
    assert out.candidate_ids == [0, 1, 2]
    assert out.actions.shape == (3, 2, 16, 7)
    for c, s in enumerate(seeds):
        for b, img in enumerate(imgs):
            assert_bitwise(out.actions[c, b], reference(img, PROMPT, SAMPLING, s), f"candidate {c} observation {b}")
    assert not np.array_equal(out.actions[0, 0], out.actions[0, 1])
    assert report.rows == 6 and report.vae_encodes == 2 and report.transformer_forwards == STEPS


def test_observation_batch_prompt_list_pairs_one_to_one(adapter, reference):
    imgs = [image(8), image(9)]
    prompts = [PROMPT, PROMPT_SAME_LEN]
    seeds = seeds_for(3, 2)
    (out,), _ = run_ok(adapter, [group("pairs", imgs, prompts, seeds)])
    for c, s in enumerate(seeds):
        for b in range(2):
            assert_bitwise(out.actions[c, b], reference(imgs[b], prompts[b], SAMPLING, s), f"candidate {c} obs {b}")


# ---- 7. cooperative cancellation at step boundaries -------------------------------------------
def test_cancel_one_group_mid_denoise_other_group_unaffected(adapter, reference):
    img_a, img_b = image(10), image(11)
    seeds_a, seeds_b = seeds_for(1000, 3), seeds_for(2000, 2)
    items = [group("A", img_a, PROMPT, seeds_a), group("B", img_b, PROMPT, seeds_b)]
    state = {"step": None, "seen": []}

    def on_step(i):
        state["step"] = i
        state["seen"].append(i)

    def should_drop():
        return {"A"} if state["step"] is not None and state["step"] >= 2 else set()

    with adapter.counting() as counts:
        (out_a, out_b), report = adapter.run_batch(items, should_drop=should_drop, on_step=on_step)
    assert state["seen"] == list(range(STEPS))
    assert out_a.status == "cancelled" and out_a.actions is None
    assert out_b.status == "ok", out_b.error
    assert out_b.candidate_ids == [0, 1]
    for c, s in enumerate(seeds_b):
        assert_bitwise(out_b.actions[c, 0], reference(img_b, PROMPT, SAMPLING, s), f"B candidate {c} after A left")
    assert report.steps_run == STEPS
    assert report.rows == 5 and report.transformer_forwards == STEPS == counts["forwards"]


def test_cancel_every_group_stops_the_loop_early(adapter):
    items = [group("A", image(10), PROMPT, seeds_for(1000, 3)), group("B", image(11), PROMPT, seeds_for(2000, 2))]
    state = {"step": None}

    def on_step(i):
        state["step"] = i

    def should_drop():
        return {"A", "B"} if state["step"] is not None and state["step"] >= 1 else ()

    outputs, report = adapter.run_batch(items, should_drop=should_drop, on_step=on_step)
    assert [o.status for o in outputs] == ["cancelled", "cancelled"]
    assert all(o.actions is None for o in outputs)
    assert report.steps_run == 1 < STEPS
    assert report.transformer_forwards == 1

    # and the adapter runs normally afterwards
    run_ok(adapter, [group("again", image(10), PROMPT, seeds_for(1000, 1))])


# ---- 8. co-batched groups with different prompts (equal tokenized length) ----------------------
@pytest.mark.parametrize("sampling", [SAMPLING, SAMPLING_CFG], ids=["g1", "g2cfg"])
def test_cobatched_groups_different_prompts_match_own_references(adapter, reference, sampling):
    equivalence = adapter.capability_dict()["equivalence"]
    assert equivalence["atol"] == 0.0 and equivalence["bitwise_on_cpu"]
    img_a, img_b = image(12), image(13)
    seeds_a, seeds_b = seeds_for(7, 3), seeds_for(8, 2)
    items = [group("A", img_a, PROMPT, seeds_a, sampling), group("B", img_b, PROMPT_SAME_LEN, seeds_b, sampling)]
    for order in (items, items[::-1]):  # candidate results do not depend on what shares the batch
        outputs, report = run_ok(adapter, order)
        assert report.transformer_forwards == STEPS and report.rows == 5  # one shared physical batch
        out = {o.request_id: o for o in outputs}
        for c, s in enumerate(seeds_a):
            assert_bitwise(out["A"].actions[c, 0], reference(img_a, PROMPT, sampling, s), f"A candidate {c}")
        for c, s in enumerate(seeds_b):
            assert_bitwise(out["B"].actions[c, 0], reference(img_b, PROMPT_SAME_LEN, sampling, s), f"B candidate {c}")


def test_groups_with_different_text_lengths_run_as_separate_batches(adapter, reference):
    img = image(14)
    items = [group("A", img, PROMPT, seeds_for(7, 2)), group("B", img, PROMPT_OTHER_LEN, seeds_for(8, 2))]
    outputs, report = run_ok(adapter, items)
    assert report.transformer_forwards == 2 * STEPS  # two physical batches, one after the other
    for item, out in zip(items, outputs):
        for c, cand in enumerate(item.candidates):
            assert_bitwise(out.actions[c, 0], reference(img, item.prompts, SAMPLING, cand.seed), f"{item.request_id} {c}")
