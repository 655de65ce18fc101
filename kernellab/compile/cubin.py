"""Read what we need out of a cubin (an ELF file): kernel entries, register counts, launch bounds, shared sizes,
compile-time cluster shapes."""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass

EIATTR_MAX_THREADS = 0x05
EIATTR_REGCOUNT = 0x2F
EIATTR_CTA_PER_CLUSTER = 0x3D   # __cluster_dims__(x, y, z): three u32
STO_CUDA_ENTRY = 0x10


@dataclass(frozen=True)
class CubinKernel:
    """Facts the cubin records for one entry function."""

    symbol: str
    registers: int | None
    max_threads: tuple[int, int, int] | None   # __launch_bounds__ / __maxntid__
    shared_section_bytes: int                  # .nv.shared.<fn>: includes the 1 KiB system reservation on sm_80+
    cluster_dims: tuple[int, int, int] | None = None   # __cluster_dims__: the cluster shape fixed at compile time


def _sections(data: bytes):
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    secs = []
    for i in range(shnum):
        name, typ, flags, addr, off, size, link, info, align, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", data, shoff + i * shentsize)
        secs.append(dict(name_off=name, type=typ, offset=off, size=size, link=link, info=info, entsize=entsize))
    strtab = secs[shstrndx]
    for s in secs:
        s["name"] = _cstr(data, strtab["offset"] + s["name_off"])
    return secs


def _cstr(data: bytes, off: int) -> str:
    end = data.index(b"\0", off)
    return data[off:end].decode(errors="replace")


def _attrs(data: bytes, sec: dict):
    """Yield (attr, payload bytes) from an .nv.info section."""
    off, end = sec["offset"], sec["offset"] + sec["size"]
    while off + 4 <= end:
        fmt, attr, val = struct.unpack_from("<BBH", data, off)
        off += 4
        if fmt == 4:  # EIFMT_SVAL: val is the payload size
            yield attr, data[off:off + val]
            off += val
        else:
            yield attr, struct.pack("<H", val)


def cubin_arch(data: bytes) -> str | None:
    """The target a cubin was assembled for, 'a'/'f' suffix included ('sm_90a'), or None where it does not say.

    The ELF header's flags and `.note.nv.cuinfo` hold only the SM number (90 for sm_90 and sm_90a alike); the
    suffix is in the ptxas command line that `.note.nv.tkinfo` records ("-arch sm_90a").
    """
    secs = _sections(data)
    sm = None
    for s in secs:
        body = data[s["offset"]:s["offset"] + s["size"]]
        if s["name"] == ".note.nv.tkinfo":
            m = re.search(rb"-arch\s+(sm_\d+[af]?)\b", body)
            if m:
                return m.group(1).decode()
        elif s["name"] == ".note.nv.cuinfo" and len(body) >= 28:
            namesz, = struct.unpack_from("<I", body, 0)
            desc = 12 + -(-namesz // 4) * 4            # the note's descriptor: u16 version, u16 SM number, ...
            if len(body) >= desc + 4:
                sm = struct.unpack_from("<H", body, desc + 2)[0]
    return f"sm_{sm}" if sm else None


def read_cubin(data: bytes) -> dict[str, CubinKernel]:
    """Map each entry symbol to what the cubin says about it."""
    secs = _sections(data)
    symtab = next((s for s in secs if s["type"] == 2), None)  # SHT_SYMTAB
    if symtab is None:
        return {}
    strtab = secs[symtab["link"]]
    syms = []
    for i in range(symtab["size"] // 24):
        name_off, info, other, shndx, value, size = struct.unpack_from("<IBBHQQ", data, symtab["offset"] + 24 * i)
        syms.append((_cstr(data, strtab["offset"] + name_off), info, other, shndx))
    entries = [name for name, info, other, shndx in syms if (info & 0xF) == 2 and (other & 0xF0) == STO_CUDA_ENTRY]
    regs: dict[str, int] = {}
    for s in secs:
        if s["name"] == ".nv.info":
            for attr, payload in _attrs(data, s):
                if attr == EIATTR_REGCOUNT and len(payload) >= 8:
                    idx, count = struct.unpack_from("<II", payload)
                    if idx < len(syms):
                        regs[syms[idx][0]] = count
    out = {}
    by_name = {s["name"]: s for s in secs}
    for name in entries:
        max_threads = cluster = None
        info = by_name.get(f".nv.info.{name}")
        if info is not None:
            for attr, payload in _attrs(data, info):
                if attr == EIATTR_MAX_THREADS and len(payload) >= 12:
                    max_threads = struct.unpack_from("<III", payload)
                elif attr == EIATTR_CTA_PER_CLUSTER and len(payload) >= 12:
                    cluster = struct.unpack_from("<III", payload)
        shared = by_name.get(f".nv.shared.{name}")
        out[name] = CubinKernel(symbol=name, registers=regs.get(name), max_threads=max_threads,
                                shared_section_bytes=shared["size"] if shared else 0, cluster_dims=cluster)
    return out
