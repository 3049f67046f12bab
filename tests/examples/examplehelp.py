"""Run an ``examples/`` script as a user does: its own process, its command line."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# Safety nets against a hang, never assertions on speed.
RUN_TIMEOUT_S = 120.0
LINE_TIMEOUT_S = 60.0


def example_command(name: str, port: int, *args: str) -> list[str]:
    return [
        sys.executable,
        str(EXAMPLES / name),
        *args,
        "--connect",
        f"couchbase://127.0.0.1:{port}",
    ]


def run_example(name: str, port: int, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the script to its end; its exit status, stdout and stderr."""
    return subprocess.run(
        example_command(name, port, *args), cwd=cwd, capture_output=True, text=True,
        timeout=RUN_TIMEOUT_S,
    )  # fmt: skip


def _as_from_a_terminal() -> None:
    """(In the child, before exec.) SIGINT as a shell gives it: default, not blocked. A
    process inherits an ignored or blocked signal across exec, and the test process may have
    either from what ran in it before (the full suite left Ctrl-C without effect here)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _signals(pid: int) -> str:
    """The process's blocked, ignored and caught signal masks (/proc), for a failure."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return "(gone)"
    return " ".join(line for line in status if line.startswith(("SigBlk", "SigIgn", "SigCgt")))


class RunningExample:
    """A script that runs until it is told to stop (Ctrl-C), its stdout read line by line."""

    def __init__(self, name: str, port: int, *args: str, cwd: Path) -> None:
        self.proc = subprocess.Popen(
            example_command(name, port, *args), cwd=cwd, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, preexec_fn=_as_from_a_terminal,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, text: str) -> list[str]:
        """The lines printed up to the first one containing ``text``."""
        seen = []
        while True:
            try:
                line = self.lines.get(timeout=LINE_TIMEOUT_S)
            except queue.Empty:
                raise AssertionError(f"no line with {text!r}; printed: {seen}") from None
            seen.append(line)
            if text in line:
                return seen

    def interrupt(self) -> tuple[int, str]:
        """Ctrl-C; the exit status and what it printed on stderr."""
        masks = _signals(self.proc.pid)
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"no exit {RUN_TIMEOUT_S:.0f} s after Ctrl-C; {masks}") from None
        finally:
            self.stop()
        assert self.proc.stderr is not None
        return code, self.proc.stderr.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
