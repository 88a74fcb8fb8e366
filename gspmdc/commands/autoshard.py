"""`gspmdc autoshard`: choose the shardings of a module on a device mesh."""
from __future__ import annotations

import argparse
import sys

from gspmdc.errors import EXIT_OK, GspmdcError

from .arguments import byte_count, mesh_shape, output_file, positive_float


def cmd_autoshard(args: argparse.Namespace) -> int:
    """Choose a sharding for every instruction of FILE on the device mesh --mesh (axis names
    and sizes, e.g. x=2,y=4): the plan of least modelled step time (computation and
    communication on --machine, a preset or machine file as for `gspmdc cost`) whose peak
    memory per device, as `gspmdc cost` reports it for the partitioned plan, is at most
    --memory-per-device. Strategies come from the partitioner's own rules,
    reshard costs from its reshard planner; an integer program (HiGHS) picks one per value.
    Shardings the user gave to entry parameters and to the result pin them; with
    --keep-annotations every sharding in FILE is kept as a pin. Writes the annotated module
    (stdout, or -o atomically), which `compile` and `run` take as it is; each chosen sharding
    records the alternatives rejected and their modelled costs, which `explain` prints. The
    summary goes to standard error. When no plan fits the memory limit, says so (exit 2, nothing
    written)."""
    from gspmdc import api
    from gspmdc.passes.autoshard import autoshard
    from gspmdc.passes.analysis.machine import load_machine
    machine = load_machine(args.machine)
    module = api.load(args.file)
    mesh = _mesh(module, args.mesh)
    result = autoshard(module, mesh, memory_per_device=args.memory_per_device,
                       keep_annotations=args.keep_annotations, machine=machine,
                       time_limit=args.time_limit)
    if not result.fits:
        raise GspmdcError(f"no plan fits {args.memory_per_device} bytes per device on mesh "
                          f"{mesh.to_text()}: {result.solution.message}")
    if result.solution.status != "optimal":
        print(f"gspmdc autoshard: {result.solution.message}", file=sys.stderr)
    print(f"gspmdc autoshard: {result.summary()} ({result.timings()})", file=sys.stderr)
    api.write_text(api.to_text(module), args.output)
    return EXIT_OK


def _mesh(module, given):
    """The mesh of --mesh, or of the module's header; both must agree when both are given."""
    header = module.attrs.get("mesh")
    if given is None:
        if header is None:
            raise GspmdcError("autoshard needs a device mesh: give --mesh (e.g. --mesh x=2,y=4) "
                              "or a mesh={...} header")
        return header
    if header is not None and (header.axis_names, header.axis_sizes) != \
            (given.axis_names, given.axis_sizes):
        raise GspmdcError(f"--mesh {given.to_text()} differs from the module's mesh "
                          f"{header.to_text()}")
    return header if header is not None else given


def register(sub) -> None:
    from gspmdc.passes.analysis.machine import PRESETS
    p = sub.add_parser("autoshard", help="choose every instruction's sharding on a device mesh "
                                         "(integer program on the modelled step time)",
                       description=cmd_autoshard.__doc__)
    p.add_argument("file", help="HLO text file ('-' for standard input)")
    p.add_argument("--mesh", type=mesh_shape, metavar="AXES",
                   help="the device mesh, axis=size major to minor (e.g. x=2,y=4; default: the "
                        "module's mesh={...} header)")
    p.add_argument("--memory-per-device", type=byte_count, metavar="BYTES",
                   help="the most memory a device may hold (modelled peak; e.g. 16GiB; "
                        "default: no limit)")
    p.add_argument("--machine", default="tpu-v3", metavar="NAME|FILE",
                   help=f"the machine model the step time is modelled on, as for `gspmdc cost`: "
                        f"a preset ({', '.join(PRESETS)}; default tpu-v3) or a machine file "
                        "written by `gspmdc cost --calibrate`")
    p.add_argument("--keep-annotations", action="store_true",
                   help="keep every sharding of FILE as a pin (default: only those of entry "
                        "parameters and the result)")
    p.add_argument("--time-limit", type=positive_float, default=60.0, metavar="SECONDS",
                   help="the solver's time limit; then the best plan found is used "
                        "(default 60)")
    p.add_argument("-o", "--output", type=output_file,
                   help="write the annotated module here instead of stdout")
    p.set_defaults(run=cmd_autoshard)
