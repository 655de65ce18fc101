"""Parsing kernel parameters from source text and demangled C++ names."""
import pytest

from kernellab.compile.signature import demangle, find_kernels, parse_param, signature_for


@pytest.mark.parametrize("text,name,base,pointer,const,dtype", [
    ("const float* __restrict__ x", "x", "float", True, True, "float32"),
    ("float const *x", "x", "float", True, True, "float32"),
    ("unsigned int", "arg0", "unsigned int", False, False, "uint32"),
    ("unsigned int n", "n", "unsigned int", False, False, "uint32"),
    ("long long", "arg0", "long long", False, False, "int64"),
    ("unsigned long long count", "count", "unsigned long long", False, False, "uint64"),
    ("size_t n", "n", "size_t", False, False, "uint64"),
    ("__half* h", "h", "__half", True, False, "float16"),
    ("__nv_bfloat16 s", "s", "__nv_bfloat16", False, False, "bfloat16"),
    ("float4* v", "v", "float4", True, False, "float32"),
    ("void* raw", "raw", "void", True, False, None),
    ("float x[]", "x", "float", True, False, "float32"),
    ("MyStruct s", "s", "MyStruct", False, False, None),
    ("const __grid_constant__ CUtensorMap map", "map", "CUtensorMap", False, True, None),
])
def test_parse_param(text, name, base, pointer, const, dtype):
    p = parse_param(text, 0)
    assert (p.name, p.base, p.pointer, p.const, p.dtype) == (name, base, pointer, const, dtype)


def test_vector_pointer_width():
    assert parse_param("float4* v", 0).vector_width == 4
    assert parse_param("__half2* v", 0).vector_width == 2


def test_find_kernels_skips_comments_strings_and_attributes():
    src = '''
    // __global__ void commented(int x) {}
    /* __global__ void block_commented(int x) {} */
    const char* s = "__global__ void in_string(int x)";
    extern "C" __global__ void __launch_bounds__(256, 2) real(const float* __restrict__ a, int n) {}
    template <typename T, int N>
    __global__ void tmpl(T* x) {}
    __global__ void declared(float* y);
    __global__ void declared(float* y) { }
    '''
    ks = {k.name: k for k in find_kernels(src)}
    assert set(ks) == {"real", "tmpl", "declared"}
    assert [p.name for p in ks["real"].params] == ["a", "n"]
    assert ks["tmpl"].template and not ks["real"].template
    assert ks["real"].line == 5


def test_template_instances_take_types_from_the_mangled_name():
    src = "template <typename T> __global__ void fill(T* x, T v, int n) {}\n"
    sig = signature_for("_Z4fillIdEvPT_S0_i", find_kernels(src))
    assert demangle("_Z4fillIdEvPT_S0_i") == "void fill<double>(double*, double, int)"
    assert sig.display == "fill<double>" and sig.name == "fill"
    assert [(p.name, p.dtype, p.pointer) for p in sig.params] == [("x", "float64", True), ("v", "float64", False),
                                                                  ("n", "int32", False)]


def test_namespaced_and_overloaded_kernels():
    src = "namespace ns { __global__ void k(float* x) {} __global__ void k(double* x) {} }\n"
    ks = find_kernels(src)
    a = signature_for("_ZN2ns1kEPf", ks)
    b = signature_for("_ZN2ns1kEPd", ks)
    assert a.name == b.name == "k"
    assert a.params[0].dtype == "float32" and b.params[0].dtype == "float64"


def test_unmangled_name_without_source_has_no_params():
    sig = signature_for("mystery", ())
    assert sig.name == "mystery" and sig.params == ()
