"""Issue 13 (worker side): Cosmos3 candidate groups as a step-level running batch.

Groups join a running batch between two denoise steps, share transformer forwards with whatever is
running (other step counts, other current steps, other seeds, prompts and guidance values), and leave
as soon as they are done or cancelled. Every candidate must stay BITWISE equal to sglang's own
pipeline run alone with that candidate's seed (`sglang_reference`, CPU, bf16), whenever it joined and
whoever shared its forwards.

The driver below calls the adapter's StepAdapter interface (start / step / finish / release) the way
the worker loop does, from one thread, with joins and cancels placed at chosen step boundaries.
"""

from __future__ import annotations

import numpy as np
import pytest

from candidate_scheduler.core import rng
from candidate_scheduler.core.work import CandidateWork, GroupWork, SamplingSpec

pytestmark = pytest.mark.sglang

torch = pytest.importorskip("torch")
pytest.importorskip("sglang.multimodal_gen")

PROMPT = "pick up the red cube"
PROMPT_SAME_LEN = "pick up the big cube"  # the tiny tokenizer is character level
PROMPT_OTHER_LEN = "open the drawer"
assert len(PROMPT) == len(PROMPT_SAME_LEN) != len(PROMPT_OTHER_LEN)
# a negative prompt as long as PROMPT once tokenized: CFG runs batched [uncond; cond]
BATCHED_NEGATIVE = "x" * 274


def sampling(steps: int, guidance: float = 1.0, negative: str | None = None, **kw) -> SamplingSpec:
    return SamplingSpec(height=64, width=64, steps=steps, horizon=16, guidance_scale=guidance,
                        negative_prompt=negative, **kw)


def image(k: int) -> np.ndarray:
    return np.random.default_rng(3000 + k).integers(0, 256, size=(64, 64, 3), dtype=np.uint8)


def group(rid: str, img: np.ndarray, prompt: str, spec: SamplingSpec, seeds, ids=None) -> GroupWork:
    ids = list(range(len(seeds))) if ids is None else list(ids)
    return GroupWork(rid, img, [prompt], spec, [CandidateWork(i, int(s)) for i, s in zip(ids, seeds)])


@pytest.fixture(scope="module")
def adapter(model_dir):
    from candidate_scheduler.worker.cosmos3 import Cosmos3CandidateAdapter

    return Cosmos3CandidateAdapter(model_dir, device="cpu", max_candidates_per_batch=8)


@pytest.fixture(scope="module")
def ref(sglang_reference):
    """sglang's own pipeline alone for one seed, memoised (several tests ask for the same ones)."""
    memo: dict = {}

    def reference(img, prompt, spec, seed):
        key = (img.tobytes(), prompt, spec, int(seed))
        if key not in memo:
            memo[key] = sglang_reference(img, prompt, spec, int(seed))
        return memo[key]

    return reference


class Driver:
    """Runs a batch step by step: `(k, item)` pairs start before batch step k, `cancels[k]` (request ids) are
    released at the boundary before step k. Records the forwards of every step and which groups ran it."""

    def __init__(self, adapter):
        self.adapter = adapter
        self.outputs: dict[str, object] = {}
        self.groups: dict[str, object] = {}
        self.forwards: list[int] = []
        self.members: list[set[str]] = []

    def run(self, *schedule: tuple[int, GroupWork], cancels: dict[int, set[str]] | None = None):
        cancels = cancels or {}
        joins: dict[int, list[GroupWork]] = {}
        for k, item in schedule:
            joins.setdefault(k, []).append(item)
        running, k = [], 0
        while running or any(j >= k for j in joins):
            for rid in cancels.get(k, ()):
                g = next(g for g in running if g.request_id == rid)
                self.adapter.release(g)
                running.remove(g)
                self.outputs[rid] = "cancelled"
            for item in joins.get(k, ()):
                g = self.adapter.start(item)
                self.groups[item.request_id] = g
                running.append(g)
            if running:
                self.members.append({g.request_id for g in running})
                self.forwards.append(self.adapter.step(running))
                for g in [g for g in running if g.done]:
                    running.remove(g)
                    self.outputs[g.request_id] = self.adapter.finish(g)
            k += 1
        return self.outputs


def assert_bitwise(actual, expected, what):
    assert actual.dtype == expected.dtype == np.float32, what
    assert actual.shape == expected.shape, f"{what}: {actual.shape} != {expected.shape}"
    if not np.array_equal(actual, expected):
        diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
        pytest.fail(f"{what}: not bitwise equal (max abs diff {diff.max():.3g}, {int((diff > 0).sum())} differ)")


