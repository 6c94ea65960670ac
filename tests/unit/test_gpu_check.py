"""make gpu-check's pure parts: the step budget, the distribution coverage, the headline ratios and
the report, and the stand-ins the lent machine imports instead of sgl_kernel and a broken sphinx."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from candidate_scheduler.bench.gpu_phases import choose_steps, step_cost
from candidate_scheduler.bench.gpu_rehearsal import SCRIPTS, normalise, read_names, uncovered
from candidate_scheduler.bench.gpu_report import headline, markdown

NS = (1, 2, 4, 8, 10)


@pytest.mark.parametrize(("per_step", "budget", "most", "expected"), [
    (0.05, 1000.0, 35, 35),   # room for all: the most
    (0.05, 100.0, 35, 26),    # 100 s / (0.05 s x 25 candidates x 3 methods) = 26.7
    (0.05, 10.0, 35, 2),      # never below the least
    (0.0, 10.0, 35, 35),      # a warm-up too quick to time: the most
])
def test_choose_steps_fits_the_budget(per_step, budget, most, expected):
    assert choose_steps(per_step, budget, NS, 3, most) == expected


def test_a_steps_cost_is_the_difference_of_two_runs_not_a_short_runs_average():
    # the second loan's (a) warm-up: 2 steps in 0.285 s, of which 0.128 s is paid whatever the steps
    per_step, fixed = step_cost(0.2849, 0.4421, 2, 4)
    assert per_step == pytest.approx(0.0786) and fixed == pytest.approx(0.1277, abs=1e-3)
    # with that, the phase's 125 s fit 20 steps (15 runs each pay the fixed part); a short run's
    # average (0.142 s a step) would have fitted 11
    assert choose_steps(per_step, 125.0, NS, 3, 35, fixed_s=fixed) == 20
    assert choose_steps(0.2849 / 2, 125.0, NS, 3, 35) == 11
    assert step_cost(0.30, 0.29, 2, 4) == (0.15, 0.0)  # noise: the longer run was faster; the average stands


def test_uncovered_names_what_the_lent_machine_lacks():
    image = {normalise(n) for n in ("numpy", "Jinja2", "typing_extensions")}
    carried = {normalise(n) for n in ("truststore",)}
    imported = {"numpy", "jinja2", "typing-extensions", "truststore", "torch", "nvidia-cublas", "cuda-bindings",
                "sglang", "candidate-scheduler", "ipython", "gguf", "imageio_ffmpeg", "sgl-kernel"}
    # imageio_ffmpeg and sgl_kernel have stand-ins in scripts/gpu_shims
    assert uncovered(imported, image, carried) == ["gguf", "ipython"]


def test_the_imageio_ffmpeg_stand_in_imports_and_says_why_it_cannot_run():
    proc = _run_with_shims("""
        import imageio_ffmpeg
        assert imageio_ffmpeg.STAND_IN
        try:
            imageio_ffmpeg.get_ffmpeg_exe()
        except RuntimeError as exc:
            print("refused:", exc)
    """)
    assert proc.returncode == 0 and "refused: imageio_ffmpeg stand-in" in proc.stdout, proc.stderr


def test_the_lists_are_read_without_comments():
    carried = read_names(SCRIPTS / "gpu_wheels.txt")
    image = read_names(SCRIPTS / "gpu_image_packages.txt")
    assert {"truststore", "ipython", "transformers", "diffusers", "pyzmq"} <= carried
    assert {"torch", "numpy", "nvidia-ml-py"} <= image
    assert not any(name.startswith("#") for name in carried | image)
    # every carried name is pinned in the lock (gpu_wheels.sh downloads the lock's version)
    lock = {normalise(line.split("==")[0]) for line in (SCRIPTS.parent / "requirements" / "lock.txt").read_text().split()}
    assert carried <= lock


def _result(latencies: dict | None, eq: dict | None) -> dict:
    phases = {"env": {"wall_s": 1, "cap_s": 60, "rc": 0, "result": {"device_name": "NVIDIA H200", "nvidia_smi": "x"}}}
    if latencies is not None:
        rows = [{"method": m, "n": n, "latency_s": s, "peak_gib": 30.0, "max_abs_vs_a": 0.0}
                for (m, n), s in latencies.items()]
        phases["methods"] = {"wall_s": 1, "cap_s": 9, "rc": 0, "result": {
            "shape": {"height": 480, "width": 832, "steps": 20}, "steps_most": 35, "per_candidate_step_s": 0.05,
            "rows": rows, "load_s": 30, "ready_s": 40}}
    if eq is not None:
        phases["equivalence"] = {"wall_s": 1, "cap_s": 9, "rc": 0, "result": eq}
    return {"meta": {"dry_run": False, "git": "abc", "created": "now", "wall_s": 10, "budget_s": 540, "ops": "shipped"},
            "checkpoint": {"written_by": "x"}, "phases": phases, "fleet": {}}


def test_headline_ratios_come_from_the_method_rows():
    lat = {("a_sequential", 1): 1.0, ("c_worker_batch", 1): 1.0, ("d_scheduler_e2e", 1): 1.01,
           ("a_sequential", 8): 8.0, ("c_worker_batch", 8): 2.0, ("d_scheduler_e2e", 8): 2.05}
    eq = {"n": 4, "sampling": {"height": 480, "width": 832, "steps": 10, "guidance_scale": 2.0}, "max_abs_diff": 0.01,
          "max_rel_diff": 0.001, "bitwise": False, "bound": {"atol": 0.05, "rtol": 0.05}, "within_bound": True,
          "finite": True, "per_candidate_max_abs": [0.01] * 4, "batched_s": 1.0, "alone_s": 3.0}
    result = _result(lat, eq)
    h = headline(result)
    assert h["c_n8_over_n1"] == pytest.approx(2.0)
    assert h["c_vs_a_speedup_n8"] == pytest.approx(4.0)
    assert h["d_over_c_n8"] == pytest.approx(1.025)
    assert h["d_minus_c_n8_ms"] == pytest.approx(50.0)
    assert h["equivalence_within_bound"] is True
    result["headline"] = h
    text = markdown(result)
    assert "| (c) vs (a) at N=8 | 4.00x | >= 4.5x |" in text
    assert "| 8 | 8.000 | 2.000 | 2.050 | 4.00x | 50 |" in text


def test_the_report_compares_each_way_of_calling_the_model_with_the_default():
    eq = {"n": 4, "sampling": {"height": 480, "width": 832, "steps": 10, "guidance_scale": 2.0}, "max_abs_diff": 0.0,
          "max_rel_diff": 0.0, "bitwise": True, "bound": {"atol": 0.0, "rtol": 0.0}, "within_bound": True,
          "finite": True, "per_candidate_max_abs": [0.0] * 4, "batched_s": 2.0, "alone_s": 3.0, "call_rows": 1,
          "text_by_request_rows": True}
    eq["batched_calls"] = {**eq, "max_abs_diff": 0.5, "bitwise": False, "within_bound": False, "batched_s": 1.6,
                           "alone_s": 3.0, "call_rows": "all"}
    eq["batch_invariant"] = {**eq, "max_abs_diff": 0.0, "bitwise": True, "within_bound": True, "batched_s": 3.0,
                             "alone_s": 3.3, "call_rows": "all"}
    result = _result(None, eq)
    result["headline"] = headline(result)
    text = markdown(result)
    assert "| equivalence max abs diff | 0 (bitwise) | within atol/rtol 0.0 (declared by the adapter) |" in text
    assert "| equivalence, candidates batched in one call | 0.5 | 0 (bitwise) |" in text
    assert "| the same with sglang's batch-invariant kernels | 0 | 0 (bitwise) |" in text
    assert ("As the worker runs them by default (1 candidate a transformer call; text K/V rows keyed by the "
            "request call that computes them):") in text
    assert "One transformer call of the worker carries 1 candidate at most" in text
    assert "- the group 1.60 s (0.80x the default), alone x4 3.00 s (1.00x)" in text
    assert "- the group 3.00 s (1.50x the default), alone x4 3.30 s (1.10x)" in text


def test_the_methods_table_shows_batched_calls_beside_one_candidate_a_call():
    result = _result({("a_sequential", 1): 1.0, ("c_worker_batch", 1): 1.0, ("d_scheduler_e2e", 1): 1.01,
                      ("c_batched_calls", 1): 1.0, ("a_sequential", 8): 8.0, ("c_worker_batch", 8): 7.8,
                      ("d_scheduler_e2e", 8): 7.82, ("c_batched_calls", 8): 7.2}, None)
    result["phases"]["methods"]["result"]["call_rows"] = 1
    h = headline(result)
    assert h["batched_calls_n8_over_n1"] == pytest.approx(7.2) and h["batched_calls_vs_a_speedup_n8"] == pytest.approx(8 / 7.2)
    assert h["call_rows"] == 1
    result["headline"] = h
    text = markdown(result)
    assert "| (c) with the candidates batched in one call: N=8 / N=1, vs (a) at N=8 | 7.20x, 1.11x | - |" in text
    assert "(c) and (d) at 1 candidate a transformer call; (c'): (c) with the candidates batched" in text
    assert "| 8 | 8.000 | 7.800 | 7.820 | 1.03x | 20 | 30.0 | 30.0 | 0 / 0 | 7.200 | 1.11x | 0 |" in text


def test_a_run_whose_phases_failed_reports_dashes_not_figures():
    result = _result(None, None)
    result["phases"]["probe_shipped"] = {"wall_s": 15, "cap_s": 120, "rc": "timeout", "log_tail": ["nvcc"]}
    result["phases"]["probe_native"] = {"wall_s": 15, "cap_s": 120, "rc": 1, "log_tail": ["ImportError"]}
    result["meta"]["ops"] = "none"
    h = headline(result)
    assert h["c_n8_over_n1"] is None and h["equivalence_max_abs"] is None
    result["headline"] = h
    text = markdown(result)
    assert "| (c) latency N=8 / N=1 | - | <= 1.3x |" in text
    assert "| probe_native | 15 | 120 | 1 |" in text and "| probe_shipped | 15 | 120 | timeout |" in text
    assert "sglang ops: none ran" in text


def test_the_report_says_which_ops_ran_and_whether_the_shipped_kernels_built():
    result = _result(None, None)
    result["meta"]["ops"] = "native"
    result["phases"]["probe_shipped"] = {"wall_s": 200, "cap_s": 240, "rc": "timeout", "log_tail": ["nvcc"]}
    result["headline"] = headline(result)
    assert "sglang ops: native (sglang's own PyTorch forms" in markdown(result)
    assert "the shipped kernels did not finish in the probe (timeout), in 200 s" in markdown(result)


def _run_with_shims(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(SCRIPTS / "gpu_shims"), "PATH": "/usr/bin:/bin"})


def test_the_sgl_kernel_stand_in_computes_rmsnorm_and_refuses_the_rest():
    proc = _run_with_shims("""
        import torch, sgl_kernel
        from sgl_kernel.quantization import scalar_types   # a submodule, imported at sglang's import time
        consts = [scalar_types.uint4b8, scalar_types.uint8b128]
        torch.manual_seed(0)
        x, w, r = torch.randn(3, 16, dtype=torch.bfloat16), torch.randn(16, dtype=torch.bfloat16), torch.randn(3, 16, dtype=torch.bfloat16)
        xf = x.float()
        ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16) * w
        assert torch.equal(sgl_kernel.rmsnorm(x, w, 1e-6), ref)
        x2, r2 = x.clone(), r.clone()
        sgl_kernel.fused_add_rmsnorm(x2, r2, w, 1e-6)
        assert torch.equal(r2, r + x) and torch.equal(x2, sgl_kernel.rmsnorm(r + x, w, 1e-6))
        g = torch.randn(2, 8)
        assert torch.allclose(sgl_kernel.silu_and_mul(g), torch.nn.functional.silu(g[:, :4]) * g[:, 4:])
        for f in (sgl_kernel.some_fused_gemm, consts[0]):
            try:
                f()
            except NotImplementedError as e:
                print("refused:", e)
            else:
                raise SystemExit("a missing kernel ran")
        """)
    assert proc.returncode == 0, proc.stderr
    assert "refused: sgl_kernel.some_fused_gemm is not in the gpu-check stand-in" in proc.stdout
    assert "refused: sgl_kernel.scalar_types.uint4b8" in proc.stdout


def test_the_sphinx_stand_in_says_sphinx_is_not_installed():
    # sglang's platforms/cuda.py catches ModuleNotFoundError only: an ImportError would break it
    proc = _run_with_shims("""
        try:
            from sphinx.ext.autodoc.mock import _MockModule
        except ModuleNotFoundError:
            print("not installed")
        """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "not installed"
    assert Path(SCRIPTS / "gpu_shims" / "sphinx" / "__init__.py").exists()


def _still_the_sleep(pid: int) -> bool:
    """`sleep 60` alive at `pid`: not gone, not a zombie awaiting its reaper, and not another process that
    took the pid since (pid_max is 32,768 here, and a busy test run wraps it in minutes)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return state != "Z" and argv[:2] == [b"sleep", b"60"]


