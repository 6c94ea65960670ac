"""sglang compatibility: the allow-list unpickler, Req <-> group mapping, sglang-shaped replies, the
bridge process and the HTTP shims. Nothing here imports sglang at module load."""