def assert_matches_reference(ref, out, item: GroupWork, img, prompt):
    assert out.status == "ok", f"{item.request_id}: {out.error}"
    assert out.candidate_ids == [c.candidate_id for c in item.candidates]
    for row, cand in enumerate(item.candidates):
        assert_bitwise(out.actions[row, 0], ref(img, prompt, item.sampling, cand.seed),
                       f"{item.request_id} candidate {cand.candidate_id}")


def assert_no_cohort_caches(adapter):
    """Once every group has left, no UND K/V cache entry of any cohort is left behind."""
    assert not [k for k in adapter.transformer.cached_kv if str(k).startswith("cohort")]
    assert not adapter.text.live


# ---- joins at several step indices; other step counts; one forward for compatible groups ---------------
@pytest.mark.parametrize("join_at", [0, 1, 3])
def test_group_joins_a_running_group_at_step(adapter, ref, join_at):
    img_a, img_b = image(1), image(2)
    a = group("A", img_a, PROMPT, sampling(6), [101, 102])
    b = group("B", img_b, PROMPT_SAME_LEN, sampling(4), [201, 202])
    driver = Driver(adapter)
    with adapter.counting() as counts:
        out = driver.run((0, a), (join_at, b))
    assert_matches_reference(ref, out["A"], a, img_a, PROMPT)
    assert_matches_reference(ref, out["B"], b, img_b, PROMPT_SAME_LEN)
    # every step, even those A and B share (other step counts, other current steps), is ONE forward
    assert driver.forwards == [1] * len(driver.forwards) and counts["forwards"] == len(driver.forwards)
    shared = sum(1 for m in driver.members if m == {"A", "B"})
    assert shared == min(4, 6 - join_at) >= 3
    assert len(driver.forwards) == max(6, join_at + 4)
    ga, gb = driver.groups["A"], driver.groups["B"]
    assert (ga.report.steps_run, gb.report.steps_run) == (6, 4)
    assert (ga.report.transformer_forwards, gb.report.transformer_forwards) == (6, 4)
    assert ga.report.rows == gb.report.rows == 2 and ga.report.condition_s > 0 and ga.report.postprocess_s > 0
    assert ga.report.text_encodes == 1 and ga.report.vae_encodes == 1
    assert_no_cohort_caches(adapter)


def test_co_members_with_other_step_counts_share_every_forward(adapter, ref):
    imgs = {4: image(3), 6: image(4), 9: image(5)}
    items = {n: group(f"S{n}", imgs[n], PROMPT, sampling(n), [300 + n]) for n in imgs}
    driver = Driver(adapter)
    out = driver.run((0, items[9]), (0, items[4]), (2, items[6]))
    for n, item in items.items():
        assert_matches_reference(ref, out[item.request_id], item, imgs[n], PROMPT)
    assert driver.forwards == [1] * 9
    assert [len(m) for m in driver.members] == [2, 2, 3, 3, 2, 2, 2, 2, 1]


# ---- prompts --------------------------------------------------------------------------------------------
def test_prompts_of_equal_length_share_a_forward_unequal_lengths_do_not(adapter, ref):
    img = image(6)
    a = group("A", img, PROMPT, sampling(4), [401])
    same = group("same", img, PROMPT_SAME_LEN, sampling(4), [402])
    other = group("other", img, PROMPT_OTHER_LEN, sampling(4), [403, 404])
    driver = Driver(adapter)
    out = driver.run((0, a), (0, other), (1, same))
    assert_matches_reference(ref, out["A"], a, img, PROMPT)
    assert_matches_reference(ref, out["same"], same, img, PROMPT_SAME_LEN)
    assert_matches_reference(ref, out["other"], other, img, PROMPT_OTHER_LEN)
    # two cohorts while "other" runs beside the equal-length pair, one once it is alone
    assert driver.forwards == [2, 2, 2, 2, 1]


