"""The worker process: the loop on the worker link, the model adapters (Cosmos3 on sglang's code, the
null adapter for scheduler tests), rollouts, fault injection and the tiny checkpoint writer."""
