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


MACRO_SRC = r'''#define NW 4
#define BOUNDS __launch_bounds__(NW * 32, 2)
// a comment: __global__ void not_a_kernel(int x)
#define RUNG(name, T, D, CAUSAL) \
extern "C" __global__ void BOUNDS name(const T* __restrict__ q, T* o, int n, \
        float scale) { body<T, D, CAUSAL>(q, o, n, scale); }
#define CAT(a, b) a##_##b
RUNG(rung_bf16_d64, __nv_bfloat16, 64, false)
RUNG(CAT(rung, f16),
     __half, 128, true)
extern "C" __global__ void plain(float* x, int n) {}
#define VA(name, ...) extern "C" __global__ void name(__VA_ARGS__) {}
VA(va, const float* a, double b)
#undef VA
VA(gone, int a)
'''


def test_kernels_defined_by_macros_are_found_with_their_types_and_lines():
    """The cell's own #defines are expanded (object-like, function-like, ##, __VA_ARGS__, #undef) before kernels are
    looked for: each invocation is a kernel at the invocation's line, its parameters' types substituted."""
    ks = {k.name: k for k in find_kernels(MACRO_SRC)}
    assert set(ks) == {"rung_bf16_d64", "rung_f16", "plain", "va"}     # not RUNG's `name`, not after #undef
    assert [str(p) for p in ks["rung_bf16_d64"].params] == [
        "const __nv_bfloat16* __restrict__ q", "__nv_bfloat16* o", "int n", "float scale"]
    assert [p.dtype for p in ks["rung_f16"].params] == ["float16", "float16", "int32", "float32"]
    assert [p.dtype for p in ks["va"].params] == ["float32", "float64"]
    assert (ks["rung_bf16_d64"].line, ks["rung_f16"].line, ks["plain"].line, ks["va"].line) == (8, 9, 11, 13)
    assert signature_for("rung_f16", find_kernels(MACRO_SRC)).params[0].const


def test_macro_expansion_keeps_lines_and_leaves_unknown_names():
    from kernellab.compile.signature import expand_macros

    text = expand_macros(MACRO_SRC)
    assert text.count("\n") == MACRO_SRC.count("\n")
    assert "__launch_bounds__(4 * 32, 2) rung_bf16_d64(" in text
    assert "body<__half, 128, true>" in text and "VA(gone, int a)" in text
    # a function-like macro's name without '(' stays; a macro does not re-enter its own expansion
    assert expand_macros("#define f(x) f(x + 1)\n#define g(x) x\nf(2) g\n").splitlines()[-1] == "f(2 + 1) g"


def test_conditionals_and_compile_defines_decide_a_macros_type():
    """#ifdef/#ifndef/#if defined()/#if 0 are decided against the cell's macros and the compile's -D options; where a
    condition cannot be told (#if N > 2) and its branches define a type differently, the type stays unknown rather
    than wrong."""
    from kernellab.compile.signature import defines_from_options

    src = ("#ifdef USE_HALF\n#define T __half\n#else\n#define T float\n#endif\n"
           "#ifndef BLOCK\n#define BLOCK 128\n#endif\n"
           "#if 0\n#define U double\n#elif defined(USE_HALF)\n#define U __half\n#else\n#define U int\n#endif\n"
           "#if N > 2\n#define V double\n#else\n#define V float\n#endif\n"
           "#define K(name) extern \"C\" __global__ void __launch_bounds__(BLOCK) name(T* x, U* y, V* z) {}\n"
           "K(k)\n")
    assert [p.dtype for p in find_kernels(src)[0].params] == ["float32", "int32", None]
    with_half = find_kernels(src, defines_from_options(("-DUSE_HALF", "-D", "BLOCK=64", "--define-macro=N=3")))
    assert [p.dtype for p in with_half[0].params] == ["float16", "float16", None]
    assert defines_from_options(("-O3", "-DA", "-DB=2", "-D", "C=x y", "--define-macro", "D")) == \
        {"A": "1", "B": "2", "C": "x y", "D": "1"}
    assert find_kernels(src)[0].line == src.splitlines().index("K(k)") + 1 == 22
