"""The XLA side of the oracle, run in a worker process (`python -m ... xla_worker N`): XLA's own
sharding propagation and SPMD partitioner (jax/jaxlib 0.10.2, CPU) on annotated HLO text, and
XLA's partitioned program run on N host devices (`python -m ... xla_worker N [excess]`: with
`excess`, XLA's default `--xla_allow_excess_precision=true`, else false).

jax fixes its device count when its backend starts, so one worker serves one N for its whole
life. Workers are forked from a zygote process that has imported jax once (`zygote`), so a
worker starts in a fraction of a second instead of jax's import time. The worker reads requests from standard input and writes answers to its original standard
output, both as pickled dicts (pickle frames are self-delimiting); whatever XLA prints goes to
standard error. A request is

    {"text": str, "to_output": bool, "to_parameters": bool, "inputs": list | None,
     "output_shapes": list, "variants": list[str]}

(`inputs`: the global arrays of the entry parameters' array leaves, in order, or None for no run;
`output_shapes`: the global dims of the result's array leaves, in order; `variants`, optional:
more modules of the same signature, each compiled and run the same way, e.g. the module with one
conditional branch forced)
and the answer is

    {"ok": True, "before": str, "propagated": str, "spmd": str, "outputs": list | None,
     "seconds": dict, "variants": list[dict]}
    {"ok": False, "stage": "compile" | "run", "error": str, "seconds": dict}

(`seconds`: where the worker's time went, "XLA compile" (with reading the dumps), "XLA run";
`variants`: an answer of this form, without variants, for each variant)

`before` is the module XLA's sharding-propagation pass starts from (after its import and the
passes before it: call inlining, conditional canonicalization), `propagated` the module after
that pass and `spmd` after its spmd-partitioning pass, as XLA dumps them; `outputs` are the global arrays of the result's leaves
computed by the compiled (partitioned, optimized) executable. A C++ check failure kills the
worker; the client (`oracle.py`) sees the pipe close and starts a new one.

Compile path: XLA's HLO text parser, HLO -> StableHLO import, then the PJRT CPU client with
`num_partitions=N`, `use_spmd_partitioning`, GSPMD (not Shardy) and the two propagation options
`allow_spmd_sharding_propagation_to_output` / `_to_parameters` of the executable build options.
The import flattens tuple-shaped entry parameters into one parameter per leaf, folds tuples and
get-tuple-elements and renames instructions, which is why gspmdc is given `before` (see
`differential.py`).
"""
from __future__ import annotations

import os
import pickle
import re
import sys
import tempfile
import time
import traceback

DUMP_PASSES = "sharding-propagation|spmd-partitioning"
IMPORTED_DUMP = ".before_optimizations.txt"
BEFORE_DUMP = ".before_sharding-propagation.txt"
PROPAGATED_DUMP = ".before_spmd-partitioning.txt"
SPMD_DUMP = ".after_spmd-partitioning."
#: where XLA's dumps go: memory (tmpfs) where there is one, since XLA writes a dozen files per
#: compile (LLVM IR, object files, buffer assignments: a quarter of the compile time on a disk)
DUMP_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
#: the position comments XLA writes into tuples of more than five elements
INDEX_COMMENT = re.compile(r"/\*index=\d+\*/")


