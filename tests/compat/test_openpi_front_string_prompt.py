"""openpi's own client (its venv: a robot process) sending the prompt as a numpy string array, as a
LeRobot-style loop hands it over (`np.array("pick up the cup")`): openpi's policies read it with
`.item()`, and so does the front. It was refused ("array dtype '<U15' is not accepted")."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from candidate_scheduler.service.client import synthetic_image

from . import openpi_client_env
from .test_openpi import ROBOT, Front

pytestmark = pytest.mark.sglang


def test_a_numpy_string_prompt_reaches_the_scheduler_as_its_text(fake_scheduler, tmp_path: Path):
    front = Front(fake_scheduler.request_endpoint, fake_scheduler.control_endpoint, log_path=tmp_path / "front.log")
    try:
        job, data = tmp_path / "job.json", tmp_path / "input.npz"
        obs = {"observation/image": {"$array": "image"}, "prompt": {"$array": "prompt"}, "seed": 3}
        job.write_text(json.dumps({"url": front.url, "robots": [[{"op": "infer", "obs": obs}]]}))
        np.savez(data, image=synthetic_image(32, 32, seed=5), prompt=np.array("pick up the cup"))
        mark = fake_scheduler.mark()
        proc = subprocess.run([str(openpi_client_env.client_python()), str(ROBOT), str(job), str(data), str(tmp_path)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        [[step]] = json.loads((tmp_path / "result.json").read_text())
        assert step["ok"], step["error"]
        assert step["reply"]["candidate_seeds"] == [3]
        [sent] = fake_scheduler.since(mark)
        assert sent.prompt == "pick up the cup"
    finally:
        front.stop()
