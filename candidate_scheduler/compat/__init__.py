"""sglang compatibility. Reading: `unpickle` (the allow-list; review it on its own) over the tables of
`sglang_classes`; `classify` (what a message is); `mapping` and `images` (Req -> one native group).
Writing: `replies` (group result -> OutputBatch) with `foreign` (pickling sglang's classes without
them). `bridge` is the process; `http` starts sglang's own FastAPI server in front of it (the only
module that imports sglang, lazily). Nothing here imports sglang at module load."""
