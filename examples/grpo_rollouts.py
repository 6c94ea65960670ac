"""GRPO rollouts on Ray: P prompts x G candidates per training step, from Ray tasks.

A Ray driver places the service (the scheduler and Cosmos3 workers as Ray actors:
candidate_scheduler.service.ray_placement), or attaches to one already placed (`--attach NAME`). Each
training step it sends one rollout group per prompt (`rollout=True`, `reducer="none"`, G candidates)
from a Ray task, collects every candidate's trajectory and per-step log-probabilities, scores each
candidate with a toy reward (closeness of its action to a target trajectory), and computes
group-relative advantages: (reward - group mean) / group std, as GRPO does. It checks what the seeds of
this project were written about: no two candidates of a group share a trajectory (the collapse bug,
where every candidate of a group got the same noise). Exit status 1 if any group collapsed.

    python examples/grpo_rollouts.py --prompts 4 --group-size 8 --train-steps 3   # a local Ray cluster
    python examples/grpo_rollouts.py --address auto --attach candidate-scheduler  # a placed service
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import ray

PROMPTS = ("pick up the red cube", "open the drawer", "stack the blocks", "push the button",
           "close the lid", "move the cup left", "grasp the handle", "place the bowl")


@ray.remote(num_cpus=0)
def rollout_group(spec, prompt: str, image_seed: int, seed: int, group_size: int, denoise_steps: int) -> dict:
    """One rollout group, sent from a Ray task through the service's client spec."""
    from candidate_scheduler.service.client import synthetic_image

    with spec.client(timeout_s=300) as client:
        r = client.submit(synthetic_image(64, 64, seed=image_seed), prompt, count=group_size, reducer="none",
                          seed=seed, rollout=True, noise_level=0.7, steps=denoise_steps, horizon=16,
                          request_id=f"grpo-{seed}-{image_seed}")
    if r.status != "done":
        raise RuntimeError(f"rollout group {prompt!r} {r.status}: {r.error}")
    return {"prompt": prompt, "actions": r.candidates, "seeds": list(r.candidate_seeds),
            "log_probs": r.rollout["log_probs"], "final_latents": r.rollout["final_latents"],
            "latents": r.rollout["latents"]}


def reward(actions: np.ndarray) -> np.ndarray:
    """A toy reward per candidate: how close its action [H, D] stays to a smooth target trajectory."""
    h, d = actions.shape[-2:]
    target = np.sin(np.linspace(0, np.pi, h))[:, None] * np.ones((1, d)) * 0.1
    return -np.sqrt(((actions - target) ** 2).mean(axis=(-2, -1)))


def advantages(rewards: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """GRPO's group-relative advantage of each candidate of one group."""
    return (rewards - rewards.mean()) / (rewards.std() + eps)


def collapsed_pairs(group: dict) -> list[tuple[int, int]]:
    """Pairs of candidates of one group whose trajectories are the same (they must never be)."""
    paths = [group["latents"][k].tobytes() + group["final_latents"][k].tobytes() for k in range(len(group["seeds"]))]
    return [(i, j) for i in range(len(paths)) for j in range(i + 1, len(paths)) if paths[i] == paths[j]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--address", default="local", help="Ray cluster: 'local' (a new one here) or an address/'auto'")
    p.add_argument("--attach", default=None, metavar="NAME", help="use the service placed under this name")
    p.add_argument("--model", default=".cache/tiny-cosmos3", help="Cosmos3 checkpoint for the workers placed here")
    p.add_argument("--workers", type=int, default=1, help="Cosmos3 workers to place (without --attach)")
    p.add_argument("--capacity", type=int, default=8, help="rows per worker")
    p.add_argument("--cpus-per-worker", type=float, default=1.0, help="Ray CPUs per worker")
    p.add_argument("--gpus-per-worker", type=float, default=0.0, help="Ray GPUs per worker (--device cuda then)")
    p.add_argument("--prompts", type=int, default=4, help="P: prompts per training step")
    p.add_argument("--group-size", type=int, default=8, help="G: candidates per prompt")
    p.add_argument("--train-steps", type=int, default=3, help="training steps")
    p.add_argument("--denoise-steps", type=int, default=4, help="denoising steps per rollout")
    args = p.parse_args(argv)

    from candidate_scheduler.service import ray_placement

    if args.address == "local":
        ray.init(num_cpus=max(2, int(args.workers * args.cpus_per_worker) + 1), include_dashboard=False,
                 log_to_driver=False, namespace=ray_placement.NAMESPACE)
    else:
        ray.init(address=args.address, log_to_driver=False, namespace=ray_placement.NAMESPACE)
    started = time.perf_counter()
    if args.attach:
        service = ray_placement.attach(args.attach)
    else:
        device = "cuda" if args.gpus_per_worker else "cpu"
        service = ray_placement.start(
            args.workers, worker_args=("--model", args.model, "--capacity", str(args.capacity), "--device", device),
            serve_args=("--no-compat", "--metrics-port", "-1"), cpus_per_worker=args.cpus_per_worker,
            gpus_per_worker=args.gpus_per_worker, free_ports=args.address == "local", name="grpo-rollouts")
        service.wait_workers()
    print(f"service ready in {time.perf_counter() - started:.1f} s: {service.endpoints['request endpoint']}")
    spec = service.client_spec()
    collapsed = 0
    try:
        for step in range(args.train_steps):
            t0 = time.perf_counter()
            prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.prompts)]
            groups = ray.get([rollout_group.remote(spec, prompt, image_seed=i, seed=1000 * step + i,
                                                   group_size=args.group_size, denoise_steps=args.denoise_steps)
                              for i, prompt in enumerate(prompts)])
            rewards = [reward(g["actions"]) for g in groups]
            adv = [advantages(r) for r in rewards]
            bad = [(g["prompt"], pairs) for g in groups if (pairs := collapsed_pairs(g))]
            collapsed += len(bad)
            log_probs = np.concatenate([g["log_probs"].sum(axis=1) for g in groups])
            print(f"step {step}: {len(groups)} groups x {args.group_size} candidates in "
                  f"{time.perf_counter() - t0:.2f} s; reward mean {np.mean(np.concatenate(rewards)):+.4f}; "
                  f"advantage mean {np.mean(np.concatenate(adv)):+.1e}, std per group "
                  f"{np.mean([a.std() for a in adv]):.3f}; trajectory log-prob mean {log_probs.mean():.1f}; "
                  f"groups with identical candidates: {len(bad)}")
            for prompt, pairs in bad:
                print(f"  COLLAPSE in {prompt!r}: candidates {pairs} share a trajectory")
            assert all(np.isfinite(g["log_probs"]).all() for g in groups), "a non-finite log-probability"
    finally:
        if not args.attach:
            service.shutdown()
        ray.shutdown()
    print(f"done: {args.train_steps} steps, {collapsed} collapsed group(s)")
    return 1 if collapsed else 0


if __name__ == "__main__":
    sys.exit(main())
