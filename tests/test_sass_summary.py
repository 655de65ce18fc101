"""Kernel.instruction_summary on real compiled kernels (NVRTC + cuobjdump, no GPU): mma.sync and WMMA give HMMA, wgmma
(sm_90a) gives HGMMA, cp.async gives LDGSTS, ldmatrix LDSM, TMA UTMALDG, float4 loads LDG.128, a run-time-indexed
array LDL/STL; the card and the report JSON show it. The opcode parser and classifier on hand-picked lines."""
import pytest
from hopper_sources import MMA_SYNC, TMA_COPY, WGMMA, WMMA

import kernellab
from kernellab.compile import disasm
from kernellab.compile.sass_summary import (InstructionSummary, access_bits, classify, opcode_of, split_functions,
                                            summarize)

CUDA_CORES = r"""
__global__ void vec_copy(const float4* __restrict__ a, float4* __restrict__ b, int n) {
    __shared__ float4 s[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) s[threadIdx.x] = a[i];
    __syncthreads();
    if (i < n) b[i] = s[255 - threadIdx.x];
}
__global__ void fma_loop(const float* a, float* c, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float acc = 0.f;
    for (int j = 0; j < k; ++j) acc = fmaf(a[j], acc, 1.0f);
    if (i < n) c[i] = __expf(acc);
}
__global__ void spills(const float* a, const int* idx, float* c, int n) {
    float t[64];                                  // indexed at run time: the array lives in local memory
    for (int j = 0; j < 64; ++j) t[j] = a[j * n + threadIdx.x];
    t[idx[threadIdx.x] & 63] += 1.0f;
    float s = 0.f;
    for (int j = 0; j < 64; ++j) s += t[(j * 7 + idx[j]) & 63];
    c[threadIdx.x] = s;
}
"""


@pytest.fixture(scope="module")
def sm90():
    return kernellab.compile_cuda(MMA_SYNC + WMMA + CUDA_CORES, arch="sm_90")


@pytest.fixture(scope="module")
def sm90a():
    return kernellab.compile_cuda(WGMMA + TMA_COPY, arch="sm_90a")


def test_opcode_of_reads_instruction_lines_only():
    assert opcode_of("        /*0170*/                   @!P0 LDG.E.128 R4, desc[UR4][R2.64] ;   /* 0x0 */") == \
        "LDG.E.128"
    assert opcode_of("  /*0a40*/  HMMA.16816.F32.BF16 R4, R8, R12, R4 ;") == "HMMA.16816.F32.BF16"
    assert opcode_of("  /*0a50*/  @!UPT UIADD3 UR4, UR4, 0x1, URZ ;") == "UIADD3"
    assert opcode_of("  /*0a60*/  @P1 BRA 0x180 ;") == "BRA"
    assert opcode_of("  /*0a70*/  EXIT ;") == "EXIT"
    for other in ("                                     /* 0x000fe20000000800 */", "\t\tFunction : vadd",
                  '\t.headerflags\t@"EF_CUDA_SM90"', "", "\tcode for sm_90"):
        assert opcode_of(other) is None


def test_classify_groups_and_widths():
    assert classify("HMMA.16816.F32.BF16") == ("tensor cores", "HMMA")
    assert classify("HGMMA.64x128x16.F32.BF16") == ("tensor cores", "HGMMA")
    assert classify("QGMMA.64x64x32.F32.E4M3.E4M3") == ("tensor cores", "QGMMA")
    assert classify("IMMA.16832.S8.S8") == ("tensor cores", "IMMA")
    assert classify("HFMA2.MMA") == (None, "HFMA2")              # an FMA on the MMA pipe, not a matrix product
    assert classify("UTMALDG.2D") == ("TMA", "UTMALDG") and classify("UTMASTG.3D") == ("TMA", "UTMASTG")
    assert classify("LDGSTS.E.BYPASS.LTC128B.128") == ("async copies", "LDGSTS")
    assert classify("LDSM.16.MT88.4") == ("matrix load/store", "LDSM")
    assert classify("LDG.E.128.CONSTANT") == ("global memory", "LDG.128")
    assert classify("STG.E.U16") == ("global memory", "STG.16")
    assert classify("LDS.U.64") == ("shared memory", "LDS.64") and classify("STS.U8") == ("shared memory", "STS.8")
    assert classify("LDS") == ("shared memory", "LDS.32") and classify("STL.128") == ("local memory", "STL.128")
    assert classify("REDG.E.ADD.F32.FTZ.RN.STRONG.GPU") == ("atomics", "REDG")
    assert classify("MUFU.EX2") == ("special functions", "MUFU") and classify("BAR.SYNC.DEFER_BLOCKING")[0] == "barriers"
    assert access_bits("LDG.E.S8") == 8 and access_bits("LDG.E") == 32


