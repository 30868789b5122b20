"""An installed OpenEnv environment package's server app, started by the run on 127.0.0.1 (``env.app=MODULE:ATTR``).

OpenEnv environments ship as a package with a FastAPI app (``my_env.server.app:app``) that the user normally starts
with ``uvicorn``. harmonyrl starts that app unchanged, in a child process (the environment's code never runs in the
trainer: a crash or a hang there is a server fault the episode sees, not a dead run), and stops it when the run
ends. How, and why:

* **the port**: the parent binds a listening socket on 127.0.0.1, port 0, and hands the child its file descriptor
  (``uvicorn --fd``), so there is no window in which another process can take a port picked as "free";
* **imports**: the child's ``PYTHONPATH`` is the parent's ``sys.path``, so whatever the run can import (an installed
  package, or one on the path) the server can;
* **no orphans**: the child exits when its parent is gone (a watchdog thread polling ``getppid``: ``PR_SET_PDEATHSIG``
  would fire when the *thread* that forked exits, not the process), and the parent stops it at exit;
* **readiness**: ``GET /health`` polled every 0.1 s until ``start_timeout_s``; a child that exits first, or that is not
  healthy in time, is a one-line :class:`UserCodeError` with the last line it wrote.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from harmonyrl.envs.loader import UserCodeError

_CHILD = """
import os, sys, threading, time
app, fd, parent = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def watch():
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)
threading.Thread(target=watch, daemon=True).start()
import uvicorn
uvicorn.run(app, fd=fd, log_level="warning")
"""
_POLL_S = 0.1


def answers(url: str, timeout_s: float) -> str | None:
    """None if ``url``'s ``/health`` answers 200 within ``timeout_s``, else why not (one line). Loopback hosts are
    asked directly (a proxy set for the outside world must not see them)."""
    host = urllib.parse.urlsplit(url).hostname or ""
    handlers = [urllib.request.ProxyHandler({})] if host in ("127.0.0.1", "localhost", "::1") else []
    try:
        with urllib.request.build_opener(*handlers).open(f"{url.rstrip('/')}/health", timeout=timeout_s) as reply:
            return None if reply.status == 200 else f"/health answered HTTP {reply.status}"
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return f"{type(reason).__name__}: {' '.join(str(reason).split())[:200]}"


class LocalServer:
    """``app`` served by uvicorn in a child process on 127.0.0.1 (module docstring); ``url`` is where."""

    def __init__(self, app: str, start_timeout_s: float) -> None:
        self.app = app
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        self.url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        self.log = Path(tempfile.mkstemp(prefix="harmonyrl-openenv-", suffix=".log")[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        fd = listener.fileno()
        with self.log.open("wb") as out:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD, app, str(fd), str(os.getpid())],
                pass_fds=(fd,),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        listener.close()  # the child holds its own copy
        atexit.register(self.stop)
        try:
            self._wait_healthy(start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for _ in range(int(timeout_s / _POLL_S) + 1):
            if self._proc.poll() is not None:
                raise UserCodeError(f"env.app '{self.app}': the server exited ({self._proc.returncode}) before it "
                                    f"answered: {self.last_line()}")  # fmt: skip
            if answers(self.url, timeout_s=1.0) is None:
                return
            if time.monotonic() > deadline:
                break
            time.sleep(_POLL_S)
        raise UserCodeError(f"env.app '{self.app}': the server did not answer {self.url}/health within {timeout_s:g}s "
                            f"(env.start_timeout_s): {self.last_line()}")  # fmt: skip

    def last_line(self) -> str:
        """The last line the server wrote (its error, when it failed to start)."""
        lines = [line for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        return lines[-1].strip()[:300] if lines else "(it wrote nothing)"

    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s) and remove its log; safe to call twice."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5.0)
        with contextlib.suppress(OSError):
            self.log.unlink()
        atexit.unregister(self.stop)
