"""XLA as an oracle, from the test side: a persistent worker process per device count.

    with XlaOracle() as xla:
        answer = xla.partition(text, 4, to_output=True, to_parameters=False,
                               inputs=[x, w], output_shapes=[(8, 4)])
        answer.before, answer.propagated, answer.spmd, answer.outputs

jax fixes its device count when its backend starts, so each N gets its own worker
(`xla_worker.py`, forked on first use from a zygote process that imported jax once, and kept for
the oracle's life); requests and answers are pickled dicts on the worker's
pipes (the protocol is in `xla_worker.py`). A request that outlives `timeout` seconds, or a worker
that dies (XLA aborts the process on a failed internal check), gives an `XlaAnswer` with
`stage="crash"` or `"timeout"` and the worker is replaced. jax is imported only by the workers:
this module loads without it, and `xla_available()` says whether the workers can run.
"""
from __future__ import annotations

import importlib.util
import os
import pickle
import select
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

WORKER = Path(__file__).with_name("xla_worker.py")
START_TIMEOUT = 120.0


def xla_available() -> bool:
    """Whether jax and jaxlib (the `[xla]` extra) are importable here."""
    return all(importlib.util.find_spec(m) is not None for m in ("jax", "jaxlib"))


@dataclass(frozen=True)
class XlaAnswer:
    """XLA's answer for one module. `ok`: it compiled (and ran, when inputs were given); else
    `stage` says where it stopped ("compile", "run", "crash", "timeout") and `error` why.
    `seconds`: where the time went ("XLA start" of a worker, "XLA compile", "XLA run").
    `variants`: XLA's answer for each variant module sent with the request (in order; their
    `seconds` are counted in this answer's)."""

    ok: bool
    before: str | None = None
    propagated: str | None = None
    spmd: str | None = None
    outputs: list | None = None
    stage: str | None = None
    error: str | None = None
    seconds: dict = field(default_factory=dict)
    variants: list = field(default_factory=list)


class _Zygote:
    """The process workers are forked from (`xla_worker.zygote`): it imports jax once."""

    def __init__(self):
        self.channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), "zygote", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stderr=self.log)
        theirs.close()
        ready = self._reply(START_TIMEOUT)
        if ready != "ready":
            self.close()
            raise RuntimeError(f"the XLA zygote did not start: {ready}")

    def _reply(self, timeout: float) -> str:
        readable, _, _ = select.select([self.channel], [], [], timeout)
        if not readable:
            return "no answer"
        return self.channel.recv(4096).decode(errors="replace") or "the zygote died"

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def fork(self, num_devices: int, excess_precision: bool, fds: list[int]) -> int:
        """A worker for `num_devices` with standard input, output and error `fds`; its pid."""
        socket.send_fds(self.channel, [f"fork {num_devices} {int(excess_precision)}".encode()],
                        fds)
        reply = self._reply(START_TIMEOUT)
        if not reply.startswith("pid "):
            raise RuntimeError(f"the XLA zygote did not fork a worker: {reply}")
        return int(reply.split()[1])

    def reap(self, pid: int, grace: float) -> int | None:
        """The exit status of worker `pid` (killed if still running after `grace` seconds)."""
        try:
            self.channel.send(f"reap {pid} {grace}".encode())
        except OSError:
            return None
        reply = self._reply(grace + 10)
        return int(reply.split()[1]) if reply.startswith("status ") else None

    def close(self) -> None:
        self.channel.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


class _Worker:
    """One forked worker: requests go down one pipe, answers come up another."""

    def __init__(self, zygote: _Zygote, num_devices: int, excess_precision: bool):
        self.zygote = zygote
        self.num_devices = num_devices
        self.log = tempfile.TemporaryFile()
        their_requests, requests = os.pipe()
        answers, their_answers = os.pipe()
        try:
            self.pid = zygote.fork(num_devices, excess_precision,
                                   [their_requests, their_answers, self.log.fileno()])
        finally:
            os.close(their_requests)
            os.close(their_answers)
        self.requests = os.fdopen(requests, "wb")
        self.answers = os.fdopen(answers, "rb")
        self.exit_status: int | None = None
        self._alive = True
        ready = self.receive(START_TIMEOUT)
        if not ready.get("ok"):
            self.close()
            raise RuntimeError(f"the XLA worker for {num_devices} devices did not start: "
                               f"{ready.get('error')}")

    def send(self, request: dict) -> dict | None:
        """Send `request`; None, or the failure answer when the worker is gone."""
        try:
            pickle.dump(request, self.requests)
            self.requests.flush()
        except (BrokenPipeError, OSError):
            return {"ok": False, "stage": "crash", "error": self._death()}
        return None

    def receive(self, timeout: float) -> dict:
        readable, _, _ = select.select([self.answers], [], [], timeout)
        if not readable:
            self.close(grace=0)
            return {"ok": False, "stage": "timeout", "error": f"no answer in {timeout:g} s"}
        try:
            return pickle.load(self.answers)
        except (EOFError, pickle.UnpicklingError):
            return {"ok": False, "stage": "crash", "error": self._death()}

    def _death(self) -> str:
        """What the dead worker last said on stderr (XLA's check-failure line if any)."""
        self.close()
        self.log.seek(0)
        lines = [ln.strip() for ln in self.log.read().decode(errors="replace").splitlines()
                 if ln.strip()]
        fatal = [ln for ln in lines if ln.startswith("F") or "Check failed" in ln]
        last = (fatal or lines or ["(nothing on stderr)"])[-1]
        return f"XLA worker died (exit {self.exit_status}): {last[:500]}"

    @property
    def alive(self) -> bool:
        return self._alive

    def close(self, grace: float = 10.0) -> None:
        """End the worker: its request pipe closes, and after `grace` seconds it is killed."""
        if not self._alive:
            return
        self._alive = False
        for pipe in (self.requests, self.answers):
            try:
                pipe.close()
            except OSError:
                pass
        self.exit_status = self.zygote.reap(self.pid, grace)