def configure(num_devices: int, excess_precision: bool = False) -> None:
    """Set XLA's flags before jax is imported: N host devices, bf16 rounded after every op (as
    gspmdc's interpreter does with `rounding="per-op"`) unless `excess_precision` (XLA's default,
    gspmdc's `"xla"` rounding), large constants written out in dumps, the CPU platform."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith(("--xla_force_host_platform_device_count",
                                  "--xla_allow_excess_precision",
                                  "--xla_dump_large_constants"))]
    flags += [f"--xla_force_host_platform_device_count={num_devices}",
              f"--xla_allow_excess_precision={'true' if excess_precision else 'false'}",
              "--xla_dump_large_constants=true"]      # `before` must keep every literal
    os.environ["XLA_FLAGS"] = " ".join(flags)
    os.environ["JAX_PLATFORMS"] = "cpu"


class XlaCompiler:
    """Compiles and runs annotated HLO text on this process's N host devices."""

    def __init__(self, num_devices: int):
        import jax
        jax.config.update("jax_use_shardy_partitioner", False)
        jax.config.update("jax_enable_x64", True)      # 64-bit inputs stay 64-bit
        self.jax = jax
        self.num_devices = num_devices
        self.devices = jax.devices()[:num_devices]
        if len(self.devices) != num_devices:
            raise RuntimeError(f"jax sees {len(jax.devices())} devices, wanted {num_devices}")

    def compile(self, text: str, to_output: bool, to_parameters: bool, dump_dir: str):
        import numpy as np
        from jax._src import xla_bridge
        from jax._src.lib import _jax, xla_client as xc
        from jaxlib import _hlo
        module = _hlo.hlo_module_from_text(text)
        stablehlo = _jax.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
        options = xc.CompileOptions()
        build = options.executable_build_options
        build.num_replicas = 1
        build.num_partitions = self.num_devices
        build.use_spmd_partitioning = True
        build.use_shardy_partitioner = False
        build.allow_spmd_sharding_propagation_to_output = [to_output]
        build.allow_spmd_sharding_propagation_to_parameters = [to_parameters]
        build.device_assignment = xc.DeviceAssignment.create(
            np.arange(self.num_devices).reshape(1, self.num_devices))
        debug = build.debug_options
        debug.xla_dump_to = dump_dir
        debug.xla_dump_hlo_pass_re = DUMP_PASSES
        debug.xla_dump_hlo_pipeline_re = "spmd-partitioner"
        debug.xla_dump_hlo_as_text = True
        debug.xla_cpu_enable_fast_math = False
        debug.xla_backend_optimization_level = 0
        debug.xla_llvm_disable_expensive_passes = True
        devices = xc.DeviceList(tuple(self.devices))
        return xla_bridge.get_backend("cpu").compile_and_load(stablehlo, devices, options)

    def run(self, executable, inputs: list, output_shapes: list) -> list:
        """The executable on global `inputs` placed by its parameter shardings (replicated when it
        has none: XLA did not partition a module without shardings); the global outputs (of `output_shapes`, the result's leaves) assembled by its output shardings.

        XLA takes an unevenly sharded parameter as equal padded shards (each dim rounded up to
        a multiple of its tile count): inputs are padded with garbage (`_garbage`: the
        partitioned program must not read padding; gspmdc's runs pad the same way). Its uneven
        outputs come back unpadded, the last tiles shorter."""
        import numpy as np
        from jax._src.sharding_impls import GSPMDSharding
        jax = self.jax
        shardings = executable.get_parameter_shardings() or [_replicated()] * len(inputs)
        if len(shardings) != len(inputs):
            raise RuntimeError(f"XLA's executable takes {len(shardings)} arguments, "
                               f"{len(inputs)} given")
        arrays = []
        for value, sharding in zip(inputs, shardings):
            value = np.asarray(value)
            padded = _pad(value, _padded_dims(value.shape, sharding))
            placed = GSPMDSharding(self.devices, sharding)
            arrays.append(jax.make_array_from_callback(padded.shape, placed,
                                                       lambda index, v=padded: v[index]))
        results = executable.execute_sharded(arrays).disassemble_into_single_device_arrays()
        return [self._assemble(pieces, sharding, shape) for pieces, sharding, shape
                in zip(results, executable.get_output_shardings() or [_replicated()] * len(results),
                       output_shapes)]

    def _assemble(self, pieces, op_sharding, dims):
        """The global output from its per-device pieces: each piece at the place of its tile in
        the padded value (`_padded_dims`), cut to `dims` (the last tiles of an uneven dim come
        back shorter)."""
        import numpy as np
        from jax._src.lib import xla_client as xc
        from jax._src.sharding_impls import GSPMDSharding
        sharding = xc.HloSharding.from_proto(op_sharding)
        by_device = {next(iter(p.devices())): np.asarray(p) for p in pieces}
        if not sharding.is_tiled():
            maximal = sharding.is_maximal() and not sharding.is_replicated()
            device = self.devices[sharding.tile_assignment_devices()[0] if maximal else 0]
            return by_device[device]
        places = GSPMDSharding(self.devices, op_sharding).devices_indices_map(
            _padded_dims(dims, op_sharding))
        out = np.empty(dims, dtype=next(iter(by_device.values())).dtype)
        for device, index in places.items():
            window = tuple(slice(s.start or 0, min(s.stop if s.stop is not None else d, d))
                           for s, d in zip(index, dims))
            out[window] = by_device[device][tuple(slice(0, max(0, w.stop - w.start))
                                                  for w in window)]
        return out

    def answer(self, request: dict) -> dict:
        reply = self._answer_one(request)
        if reply["ok"]:
            reply["variants"] = [self._answer_one({**request, "text": text})
                                 for text in request.get("variants", ())]
            for variant in reply["variants"]:
                for stage, seconds in variant["seconds"].items():
                    reply["seconds"][stage] = reply["seconds"].get(stage, 0.0) + seconds
        return reply

    def _answer_one(self, request: dict) -> dict:
        seconds = {}
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="xla-oracle-", dir=DUMP_ROOT) as dump_dir:
            try:
                executable = self.compile(request["text"], request["to_output"],
                                          request["to_parameters"], dump_dir)
                before, propagated, spmd = _read_dumps(dump_dir)
            except Exception as e:  # XLA's errors arrive as XlaRuntimeError/ValueError
                return {"ok": False, "stage": "compile", "error": _first_line(e),
                        "seconds": {"XLA compile": time.monotonic() - started}}
        seconds["XLA compile"] = time.monotonic() - started
        outputs = None
        if request.get("inputs") is not None:
            started = time.monotonic()
            try:
                outputs = self.run(executable, request["inputs"], request["output_shapes"])
            except Exception as e:
                return {"ok": False, "stage": "run", "error": _first_line(e),
                        "before": before, "propagated": propagated, "spmd": spmd,
                        "seconds": seconds}
            seconds["XLA run"] = time.monotonic() - started
        return {"ok": True, "before": before, "propagated": propagated, "spmd": spmd,
                "outputs": outputs, "seconds": seconds}


