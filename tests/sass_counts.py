"""Opcode counts of one kernel's SASS, for tests that pin what a kernel compiles to (loads, stores, atomics)."""
import re

_OPCODE = re.compile(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def sass_ops(kernel) -> dict[str, int]:
    """{opcode: count} over `kernel.sass` (the first word of each instruction, its predicate dropped)."""
    ops: dict[str, int] = {}
    for line in kernel.sass.splitlines():
        m = _OPCODE.search(line)
        if m:
            ops[m.group(1)] = ops.get(m.group(1), 0) + 1
    return ops


def assert_registers_only_and_deterministic(kernels) -> None:
    """Each kernel: no spills, no stack frame (no LDL/STL in its SASS) and no atomics (ATOM/RED: the same bits every
    run)."""
    for k in kernels:
        r = k.resources
        assert not r.spills and r.local_bytes == 0, (k.signature.display, r)
        ops = sass_ops(k)
        assert not any(op.startswith(("LDL", "STL")) for op in ops), (k.signature.display, ops)
        assert not any(op.startswith(("ATOM", "RED")) for op in ops), (k.signature.display, ops)