# ---- CFG --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "negative, guidance_a, guidance_b, forwards_per_cfg_step",
    [(None, 2.0, 2.0, 2), (BATCHED_NEGATIVE, 1.5, 3.0, 1), (None, 1.5, 3.0, 2)],
    ids=["serial-2.0", "batched-mixed-1.5-3.0", "serial-mixed-1.5-3.0"],
)
def test_cfg_groups_share_forwards_with_their_own_guidance(adapter, ref, negative, guidance_a, guidance_b,
                                                           forwards_per_cfg_step):
    img_a, img_b, img_c = image(7), image(8), image(9)
    a = group("A", img_a, PROMPT, sampling(4, guidance_a, negative), [501, 502])
    b = group("B", img_b, PROMPT_SAME_LEN, sampling(3, guidance_b, negative), [503])
    plain = group("plain", img_c, PROMPT, sampling(2), [504])  # no CFG: a cohort of its own
    driver = Driver(adapter)
    out = driver.run((0, a), (1, b), (1, plain))
    assert_matches_reference(ref, out["A"], a, img_a, PROMPT)
    assert_matches_reference(ref, out["B"], b, img_b, PROMPT_SAME_LEN)
    assert_matches_reference(ref, out["plain"], plain, img_c, PROMPT)
    f = forwards_per_cfg_step
    assert driver.forwards == [f, f + 1, f + 1, f]
    assert driver.groups["B"].report.transformer_forwards == 3 * f


# ---- a microbatched slice joins ----------------------------------------------------------------------------
def test_microbatched_slice_joins_mid_way(adapter, ref):
    img_a, img_s = image(10), image(11)
    seeds = rng.candidate_seeds(77, 8, "per_candidate")
    a = group("A", img_a, PROMPT, sampling(5), [601])
    part = [3, 4, 5]
    piece = group("G", img_s, PROMPT, sampling(4), [seeds[i] for i in part], ids=part)
    driver = Driver(adapter)
    out = driver.run((0, a), (2, piece))
    assert out["G"].candidate_ids == part
    assert_matches_reference(ref, out["A"], a, img_a, PROMPT)
    assert_matches_reference(ref, out["G"], piece, img_s, PROMPT)
    assert driver.forwards == [1] * 6


# ---- a rollout group joins ------------------------------------------------------------------------------------
def test_rollout_group_joining_mid_way_equals_the_group_alone(adapter, ref):
    img_a, img_r = image(12), image(13)
    a = group("A", img_a, PROMPT, sampling(6), [701])
    roll = group("R", img_r, PROMPT, sampling(4, rollout=True, noise_level=0.7), [702, 703, 704])
    (alone,), _ = adapter.run_batch([roll])
    assert alone.status == "ok", alone.error
    driver = Driver(adapter)
    out = driver.run((0, a), (2, roll))
    assert_matches_reference(ref, out["A"], a, img_a, PROMPT)
    joined = out["R"]
    assert driver.forwards == [1] * 6
    assert sorted(joined.rollout) == sorted(alone.rollout)
    for name in alone.rollout:
        assert joined.rollout[name].tobytes() == alone.rollout[name].tobytes(), name
    for name in alone.rollout_meta:
        assert joined.rollout_meta[name].tobytes() == alone.rollout_meta[name].tobytes(), name
    assert joined.actions.tobytes() == alone.actions.tobytes()
    lp = joined.rollout["log_probs"][:, 0]
    assert lp.shape == (3, 4) and len({lp[k].tobytes() for k in range(3)}) == 3


# ---- a cancelled group leaves; the others finish correctly -------------------------------------------------
def test_cancelled_group_leaves_and_the_others_finish_bitwise(adapter, ref):
    imgs = [image(14), image(15), image(16)]
    a = group("A", imgs[0], PROMPT, sampling(5), [801, 802])
    b = group("B", imgs[1], PROMPT_SAME_LEN, sampling(5), [803])
    c = group("C", imgs[2], PROMPT, sampling(4), [804])
    driver = Driver(adapter)
    out = driver.run((0, a), (0, b), (1, c), cancels={2: {"B"}})
    assert out["B"] == "cancelled"
    assert driver.groups["B"].report.steps_run == 2
    assert_matches_reference(ref, out["A"], a, imgs[0], PROMPT)
    assert_matches_reference(ref, out["C"], c, imgs[2], PROMPT)
    assert driver.members[1] == {"A", "B", "C"} and driver.members[2] == {"A", "C"}
    assert driver.forwards == [1] * 5
    assert_no_cohort_caches(adapter)


