"""gspmdc.ir: shapes, shardings, the module/computation/instruction IR, the HLO text parser and
printer, and the verifier."""
