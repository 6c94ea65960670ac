"""A robot process: runs openpi's own `WebsocketClientPolicy` (in the openpi-client venv, numpy 1.x)
through a scripted list of steps, one client per robot, all robots in parallel threads.

    python openpi_robot.py JOB.json INPUT.npz OUT_DIR

JOB: {"url": "ws://...", "robots": [[step, ...], ...]}. A step:
  {"op": "metadata"}                              the metadata frame this client got on connect
  {"op": "infer", "obs": {...}}                   client.infer(obs); {"$array": name} in obs is INPUT[name],
                                                  {"$int64": v} a numpy int64 scalar
  {"op": "raw", "fill": HEX, "size": n}           the bytes HEX n times, sent as one binary frame on the
                                                  client's own connection; the reply read back
  {"op": "text", "text": "..."}                   a text frame on the client's own connection
  {"op": "reconnect"}                             a new WebsocketClientPolicy for this robot
Writes OUT_DIR/result.json ([[{"ok", "error", "error_type", "reply"}]] per robot and step) and
OUT_DIR/arrays.npz (reply arrays as "r{robot}.s{step}.{key}"). Imports nothing of candidate_scheduler.
"""

import json
import sys
import threading
import traceback

import numpy as np
from openpi_client import msgpack_numpy, websocket_client_policy


def _obs(value, arrays):
    if isinstance(value, dict):
        if set(value) == {"$array"}:
            return arrays[value["$array"]]
        if set(value) == {"$int64"}:
            return np.int64(value["$int64"])
        return {k: _obs(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        return [_obs(v, arrays) for v in value]
    return value


def _plain(value):
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _run_robot(index, url, steps, arrays, barrier, results, out_arrays):
    try:
        client = websocket_client_policy.WebsocketClientPolicy(url)
        barrier.wait(timeout=60)
    except Exception as exc:
        barrier.abort()
        results[index].append({"ok": False, "error": f"connect: {exc}", "error_type": type(exc).__name__, "reply": None})
        return
    for s, step in enumerate(steps):
        entry = {"ok": True, "error": None, "error_type": None, "reply": None}
        try:
            op = step["op"]
            if op == "metadata":
                reply = client.get_server_metadata()
            elif op == "infer":
                reply = client.infer(_obs(step["obs"], arrays))
            elif op in ("raw", "text"):
                client._ws.send(bytes.fromhex(step["fill"]) * step["size"] if op == "raw" else step["text"])
                answer = client._ws.recv()
                if isinstance(answer, str):  # what infer() turns into its RuntimeError
                    raise RuntimeError(f"Error in inference server:\n{answer}")
                reply = msgpack_numpy.unpackb(answer)
            elif op == "reconnect":
                client = websocket_client_policy.WebsocketClientPolicy(url)
                reply = {}
            else:
                raise ValueError(f"unknown op {op!r}")
            plain = {}
            for key, value in reply.items():
                if isinstance(value, np.ndarray):
                    out_arrays[f"r{index}.s{s}.{key}"] = value
                    plain[key] = {"$array": f"r{index}.s{s}.{key}", "dtype": value.dtype.str, "shape": list(value.shape)}
                else:
                    plain[key] = _plain(value)
            entry["reply"] = plain
        except Exception as exc:  # the test asserts on what the client raised
            entry.update(ok=False, error=str(exc), error_type=type(exc).__name__)
            if not isinstance(exc, RuntimeError):
                entry["traceback"] = traceback.format_exc()
        results[index].append(entry)


def main(job_path, input_path, out_dir):
    with open(job_path) as f:
        job = json.load(f)
    arrays = dict(np.load(input_path)) if input_path != "-" else {}
    robots = job["robots"]
    results = [[] for _ in robots]
    out_arrays = {}
    barrier = threading.Barrier(len(robots))  # every robot connected before any sends: they overlap
    threads = [threading.Thread(target=_run_robot, args=(i, job["url"], steps, arrays, barrier, results, out_arrays))
               for i, steps in enumerate(robots)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(f"{out_dir}/result.json", "w") as f:
        json.dump(results, f)
    np.savez(f"{out_dir}/arrays.npz", **out_arrays)


if __name__ == "__main__":
    main(*sys.argv[1:4])
