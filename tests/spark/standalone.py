"""A Spark standalone cluster as real processes: one master and N workers, from PySpark's own
launcher (``<pyspark>/bin/spark-class``, which execs the JVM: the PID is the JVM's).

Everything binds to 127.0.0.1 on free ports; each worker has its own work dir (where its
executors' folders and logs go, ``app-*/<executor id>/``), so a test can tell which worker
ran something. :meth:`StandaloneSpark.stop` stops the workers, then the master, by PID:
SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pyspark

START_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
SPARK_HOME = Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class StandaloneSpark:
    def __init__(self, workdir: Path, workers: int = 2, cores: int = 1) -> None:
        self.workdir = workdir
        self.workers = workers
        self.cores = cores
        self.port = free_port()
        self.ui_port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def worker_dir(self, i: int) -> Path:
        return self.workdir / f"worker{i}"

    def _launch(self, name: str, *args: str) -> None:
        env = {
            **os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": "256m", "SPARK_LOG_DIR": str(self.workdir),
        }  # fmt: skip
        with open(self.workdir / f"{name}.log", "ab") as log:
            self.procs.append(
                subprocess.Popen(
                    [str(SPARK_HOME / "bin" / "spark-class"), *args],
                    stdout=log,
                    stderr=log,
                    env=env,
                    stdin=subprocess.DEVNULL,
                )
            )

    def start(self) -> str:
        """Master, then the workers; returns once every worker registered with the master."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._launch(
            "master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.port), "--webui-port", str(self.ui_port),
        )  # fmt: skip
        for i in range(self.workers):
            self.worker_dir(i).mkdir(exist_ok=True)
            self._launch(
                f"worker{i}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--cores", str(self.cores), "--memory", "1g", "--webui-port",
                str(free_port()), "--work-dir", str(self.worker_dir(i)), self.url,
            )  # fmt: skip
        self._wait_for_workers()
        return self.url

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json", timeout=2) as r:
                return int(json.loads(r.read())["aliveworkers"])
        except (OSError, ValueError, KeyError):
            return 0

    def _wait_for_workers(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.alive_workers() < self.workers:
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                self.stop()
                logs = {p.name: p.read_text()[-2000:] for p in self.workdir.glob("*.log")}
                raise RuntimeError(f"Spark standalone did not come up ({dead}): {logs}")
            time.sleep(0.2)

    def stop(self) -> None:
        for proc in reversed(self.procs):  # the workers, then the master
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def executor_dirs(self, i: int) -> list[Path]:
        """The executors worker ``i`` ran: ``<work dir>/app-*/<executor id>``."""
        return [p for p in self.worker_dir(i).glob("app-*/*") if p.is_dir()]
