"""The tracer trace.patch calls: with CSTRACE set, each stamp appends `TAG perf_counter()` to /tmp/trace/PID."""

import os
import time

_fd = os.open(f"/tmp/trace/{os.getpid()}", os.O_WRONLY | os.O_CREAT | os.O_APPEND) if os.environ.get("CSTRACE") else None


def t(tag):
    if _fd is not None:
        os.write(_fd, f"{tag} {time.perf_counter():.7f}\n".encode())