def _replicated():
    from jax._src.lib import xla_client as xc
    return xc.HloSharding.replicate().to_proto()


def _padded_dims(dims, sharding) -> tuple:
    """`dims` rounded up to multiples of the tile counts of `sharding` (an XLA OpSharding)."""
    from jax._src.lib import xla_client as xc
    sharding = xc.HloSharding.from_proto(sharding)
    if not sharding.is_tiled() or \
            sharding.tuple_elements():
        return tuple(dims)
    tiles = sharding.tile_assignment_dimensions()
    return tuple(-(-d // t) * t for d, t in zip(dims, tiles))


def _pad(value, dims):
    import numpy as np
    if tuple(value.shape) == tuple(dims):
        return value
    out = np.full(dims, _garbage(value.dtype), dtype=value.dtype)
    out[tuple(slice(0, d) for d in value.shape)] = value
    return out


def _garbage(dtype):
    """What padding holds: NaN for floats, the largest value for integers, True for pred."""
    import numpy as np
    if dtype.kind in "fc" or dtype.name in ("bfloat16",) or "float" in dtype.name:
        return np.nan
    if dtype.kind == "b":
        return True
    return np.iinfo(dtype).max


def _read_dumps(dump_dir: str) -> tuple[str, str, str]:
    """`before`, `propagated` and `spmd` from XLA's dumps, without the `/*index=N*/` comments
    XLA writes into long tuples (they mean nothing, and text without comments is read by
    gspmdc's fast reader instead of the grammar: several times faster). XLA skips its spmd-partitioner
    pipeline for a module without any sharding (every device runs the whole program): then the
    module as imported (`before_optimizations`) is all three."""
    files = sorted(os.listdir(dump_dir))

    def pick(tag: str) -> str | None:
        hits = [f for f in files if tag in f and f.endswith(".txt")]
        if not hits:
            return None
        with open(os.path.join(dump_dir, hits[-1])) as f:
            return INDEX_COMMENT.sub("", f.read())

    before, propagated, spmd = pick(BEFORE_DUMP), pick(PROPAGATED_DUMP), pick(SPMD_DUMP)
    if before is None and propagated is None and spmd is None:
        imported = pick(IMPORTED_DUMP)
        if imported is not None:
            return imported, imported, imported
    if before is None or propagated is None or spmd is None:
        raise RuntimeError(f"XLA's dumps lack a module before or after propagation: {files}")
    return before, propagated, spmd


def _first_line(e: BaseException) -> str:
    """The error's first three lines (XLA's parser puts the position on the second)."""
    text = str(e).strip() or type(e).__name__
    return f"{type(e).__name__}: " + " | ".join(text.splitlines()[:3])[:600]


def serve(num_devices: int, excess_precision: bool = False) -> None:
    """Answer requests on stdin until it closes (see the module docstring)."""
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                      # anything XLA or jax prints goes to stderr
    configure(num_devices, excess_precision)
    try:
        compiler = XlaCompiler(num_devices)
    except Exception:
        pickle.dump({"ok": False, "stage": "start", "error": traceback.format_exc()}, answers)
        answers.flush()
        return
    pickle.dump({"ok": True, "ready": num_devices}, answers)
    answers.flush()
    requests = sys.stdin.buffer
    while True:
        try:
            request = pickle.load(requests)
        except EOFError:
            return
        pickle.dump(compiler.answer(request), answers)
        answers.flush()


def zygote(channel_fd: int) -> None:
    """Import jax once, then fork a worker (`serve`) per request on the Unix socket
    `channel_fd` (SOCK_SEQPACKET), so that starting a worker (the first for a device count, or
    the replacement of one XLA killed) takes a fork instead of jax's import. jax reads the
    device count and the other XLA flags when its CPU backend starts, which each worker does
    after the fork. Messages (client -> zygote, reply):

        b"fork N E" + fds (requests, answers, log)  ->  b"pid P"   (E: 1 = excess precision)
        b"reap P T"                                 ->  b"status S" (exit status as subprocess
                                                                    gives it; killed after T s)

    The zygote starts with b"ready" (or b"error ..."), and ends when the socket closes."""
    import signal
    import socket
    import time
    channel = socket.socket(fileno=channel_fd)
    try:
        os.environ["JAX_PLATFORMS"] = "cpu"
        import jax  # noqa: F401 - imported once here, inherited by every forked worker
        from jax._src import sharding_impls, xla_bridge  # noqa: F401
        from jax._src.lib import _jax, xla_client  # noqa: F401
        from jaxlib import _hlo  # noqa: F401
        import numpy  # noqa: F401
    except Exception:
        channel.send(b"error " + traceback.format_exc().encode()[-2000:])
        return
    channel.send(b"ready")
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(channel, 1024, 3)
        except OSError:
            return
        if not message:
            return
        words = message.decode().split()
        if words[0] == "fork":
            pid = os.fork()
            if pid == 0:
                channel.close()
                for target, fd in zip((0, 1, 2), fds):
                    os.dup2(fd, target)
                    os.close(fd)
                code = 0
                try:
                    serve(int(words[1]), words[2] == "1")
                except BaseException:  # noqa: BLE001 - the client sees the pipe close
                    traceback.print_exc()
                    code = 1
                finally:
                    sys.stderr.flush()
                    os._exit(code)
            for fd in fds:
                os.close(fd)
            channel.send(f"pid {pid}".encode())
        elif words[0] == "reap":
            pid, deadline = int(words[1]), time.monotonic() + float(words[2])
            done, status = os.waitpid(pid, os.WNOHANG)
            while not done and time.monotonic() < deadline:
                time.sleep(0.01)
                done, status = os.waitpid(pid, os.WNOHANG)
            if not done:
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
            channel.send(f"status {os.waitstatus_to_exitcode(status)}".encode())


if __name__ == "__main__":
    if sys.argv[1] == "zygote":
        zygote(int(sys.argv[2]))
    else:
        serve(int(sys.argv[1]), sys.argv[2:] == ["excess"])