def test_mma_sync_kernel_shows_hmma_ldsm_and_ldgsts(sm90):
    s = sm90.mma_tile.instruction_summary
    assert s.variants == {"HMMA.16816.F32.BF16": sm90.mma_tile.sass.count("HMMA.16816.F32.BF16")} and s["HMMA"] >= 1
    assert s["LDSM"] == sm90.mma_tile.sass.count(" LDSM.") >= 2        # x4 for A, x2.trans for B
    assert s["LDGSTS"] >= 2 and s["HGMMA"] == 0 and s["tensor cores"] == s["HMMA"]
    assert s.tensor_core_path == "mma"
    assert s.headline().startswith(f"tensor cores: {s['HMMA']} HMMA.16816.F32.BF16; async copies: {s['LDGSTS']} LDGSTS")
    assert s["LDL"] == s["STL"] == 0 and "local memory: none" in s.headline()


def test_wmma_kernel_shows_hmma(sm90):
    s = sm90.wmma_tile.instruction_summary
    assert s["HMMA"] >= 1 and all(k.startswith("HMMA.16816.F32") for k in s.variants) and s.tensor_core_path == "mma"


def test_wgmma_kernel_for_sm90a_shows_hgmma(sm90a):
    s = sm90a.wgmma_tile.instruction_summary
    assert s.variants == {"HGMMA.64x8x16.F32.BF16": 1} and s["HMMA"] == 0 and s.tensor_core_path == "wgmma"
    assert "tensor cores: 1 HGMMA.64x8x16.F32.BF16" in s.headline()


def test_tma_kernel_shows_utmaldg(sm90a):
    s = sm90a.tma_copy.instruction_summary
    assert s["UTMALDG"] == 1 and s["TMA"] == 1 and s.tensor_core_path is None
    assert "TMA: 1 UTMALDG" in s.headline()


def test_cuda_core_kernels_by_width_fp32_mufu_and_local_memory(sm90):
    v = sm90.vec_copy.instruction_summary
    assert v["LDG.128"] == 1 and v["STG.128"] == 1 and v["LDS.128"] == 1 and v["STS.128"] == 1 and v["BAR"] == 1
    assert v["LDG"] == 1 and v.group("shared memory") == {"LDS.128": 1, "STS.128": 1}
    f = sm90.fma_loop.instruction_summary
    assert f["FFMA"] >= 1 and f["MUFU"] >= 1 and f.tensor_core_path is None
    assert f.headline().startswith(f"no tensor cores, fp32: {f['FFMA']:,} FFMA")
    sp = sm90.spills.instruction_summary
    assert sp["LDL"] >= 1 and sp["STL"] >= 1 and sm90.spills.resources.local_bytes > 0
    assert "local memory: " in sp.headline() and "local memory: none" not in sp.headline()


def test_summary_text_html_and_json(sm90):
    s = sm90.mma_tile.instruction_summary
    text = str(s)
    assert text.splitlines()[0] == f"{s.total:,} SASS instructions (static counts, not executed)"
    assert "tensor cores" in text and "HMMA.16816.F32.BF16" in text
    assert "<table" in s._repr_html_()
    j = s.to_json()
    assert j["tensor_core_path"] == "mma" and j["groups"]["async copies"] == {"LDGSTS": s["LDGSTS"]}
    assert j["headline"] == s.headline() and j["total"] == s.total > 0


def test_card_and_report_show_the_summary(sm90):
    text = str(sm90)
    assert f"SASS mma_tile: {sm90.mma_tile.instruction_summary.headline()}" in text
    assert "SASS of <b>mma_tile</b>" in sm90._repr_html_()
    report = sm90._repr_mimebundle_()["application/vnd.kernellab.report+json"]
    entry = {k["display"]: k for k in report["kernels"]}["mma_tile"]
    assert entry["instructions"]["counts"]["HMMA"] == sm90.mma_tile.instruction_summary["HMMA"]
    assert entry["instructions"]["tensor_core_path"] == "mma"


def test_kernel_sass_is_its_own_function_from_one_disassembly(sm90):
    whole = disasm.sass(sm90.cubin)
    parts = split_functions(whole)
    assert set(parts) == {k.symbol for k in sm90.kernels}
    for k in sm90.kernels:
        alone = disasm.sass(sm90.cubin, k.symbol)               # cuobjdump -fun: the old way
        ops = [o for o in map(opcode_of, k.sass.splitlines()) if o]
        assert ops == [o for o in map(opcode_of, alone.splitlines()) if o]
        assert summarize(alone).counts == k.instruction_summary.counts


def test_disassembly_is_cached_by_cubin(tmp_cache, monkeypatch):
    src = "__global__ void k(float* x) { x[threadIdx.x] *= 2; }"
    first = kernellab.compile_cuda(src, arch="sm_90")
    assert first.k.instruction_summary.total > 0
    monkeypatch.setattr(disasm, "sass", lambda *a, **k: pytest.fail("disassembled twice"))
    again = kernellab.compile_cuda(src, arch="sm_90")           # a new Module from the compile cache
    assert again is not first and again.k.sass == first.k.sass


def test_empty_summary():
    s = summarize("no instructions here")
    assert s == InstructionSummary() and s.total == 0 and s["HMMA"] == 0 and s.headline() == "local memory: none"