def test_a_phase_past_its_cap_is_killed_with_what_it_started(tmp_path):
    from candidate_scheduler.bench.gpu_check import run_capped

    marker = tmp_path / "child.pid"
    # the phase starts a child of its own (as a phase starts a scheduler and workers), then overruns; the
    # cap leaves a loaded machine time to start Python and the child before the kill (1.5 s did not once)
    script = f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); open({str(marker)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    assert run_capped([sys.executable, "-c", script], tmp_path / "log", 4.0, {"PATH": "/usr/bin:/bin"}) == "timeout"
    assert not _still_the_sleep(int(marker.read_text()))
    assert run_capped([sys.executable, "-c", "print('ok')"], tmp_path / "log2", 30, {"PATH": "/usr/bin:/bin"}) == 0
    assert (tmp_path / "log2").read_text().strip() == "ok"


def _running(tmp_path, code: str, key: str = "p") -> tuple:
    import time

    from candidate_scheduler.bench.gpu_check import GpuCheck, start_capped

    run = GpuCheck(tmp_path, tmp_path, 60, {})
    rfile, log = tmp_path / f"{key}.result.json", tmp_path / f"{key}.log"
    code = code.replace("RESULT", str(rfile)).replace("PARTIAL", str(rfile.with_suffix(".partial.json")))
    return run, {"key": key, "cap_s": 30.0, "t": time.monotonic(), "t_wall": time.time(), "rfile": rfile, "log": log,
                 "proc": start_capped([sys.executable, "-c", code], log, None)}


def test_a_phase_collected_late_is_timed_to_its_own_end(tmp_path):
    """The shipped probe is collected after the checkpoint: its time must be its own, not the wait's."""
    import time

    run, running = _running(tmp_path, "open('RESULT', 'w').write('{\"ok\": 1}')")
    time.sleep(2.0)
    record = run.collect(running)
    assert record["rc"] == 0 and record["result"] == {"ok": 1}
    assert record["wall_s"] < 1.5, record


def test_a_phase_that_fails_after_a_partial_result_keeps_it_marked_partial(tmp_path):
    run, running = _running(tmp_path, "open('PARTIAL', 'w').write('{\"max_abs_diff\": 0.5}'); raise SystemExit(3)")
    record = run.collect(running)
    assert record["rc"] == 3 and record["partial"] is True and record["result"] == {"max_abs_diff": 0.5}
    result = _result(None, None)  # the report's table says so
    result["phases"]["load"] = {"wall_s": 1, "cap_s": 2, "rc": 3, "partial": True, "result": {}}
    result["headline"] = headline(result)
    assert "| load | 1 | 2 | partial (3) |" in markdown(result)


def test_a_phase_never_collected_is_killed(tmp_path):
    run, running = _running(tmp_path, "import time; time.sleep(60)")
    run.kill(running)
    assert running["proc"].poll() is not None


def test_kernels_are_classed_by_name():
    from candidate_scheduler.bench.gpu_profile import kind_of

    assert kind_of("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64") == "gemm"
    assert kind_of("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm>") == "gemm"
    assert kind_of("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>") == "attention"
    assert kind_of("fmha_cutlassF_bf16_aligned_64x128_rf_sm80") == "attention"
    assert kind_of("void at::native::vectorized_elementwise_kernel<4, at::native::mul>") == "other"
    assert kind_of("aten::cudnn_convolution") == "conv"
    assert kind_of("aten::mm") == kind_of("aten::addmm") == kind_of("aten::bmm") == "gemm"  # the CPU's operators
    assert kind_of("aten::mul") == kind_of("aten::empty_strided") == "other"


def test_the_profile_table_sums_by_kind():
    from candidate_scheduler.bench.gpu_profile import markdown as profile_markdown

    p = {"n": 8, "clock": "device", "total_ms": 600.0, "by_kind_ms": {"gemm": 200.0, "other": 350.0, "attention": 50.0},
         "top": [{"kernel": "elementwise_kernel", "ms": 300.0, "calls": 5000, "kind": "other"}]}
    text = "\n".join(profile_markdown([p]))
    assert "| 8 | device | 600.0 | 200.0 | 50.0 | 0.0 | 350.0 |" in text
    assert "| `elementwise_kernel` | other | 300.0 | 5000 |" in text


def test_the_report_says_why_the_batch_invariant_pass_did_not_finish():
    eq = {"n": 4, "sampling": {"height": 480, "width": 832, "steps": 10, "guidance_scale": 2.0}, "max_abs_diff": 0.5,
          "max_rel_diff": 0.04, "bitwise": False, "bound": {"atol": 0.05, "rtol": 0.05}, "within_bound": False,
          "finite": True, "per_candidate_max_abs": [0.5] * 4, "batched_s": 2.0, "alone_s": 3.0,
          "batch_invariant": {"error": "OutOfResources: shared memory"}}
    result = _result(None, eq)
    result["headline"] = headline(result)
    text = markdown(result)
    assert ("Batched in one call, with sglang's batch-invariant kernels (sglang.srt.batch_invariant_ops) on both "
            "sides: OutOfResources: shared memory.") in text
    assert "With the candidates batched in one transformer call: not run." in text
