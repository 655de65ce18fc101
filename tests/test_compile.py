"""Compiling CUDA C++ with NVRTC (no GPU): kernels, resources against the compiler's own report, PTX, SASS, errors."""
import re
import subprocess

import pytest

import kernellab
from kernellab import CompileError
from kernellab.compile import toolkit
from kernellab.compile.cubin import read_cubin

VADD = r"""
extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""

TRANSPOSE = r"""
template <int TILE>
__global__ void transpose(const float* __restrict__ in, float* __restrict__ out, int n) {
    __shared__ float tile[TILE][TILE + 1];
    int x = blockIdx.x * TILE + threadIdx.x, y = blockIdx.y * TILE + threadIdx.y;
    if (x < n && y < n) tile[threadIdx.y][threadIdx.x] = in[y * n + x];
    __syncthreads();
    x = blockIdx.y * TILE + threadIdx.x; y = blockIdx.x * TILE + threadIdx.y;
    if (x < n && y < n) out[y * n + x] = tile[threadIdx.x][threadIdx.y];
}
template __global__ void transpose<32>(const float*, float*, int);

__global__ void __launch_bounds__(128) scale(double* x, double alpha, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) x[i] *= alpha;
}
"""


def test_compile_finds_every_kernel_extern_c_and_cpp(tmp_cache):
    m = kernellab.compile_cuda(TRANSPOSE + VADD, arch="sm_90")
    names = sorted(k.signature.display for k in m.kernels)
    assert names == ["scale", "transpose<32>", "vadd"]
    assert m["transpose<32>"] is m.transpose
    assert m.scale.symbol.startswith("_Z")          # C++ name, resolved by demangling
    assert m.vadd.symbol == "vadd"                  # extern "C"
    assert [p.name for p in m.vadd.params] == ["a", "b", "c", "n"]
    assert [(p.pointer, p.dtype) for p in m.scale.params] == [(True, "float64"), (False, "float64"), (False, "int64")]
    assert str(m.transpose.signature) == "transpose<32>(float const* in, float* out, int n)"
    with pytest.raises(KeyError, match="its kernels: .*vadd"):
        m["nope"]
    with pytest.raises(AttributeError):
        m.nope


def test_shared_bytes_is_ptxas_figure_not_the_elf_section(tmp_cache):
    m = kernellab.compile_cuda(TRANSPOSE, arch="sm_90")
    r = m.transpose.resources
    assert r.shared_bytes == 32 * 33 * 4 == 4224
    facts = read_cubin(m.cubin)[m.transpose.symbol]
    assert facts.shared_section_bytes == 4224 + 1024  # the cubin's section includes the 1 KiB system reservation
    assert facts.registers == r.registers             # .nv.info REGCOUNT agrees with ptxas


def test_resources_match_cuobjdump_resource_usage(tmp_cache):
    m = kernellab.compile_cuda(TRANSPOSE + VADD, arch="sm_90")
    tool = toolkit.find_tool("cuobjdump")
    assert tool, "cuobjdump wheel missing"
    path = tmp_cache.parent / "k.cubin"
    path.write_bytes(m.cubin)
    out = subprocess.run([tool, "--dump-resource-usage", str(path)], capture_output=True, text=True, check=True).stdout
    for k in m.kernels:
        block = out[out.index(f"Function {k.symbol}:"):]
        line = block.splitlines()[1]
        assert int(re.search(r"REG:(\d+)", line).group(1)) == k.resources.registers
        # cuobjdump counts the .nv.shared section, which adds the 1 KiB system reservation when smem is used
        reserved = 1024 if k.resources.shared_bytes else 0
        assert int(re.search(r"SHARED:(\d+)", line).group(1)) == k.resources.shared_bytes + reserved
        assert int(re.search(r"STACK:(\d+)", line).group(1)) == k.resources.local_bytes


def test_launch_bounds_and_registers_set_max_threads(tmp_cache):
    m = kernellab.compile_cuda(TRANSPOSE + VADD, arch="sm_90")
    assert m.scale.resources.max_threads_per_block == 128
    assert m.vadd.resources.max_threads_per_block == 1024


def test_max_threads_formula_against_driver_attributes():
    """tests/golden/kernel_attrs_sm90.csv: cuFuncGetAttribute on an H200 (tools/gpu/record_occupancy.py)."""
    import csv
    from pathlib import Path

    from kernellab.kernel import max_threads_for

    rows = list(csv.DictReader(l for l in open(Path(__file__).parent / "golden" / "kernel_attrs_sm90.csv")
                               if not l.startswith("#")))
    assert len(rows) >= 100
    for r in rows:
        lb = int(r["launch_bounds"])
        assert max_threads_for(int(r["registers"]), (lb, 1, 1)) == int(r["max_threads_per_block"]), r
    assert max_threads_for(255, None) == 256 and max_threads_for(64, None) == 1024 and max_threads_for(72, None) == 896


def test_spills_and_local_memory_are_reported(tmp_cache):
    src = r"""
    extern "C" __global__ void spill(float* x, int k) {
        float a[64];
        #pragma unroll
        for (int i = 0; i < 64; ++i) a[i] = x[i * 33 + threadIdx.x];
        float s = 0;
        for (int i = 0; i < 64; ++i) s += a[(i * k) & 63];   // run-time index: a goes to local memory
        x[threadIdx.x] = s;
    }"""
    m = kernellab.compile_cuda(src, arch="sm_90", options=["--maxrregcount=32"])
    r = m.spill.resources
    assert r.local_bytes >= 256
    assert r.registers <= 32


def test_ptx_and_sass_are_per_kernel(tmp_cache):
    m = kernellab.compile_cuda(TRANSPOSE + VADD, arch="sm_90")
    assert ".entry vadd(" in m.vadd.ptx and m.scale.symbol not in m.vadd.ptx
    assert m.vadd.ptx.startswith(".version")
    sass = m.transpose.sass
    assert "LDS" in sass and "STS" in sass and "BAR" in sass
    assert "Function : vadd" not in sass


def test_arch_is_honoured(tmp_cache):
    m80 = kernellab.compile_cuda(VADD, arch="sm_80")
    assert m80.arch == "sm_80" and "EF_CUDA_SM80" in m80.vadd.sass
    assert kernellab.compile_cuda(VADD, arch=90).arch == "sm_90"
    with pytest.raises(ValueError, match="not an architecture"):
        kernellab.compile_cuda(VADD, arch="hopper")


def test_no_gpu_default_arch_has_a_note(tmp_cache):
    if kernellab.has_gpu():
        pytest.skip("a GPU is present: arch=None uses it")
    m = kernellab.compile_cuda(VADD)
    assert m.arch == "sm_90"
    assert any("no GPU" in n for n in m.notes)
    assert "no GPU" in str(m)


def test_compile_error_locates_line_and_column(tmp_cache):
    src = "extern \"C\" __global__ void bad(float* x) {\n    int i = threadIdx.x;\n    x[i] = y;\n}\n"
    with pytest.raises(CompileError) as info:
        kernellab.compile_cuda(src, arch="sm_90")
    err = info.value
    (d,) = err.errors
    assert (d.line, d.column, d.severity) == (3, 12, "error")
    assert 'identifier "y" is undefined' in d.message
    text = str(err)
    assert ">3 |     x[i] = y;" in text
    caret = text.splitlines()[text.splitlines().index(" >3 |     x[i] = y;") + 1]
    assert caret.rstrip().endswith("^") and caret.index("^") == " >3 |     x[i] = y;".index("y")


def test_first_line_offsets_diagnostics_like_a_cell(tmp_cache):
    src = "__global__ void k(float* x) {\n  x[0] = undefined_thing;\n}\n"
    with pytest.raises(CompileError) as info:
        kernellab.compile_cuda(src, arch="sm_90", first_line=2)
    assert info.value.errors[0].line == 3
    assert " >3 |   x[0] = undefined_thing;" in str(info.value)


def test_warnings_are_kept(tmp_cache):
    m = kernellab.compile_cuda("__global__ void w(float* x) { int unused; x[0] = 1; }", arch="sm_90")
    (w,) = m.warnings
    assert w.severity == "warning" and "unused" in w.message and w.line == 1
    assert "warning" in str(m) and "warning" in m._repr_html_()


def test_ptxas_errors_are_compile_errors(tmp_cache):
    src = "extern \"C\" __global__ void big(float* x) { __shared__ float t[60000]; t[threadIdx.x] = 1; " \
          "__syncthreads(); x[threadIdx.x] = t[threadIdx.x + 1]; }"
    with pytest.raises(CompileError, match="ptxas.*too much shared data"):
        kernellab.compile_cuda(src, arch="sm_90")


def test_card_text_html_and_report_json(tmp_cache):
    m = kernellab.compile_cuda(TRANSPOSE + VADD, arch="sm_90", name="demo")
    text = str(m)
    assert "transpose<32>" in text and "4224" in text and "cache miss" in text
    html = m._repr_html_()
    assert "<table" in html and "transpose&lt;32&gt;" in html
    bundle = m._repr_mimebundle_()
    j = bundle["application/vnd.kernellab.report+json"]
    assert j["kind"] == "compile" and j["ok"] and j["arch"] == "sm_90" and j["cache"] == "miss"
    k = {k["display"]: k for k in j["kernels"]}["scale"]
    assert k["max_threads_per_block"] == 128 and k["occupancy"]["block_size"] == 128


def test_empty_source_is_a_clear_error():
    with pytest.raises(kernellab.KernellabError, match="__global__"):
        kernellab.compile_cuda("   ")


def test_compile_time_cluster_shapes_come_from_the_cubin(tmp_cache):
    """__cluster_dims__ is recorded in the cubin (EIATTR_CTA_PER_CLUSTER, checked against cuobjdump -elf on sm_90):
    kernellab reads it so that a launch of a 9-16 block shape can set the driver's opt-in first."""
    src = ('extern "C" __global__ void __cluster_dims__(16, 1, 1) c16(float* y) { y[threadIdx.x] = 1; }\n'
           'extern "C" __global__ void __cluster_dims__(2, 2, 1) c4(float* y) { y[threadIdx.x] = 2; }\n'
           'extern "C" __global__ void plain(float* y) { y[threadIdx.x] = 3; }\n')
    m = kernellab.compile_cuda(src, arch="sm_90")
    assert m.c16.resources.cluster_dims == (16, 1, 1) and m.c4.resources.cluster_dims == (2, 2, 1)
    assert m.plain.resources.cluster_dims is None
    assert "clusters of 16x1x1 blocks" in str(m.c16.resources) and "cluster" not in str(m.plain.resources)
    assert read_cubin(m.cubin)[m.c4.symbol].cluster_dims == (2, 2, 1)