def _answer(reply: dict, seconds: dict) -> XlaAnswer:
    """The XlaAnswer of a worker's `reply` (`xla_worker.py`), its seconds after `seconds`."""
    seconds = {**seconds, **reply.get("seconds", {})}
    if reply.get("ok"):
        return XlaAnswer(True, reply["before"], reply["propagated"], reply["spmd"],
                         reply["outputs"], seconds=seconds,
                         variants=[_answer(v, {}) for v in reply.get("variants", ())])
    return XlaAnswer(False, reply.get("before"), reply.get("propagated"), reply.get("spmd"),
                     None, reply["stage"], reply["error"], seconds)


class XlaOracle:
    """XLA's propagation, partitioner and runtime on HLO text, one worker per device count.
    `timeout`: seconds one request may take. `excess_precision`: run programs with XLA's default
    `--xla_allow_excess_precision=true` (gspmdc's `"xla"` rounding) instead of false (`"per-op"`,
    bf16 rounded after every op)."""

    def __init__(self, *, timeout: float = 300.0, excess_precision: bool = False):
        self.timeout = timeout
        self.excess_precision = excess_precision
        self._workers: dict[int, _Worker] = {}
        self._zygote: _Zygote | None = None
        self._in_flight: tuple[_Worker, dict | None] | None = None
        self._start_seconds = 0.0

    def partition(self, text: str, num_devices: int, *, to_output: bool, to_parameters: bool,
                  inputs: list | None = None, output_shapes: list | None = None,
                  variants: list[str] = ()) -> XlaAnswer:
        """XLA's input to propagation, its propagated and its partitioned module for `text` on
        `num_devices` partitions (with the two propagation options), and with `inputs` (global
        arrays of the entry parameters' array leaves) the global outputs of its partitioned
        program (`output_shapes`: the dims of the result's array leaves). `variants`: modules of
        the same signature answered the same way when `text` compiles (`XlaAnswer.variants`)."""
        self.send(text, num_devices, to_output=to_output, to_parameters=to_parameters,
                  inputs=inputs, output_shapes=output_shapes, variants=variants)
        return self.receive()

    def send(self, text: str, num_devices: int, *, to_output: bool, to_parameters: bool,
             inputs: list | None = None, output_shapes: list | None = None,
             variants: list[str] = ()) -> None:
        """Start `partition` without waiting: XLA works on it while the caller does something
        else; `receive` gives the answer. One request is in flight at a time."""
        if self._in_flight is not None:
            raise RuntimeError("receive the answer of the request in flight first")
        started = time.monotonic()
        worker = self._worker(num_devices)
        self._start_seconds = time.monotonic() - started
        failed = worker.send({"text": text, "to_output": to_output,
                              "to_parameters": to_parameters, "inputs": inputs,
                              "output_shapes": output_shapes, "variants": list(variants)})
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
            worker.log.close()
            del self._workers[worker.num_devices]
        return _answer(reply, {"XLA start": self._start_seconds})

    def _worker(self, num_devices: int) -> _Worker:
        worker = self._workers.get(num_devices)
        if worker is None or not worker.alive:
            if self._zygote is None or not self._zygote.alive:
                self._zygote = _Zygote()
            worker = self._workers[num_devices] = _Worker(self._zygote, num_devices,
                                                          self.excess_precision)
        return worker

    def close(self) -> None:
        self._in_flight = None
        for worker in self._workers.values():
            worker.close()
            worker.log.close()
        self._workers.clear()
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None

    def __enter__(self) -> "XlaOracle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
