"""XLA as an oracle, from the test side: a persistent worker process per device count.

    with XlaOracle() as xla:
        answer = xla.partition(text, 4, to_output=True, to_parameters=False,
                               inputs=[x, w], output_shapes=[(8, 4)])
        answer.before, answer.propagated, answer.spmd, answer.outputs

jax fixes its device count at import, so each N gets its own worker (`xla_worker.py`, started on
first use and kept for the oracle's life); requests and answers are pickled dicts on the worker's
pipes (the protocol is in `xla_worker.py`). A request that outlives `timeout` seconds, or a worker
that dies (XLA aborts the process on a failed internal check), gives an `XlaAnswer` with
`stage="crash"` or `"timeout"` and the worker is replaced. jax is imported only by the workers:
this module loads without it, and `xla_available()` says whether the workers can run.
"""
from __future__ import annotations

import importlib.util
import pickle
import select
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

WORKER = Path(__file__).with_name("xla_worker.py")
START_TIMEOUT = 120.0


def xla_available() -> bool:
    """Whether jax and jaxlib (the `[xla]` extra) are importable here."""
    return all(importlib.util.find_spec(m) is not None for m in ("jax", "jaxlib"))


@dataclass(frozen=True)
class XlaAnswer:
    """XLA's answer for one module. `ok`: it compiled (and ran, when inputs were given); else
    `stage` says where it stopped ("compile", "run", "crash", "timeout") and `error` why."""

    ok: bool
    before: str | None = None
    propagated: str | None = None
    spmd: str | None = None
    outputs: list | None = None
    stage: str | None = None
    error: str | None = None


class _Worker:
    def __init__(self, num_devices: int, excess_precision: bool):
        self.num_devices = num_devices
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), str(num_devices)]
            + (["excess"] if excess_precision else []), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.log)
        ready = self.receive(START_TIMEOUT)
        if not ready.get("ok"):
            self.close()
            raise RuntimeError(f"the XLA worker for {num_devices} devices did not start: "
                               f"{ready.get('error')}")

    def send(self, request: dict) -> dict | None:
        """Send `request`; None, or the failure answer when the worker is gone."""
        try:
            pickle.dump(request, self.process.stdin)
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            return {"ok": False, "stage": "crash", "error": self._death()}
        return None

    def receive(self, timeout: float) -> dict:
        readable, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not readable:
            self.close()
            return {"ok": False, "stage": "timeout", "error": f"no answer in {timeout:g} s"}
        try:
            return pickle.load(self.process.stdout)
        except (EOFError, pickle.UnpicklingError):
            return {"ok": False, "stage": "crash", "error": self._death()}

    def _death(self) -> str:
        """What the dead worker last said on stderr (XLA's check-failure line if any)."""
        self.process.wait()
        self.log.seek(0)
        lines = [ln.strip() for ln in self.log.read().decode(errors="replace").splitlines()
                 if ln.strip()]
        fatal = [ln for ln in lines if ln.startswith("F") or "Check failed" in ln]
        last = (fatal or lines or ["(nothing on stderr)"])[-1]
        return f"XLA worker died (exit {self.process.returncode}): {last[:500]}"

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


class XlaOracle:
    """XLA's propagation, partitioner and runtime on HLO text, one worker per device count.
    `timeout`: seconds one request may take. `excess_precision`: run programs with XLA's default
    `--xla_allow_excess_precision=true` (gspmdc's `"xla"` rounding) instead of false (`"per-op"`,
    bf16 rounded after every op)."""

    def __init__(self, *, timeout: float = 300.0, excess_precision: bool = False):
        self.timeout = timeout
        self.excess_precision = excess_precision
        self._workers: dict[int, _Worker] = {}
        self._in_flight: tuple[_Worker, dict | None] | None = None

    def partition(self, text: str, num_devices: int, *, to_output: bool, to_parameters: bool,
                  inputs: list | None = None, output_shapes: list | None = None) -> XlaAnswer:
        """XLA's input to propagation, its propagated and its partitioned module for `text` on
        `num_devices` partitions (with the two propagation options), and with `inputs` (global
        arrays of the entry parameters' array leaves) the global outputs of its partitioned
        program (`output_shapes`: the dims of the result's array leaves)."""
        self.send(text, num_devices, to_output=to_output, to_parameters=to_parameters,
                  inputs=inputs, output_shapes=output_shapes)
        return self.receive()

    def send(self, text: str, num_devices: int, *, to_output: bool, to_parameters: bool,
             inputs: list | None = None, output_shapes: list | None = None) -> None:
        """Start `partition` without waiting: XLA works on it while the caller does something
        else; `receive` gives the answer. One request is in flight at a time."""
        if self._in_flight is not None:
            raise RuntimeError("receive the answer of the request in flight first")
        worker = self._worker(num_devices)
        failed = worker.send({"text": text, "to_output": to_output,
                              "to_parameters": to_parameters, "inputs": inputs,
                              "output_shapes": output_shapes})
        self._in_flight = (worker, failed)

    def receive(self) -> XlaAnswer:
        """The answer to the request `send` started."""
        if self._in_flight is None:
            raise RuntimeError("no request in flight")
        worker, failed = self._in_flight
        self._in_flight = None
        reply = failed or worker.receive(self.timeout)
        if not worker.alive:
            worker.close()
            del self._workers[worker.num_devices]
        if reply.get("ok"):
            return XlaAnswer(True, reply["before"], reply["propagated"], reply["spmd"],
                             reply["outputs"])
        return XlaAnswer(False, reply.get("before"), reply.get("propagated"), reply.get("spmd"),
                         None, reply["stage"], reply["error"])

    def _worker(self, num_devices: int) -> _Worker:
        worker = self._workers.get(num_devices)
        if worker is None or not worker.alive:
            worker = self._workers[num_devices] = _Worker(num_devices, self.excess_precision)
        return worker

    def close(self) -> None:
        self._in_flight = None
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()

    def __enter__(self) -> "XlaOracle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