def test_a_step_with_two_compatible_groups_runs_one_forward(adapter):
    a = adapter.start(group("A", image(17), PROMPT, sampling(3), [901]))
    b = adapter.start(group("B", image(18), PROMPT_SAME_LEN, sampling(5, guidance=1.0), [902, 903]))
    try:
        with adapter.counting() as counts:
            assert adapter.step([a, b]) == 1
        assert counts["forwards"] == 1 and counts["text"] == 0  # K/V assembled from what they computed
        assert (a.step_index, b.step_index) == (1, 1)
        with adapter.counting() as counts:
            assert adapter.step([b]) == 1  # A sits this step out: B alone, its own cohort
            assert adapter.step([a, b]) == 1
        assert counts["forwards"] == 2 and (a.step_index, b.step_index) == (2, 3)
    finally:
        adapter.release(a)
        adapter.release(b)
    assert_no_cohort_caches(adapter)


class RecordingPrecisionController:
    """Stands in for sglang's FP8 StepMixedPrecisionController: records the step it is set to."""

    def __init__(self):
        self.calls: list[tuple[int, int]] = []

    def set_step(self, step_index: int, num_steps: int) -> None:
        self.calls.append((step_index, num_steps))

    def reset(self) -> None:
        pass


def test_with_a_step_precision_controller_only_groups_at_the_same_step_share(adapter, ref, monkeypatch):
    controller = RecordingPrecisionController()
    monkeypatch.setattr(adapter.transformer, "step_precision_controller", controller)
    img_a, img_b = image(19), image(20)
    a = group("A", img_a, PROMPT, sampling(4), [951])
    b = group("B", img_b, PROMPT_SAME_LEN, sampling(4), [952])
    c = group("C", img_b, PROMPT, sampling(3), [953])
    driver = Driver(adapter)
    out = driver.run((0, a), (0, b), (1, c))
    assert_matches_reference(ref, out["A"], a, img_a, PROMPT)
    assert_matches_reference(ref, out["B"], b, img_b, PROMPT_SAME_LEN)
    assert_matches_reference(ref, out["C"], c, img_b, PROMPT)
    # A and B walk in step and share; C (joined a step later) is one step behind: a forward of its own
    assert driver.forwards == [1, 2, 2, 2]
    # each forward selected its own cohort's step (and step count) before it ran
    assert controller.calls == [(0, 4), (1, 4), (0, 3), (2, 4), (1, 3), (3, 4), (2, 3)]


# ---- groups in lockstep step their solvers together ---------------------------------------------------------
class SolverCalls:
    """Counts FlowUniPC `step` calls, and the rows each stepped."""

    def __init__(self, monkeypatch, scheduler):
        self.rows: list[int] = []
        cls = type(scheduler)
        original = cls.step

        def step(this, model_output, *args, **kwargs):
            self.rows.append(int(model_output.shape[0]))
            return original(this, model_output, *args, **kwargs)

        monkeypatch.setattr(cls, "step", step)


def test_groups_in_lockstep_step_their_solvers_once_and_stay_bitwise(adapter, ref, monkeypatch):
    imgs = [image(21), image(22), image(23), image(24)]
    a = group("A", imgs[0], PROMPT, sampling(4), [961, 962])
    b = group("B", imgs[1], PROMPT_SAME_LEN, sampling(4), [963])
    c = group("C", imgs[2], PROMPT, sampling(4, 2.0), [964])  # serial CFG: a cohort of its own, same schedule
    late = group("L", imgs[3], PROMPT, sampling(4), [965])  # same schedule, one step behind: its own solvers
    calls = SolverCalls(monkeypatch, adapter.timestep_stage.scheduler)
    driver = Driver(adapter)
    out = driver.run((0, a), (0, b), (0, c), (1, late))
    stepped = list(calls.rows)  # before the references run sglang's own solvers
    for item, img, prompt in ((a, imgs[0], PROMPT), (b, imgs[1], PROMPT_SAME_LEN), (c, imgs[2], PROMPT),
                              (late, imgs[3], PROMPT)):
        assert_matches_reference(ref, out[item.request_id], item, img, prompt)
    # every step: one video solver step over the 4 lockstep rows of A, B and C (C shares it although its
    # forward is another cohort's), the late group's own from step 1 on, then the same for the actions
    assert stepped == [4, 4] + [4, 1, 4, 1] * 3 + [1, 1]
    assert_no_cohort_caches(adapter)


