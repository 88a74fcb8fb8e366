"""`gspmdc show`: the sharding of values as pictures in the terminal."""
from __future__ import annotations

import argparse
import difflib
import os
import sys

from gspmdc.commands.arguments import add_num_partitions, positive_int
from gspmdc.errors import EXIT_OK, GspmdcError


def cmd_show(args: argparse.Namespace) -> int:
    """Draw which device holds which tile of each INSTRUCTION's value (default: the entry's
    parameters and result): dimensions split how many ways and over which mesh axes, uneven
    tiles with their padding, partially replicated tiles with every device holding them, any
    rank (one grid per tile of the leading dimensions). A global program is propagated first,
    as compile propagates it (every value gets its sharding); in a partitioned one, shapes are
    per device. Mesh axis names come from --mesh, else the module's mesh={...} header, else its
    Shardy mesh (`xla.sdy.meshes`: the first one over all the program's devices)."""
    from gspmdc import api
    from gspmdc.ir.stage import Stage, module_stage
    from gspmdc.partitioned import partition_count
    from gspmdc.passes.pass_manager import PassContext, run_pipeline
    from gspmdc.passes.pipeline import default_propagation, partitioner_pipeline
    from gspmdc.sharding_picture import describe_value
    module = api.load(args.file)
    n = partition_count(module, args.num_partitions, args.file)
    stage = module_stage(module)
    mesh = _mesh(args.mesh) if args.mesh is not None else \
        module.attrs.get("mesh") or _shardy_mesh(module, n)
    if stage is Stage.GLOBAL:       # propagated as compile does (Shardy's for a Shardy-form module)
        passes = partitioner_pipeline(propagation=default_propagation(module))
        names = [p.name for p in passes]
        run_pipeline(PassContext(n), module, passes[:names.index("insert-reshards")])
    if mesh is not None and mesh.num_devices != n:
        raise GspmdcError(f"the mesh {mesh.to_text()} has {mesh.num_devices} devices, the "
                          f"program runs on {n}")
    colour = args.color == "always" or (args.color == "auto" and sys.stdout.isatty()
                                        and os.environ.get("TERM") != "dumb")
    values = [_find(module, name) for name in args.instructions] if args.instructions else \
        module.entry.parameters + [module.entry.root]
    lines = []
    for inst in values:
        lines += describe_value(inst.name, inst.shape, inst.sharding, n, mesh, colour,
                                args.width, per_device_shape=stage is Stage.PARTITIONED)
    sys.stdout.write("\n".join(lines).rstrip("\n") + "\n")
    return EXIT_OK


def _shardy_mesh(module, n: int):
    """The first mesh of the module's `xla.sdy.meshes` that spans its `n` devices, or None."""
    from gspmdc.ir.mesh import Mesh
    from gspmdc.ir.sdy import module_meshes
    meshes = module_meshes(module)
    for _, mesh in meshes.meshes if meshes is not None else ():
        if isinstance(mesh, Mesh) and mesh.num_devices == n:
            return mesh
    return None


def _mesh(text: str):
    """`x=2,y=4` as a Mesh (devices in iota order)."""
    from gspmdc.ir.mesh import Mesh
    names, sizes = [], []
    for item in text.split(","):
        name, _, size = item.strip().partition("=")
        if not name or not size.strip().isdigit():
            raise GspmdcError(f"--mesh {text}: expected axis=size pairs such as x=2,y=4")
        names.append(name.strip())
        sizes.append(int(size))
    return Mesh(names, sizes)


def _find(module, name: str):
    computation, _, short = name.rpartition(":")
    found = [inst for comp, inst in module.all_instructions()
             if inst.name == short and (not computation or comp.name == computation)]
    if len(found) == 1:
        return found[0]
    if found:
        places = [comp.name for comp, inst in module.all_instructions() if inst.name == short]
        raise GspmdcError(f"{name!r} names an instruction of several computations "
                          f"({', '.join(places)}): write computation:{short}")
    names = sorted({inst.name for _, inst in module.all_instructions()})
    close = difflib.get_close_matches(short, names, n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise GspmdcError(f"module {module.name} has no instruction named {name!r}{hint}")


def register(sub) -> None:
    p = sub.add_parser("show", help="draw which device holds which tile of a value",
                       description=cmd_show.__doc__)
    p.add_argument("file", help="HLO text file, global or partitioned ('-' for stdin)")
    p.add_argument("instructions", nargs="*", metavar="INSTRUCTION",
                   help="values to draw (name, or computation:name; default: the entry's "
                        "parameters and result)")
    add_num_partitions(p, help="number of devices (default: the module's num_partitions, else "
                               "the devices its shardings name)")
    p.add_argument("--mesh", metavar="AXES", help="name the device mesh's axes, e.g. x=2,y=4 "
                   "(devices in row-major order), when the module has no mesh header")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour each tile (default: when writing to a terminal)")
    p.add_argument("--width", type=positive_int, default=72, metavar="COLUMNS",
                   help="width of the grids (default 72)")
    p.set_defaults(run=cmd_show)