def test_solver_sharing_on_and_off_give_the_same_bits_with_a_rollout_in_lockstep(adapter, monkeypatch):
    img_a, img_r = image(25), image(26)
    items = [group("A", img_a, PROMPT, sampling(3), [971]),
             group("R", img_r, PROMPT, sampling(3, rollout=True, noise_level=0.7), [972, 973])]
    results = {}
    for share in (False, True):
        monkeypatch.setattr(adapter, "share_solvers", share)
        calls = SolverCalls(monkeypatch, adapter.timestep_stage.scheduler)
        results[share] = Driver(adapter).run(*[(0, it) for it in items])
        # the rollout's action step is its SDE step (own noise streams): only the video solvers are shared
        assert calls.rows == ([3, 1] * 3 if share else [1, 2, 1] * 3)
    for rid in ("A", "R"):
        assert results[True][rid].actions.tobytes() == results[False][rid].actions.tobytes(), rid
    for name, arr in results[False]["R"].rollout.items():
        assert results[True]["R"].rollout[name].tobytes() == arr.tobytes(), name


# ---- starts on the conditioning thread while the compute thread steps ----------------------------------
def test_groups_started_on_another_thread_while_others_step_equal_sglang(adapter, ref):
    """The worker's conditioning thread (worker/preparing.py): `start` runs while `step` runs on another
    thread. New observations and a new prompt (the VAE encode and the text pathway both run beside the
    forwards); every candidate of every group is still bitwise sglang's own pipeline alone."""
    import threading

    from candidate_scheduler.bench.conditioning_overlap import measure

    img_long, imgs = image(40), [image(41), image(42)]
    long = group("long", img_long, PROMPT, sampling(40), [401, 402])
    joiners = [group(f"J{k}", imgs[k], PROMPT_OTHER_LEN, sampling(6), [411 + k, 421 + k]) for k in range(2)]
    running = [adapter.start(long)]
    started: list = []
    side = threading.Thread(target=lambda: started.extend(adapter.start(j) for j in joiners), name="conditioning")
    side.start()
    steps_beside = 0
    while side.is_alive() and not running[0].done:
        adapter.step(running)
        steps_beside += 1
    side.join()
    assert steps_beside > 0 and len(started) == 2  # the long group stepped while both joiners started
    outputs = {}
    running += started
    while running:
        adapter.step(running)
        for g in [g for g in running if g.done]:
            running.remove(g)
            outputs[g.request_id] = adapter.finish(g)
    assert_matches_reference(ref, outputs["long"], long, img_long, PROMPT)
    for k, j in enumerate(joiners):
        assert_matches_reference(ref, outputs[j.request_id], j, imgs[k], PROMPT_OTHER_LEN)
    assert_no_cohort_caches(adapter)
    # the benchmark's measurement of the same overlap leaves nothing behind either
    assert measure(adapter, n=1, seconds=0.3)["steps_beside"] > 0
    assert_no_cohort_caches(adapter)


# ---- one candidate a transformer call (`call_rows`, the CUDA default) ----------------------------------------
@pytest.mark.parametrize("negative", [None, BATCHED_NEGATIVE], ids=["serial", "batched"])
def test_one_candidate_a_call_through_joins_and_a_cancel(adapter, ref, negative):
    """Groups join a running batch and one is cancelled while every transformer call carries one
    candidate: each stays bitwise sglang alone, each step runs one call per row of each cohort, and
    every span's UND K/V leaves with its cohort."""
    img_a, img_b, img_c = image(20), image(21), image(22)
    a = group("A", img_a, PROMPT, sampling(4, 2.0, negative), [601, 602])
    b = group("B", img_b, PROMPT_SAME_LEN, sampling(3, 2.0, negative), [603])
    gone = group("gone", img_c, PROMPT, sampling(4, 2.0, negative), [604, 605])
    per_row = 2 if negative is None else 1  # serial CFG: a cond and an uncond call per row
    driver = Driver(adapter)
    with adapter.with_call_rows(1), adapter.counting() as calls:
        out = driver.run((0, a), (0, gone), (1, b), cancels={2: {"gone"}})
    assert_matches_reference(ref, out["A"], a, img_a, PROMPT)
    assert_matches_reference(ref, out["B"], b, img_b, PROMPT_SAME_LEN)
    assert out["gone"] == "cancelled"
    # one cohort's forward a step (per CFG branch), each run as one call per candidate row
    assert driver.forwards == [per_row] * 4
    rows = [2 + 2, 2 + 2 + 1, 2 + 1, 2 + 1]  # A and gone; B joins at step 1; gone leaves at 2
    assert calls["forwards"] == per_row * sum(rows)
    assert driver.groups["B"].report.transformer_forwards == 3 * per_row
    assert_no_cohort_caches(adapter)
