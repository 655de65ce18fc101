"""The residual add fused with LayerNorm as one PyTorch op, forward and backward: `kl::add_layernorm`, what a
pre-norm transformer's stream does between two branches (kernellab.teach.gpt's `add_norm_op=`).

    h, y = kl_add_layernorm(x, r, w, b, eps)      # h = x + r (x's dtype), y = F.layer_norm(h, ...) (r's dtype)

x is the residual stream (float32 under autocast), r a branch's output (bf16 under autocast: its last matmul's), so
y comes out in the branch's dtype and the next matmul reads it without a cast; w and b are x's dtype, as
kl::layernorm takes them. One kernel reads x and r and writes h and y; the backward, one kernel and a small finish,
reads dy (y's gradient), dh_out (h's gradient from later in the stream; None where h is not used again) and h, and
writes dh = dh_out + LayerNorm's dx (x's gradient, and r's, rounded to r's dtype where that differs) and dw, db
(fp32 partial sums per block, added up in a fixed order: the same bits every run). The statistics are recomputed from
h in the backward, as kl::layernorm recomputes them from x. The device code is kernellab/include/kl/add_norm.cuh.
Rows up to 8192 columns (a row in one block's registers); on CPU tensors the kernels run on kernellab's CPU path.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

import kernellab
from kernellab.analysis.arch import DEFAULT_ARCH
from kernellab.errors import ArgumentError

# the (stream, branch) dtypes instantiated: x, h, w, b, dh in the first; r, y, dy, dr in the second
CTYPE = {torch.float32: "float", torch.bfloat16: "__nv_bfloat16"}
PAIRS = ((torch.float32, torch.float32), (torch.float32, torch.bfloat16), (torch.bfloat16, torch.bfloat16))
CHUNK = 8                    # columns of a thread's chunk (kChunk in the header)
MAX_COLS = 8192              # the forward's 1024 threads x 8; the backward's 512 x 2 chunks
STAGE_FLOATS = 8192          # the backward's shared stage of the groups' partial sums: groups * cols at most
FINISH_COLS = 32             # columns a block of add_norm_finish adds up

SOURCE = "#include <kl/add_norm.cuh>\n" + "".join(
    f"template __global__ void add_layernorm_rows<{CTYPE[t]}, {CTYPE[r]}, 1>(const {CTYPE[t]}*, const {CTYPE[r]}*, "
    f"const {CTYPE[t]}*, const {CTYPE[t]}*, {CTYPE[t]}*, {CTYPE[r]}*, int, int, int, int, float);\n"
    + "".join(f"template __global__ void add_layernorm_backward_rows<{CTYPE[t]}, {CTYPE[r]}, {c}>(const {CTYPE[r]}*, "
              f"const {CTYPE[t]}*, const {CTYPE[t]}*, const {CTYPE[t]}*, {CTYPE[t]}*, {CTYPE[r]}*, float*, int, int, "
              f"int, int, float);\n" for c in (1, 2))
    for t, r in PAIRS) + "".join(
    f"template __global__ void add_norm_finish<{CTYPE[t]}>(const float*, int, int, {CTYPE[t]}*, {CTYPE[t]}*);\n"
    for t in (torch.float32, torch.bfloat16))


@functools.cache
def kernels(device_type: str = "cuda", compile=None):
    """The compiled module: for the current GPU ("cuda"), or launched on kernellab's CPU path ("cpu"); `compile`
    (source -> module) replaces kernellab.compile_cuda (tests pass the CPU emulation's compile_host)."""
    if compile is not None:
        return compile(SOURCE)
    if device_type == "cpu":
        return kernellab.compile_cuda(SOURCE, arch=DEFAULT_ARCH, filename="add_norm.cu", simulate=True)
    return kernellab.compile_cuda(SOURCE, filename="add_norm.cu")


@functools.cache
def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def _round32(n: int) -> int:
    return max(32, -(-n // 32) * 32)


@functools.cache
def plan_forward(rows: int, cols: int) -> tuple[int, int, int]:
    """(row_threads, block, grid) of add_layernorm_rows: 8 columns a thread, a row's threads a multiple of 32 (768
    columns: 96 threads, none idle), up to 256 threads a block (small blocks fill an SM's 56-register warps: 768
    columns, 2 rows a block, 6 blocks of 6 warps), one row a group of them."""
    row_threads = _round32(-(-cols // CHUNK))
    groups = max(1, 256 // row_threads)
    return row_threads, groups * row_threads, max(1, -(-rows // groups))


@functools.cache
def plan_backward(rows: int, cols: int, sms: int = 132) -> tuple[int, int, int, int]:
    """(chunks, row_threads, block, grid) of add_layernorm_backward_rows: one chunk of 8 columns a thread (rows up to
    4096) or two, at most 512 threads a row; groups of rows a block while their partial sums fit the shared stage;
    one wave of resident blocks walking the rows (few partial rows for the finish)."""
    chunks = 1 if -(-cols // CHUNK) <= 512 else 2
    row_threads = _round32(-(-cols // (CHUNK * chunks)))
    groups = max(1, min(512 // row_threads, STAGE_FLOATS // max(cols, 1)))
    block = groups * row_threads
    resident = max(1, (1024 if chunks == 1 else 512) // block)     # the launch bounds' registers: 64 or 128 a thread
    return chunks, row_threads, block, max(1, min(-(-rows // groups), sms * resident))


def _check(x, r, w, b):
    if x.shape != r.shape:
        raise ArgumentError(f"add_layernorm: x {tuple(x.shape)} and r {tuple(r.shape)} must have the same shape")
    if (x.dtype, r.dtype) not in PAIRS:
        raise ArgumentError(f"add_layernorm takes (x, r) dtypes {', '.join(f'({a}, {c})' for a, c in PAIRS)}; got "
                            f"({x.dtype}, {r.dtype})")
    cols = x.shape[-1] if x.dim() else 0
    if w.shape != (cols,) or b.shape != (cols,) or w.dtype != x.dtype or b.dtype != x.dtype:
        raise ArgumentError(f"add_layernorm: w and b must be [{cols}] of x's dtype {x.dtype}; got w "
                            f"{tuple(w.shape)} {w.dtype}, b {tuple(b.shape)} {b.dtype}")
    if cols > MAX_COLS:
        raise ArgumentError(f"add_layernorm holds a row in one block's registers: rows up to {MAX_COLS} columns, "
                            f"got {cols}; use x + r and kl::layernorm for longer rows")
    if not all(t.device == x.device for t in (r, w, b)):
        raise ArgumentError("add_layernorm: x, r, w and b must be on one device")


# The launchers' per-call path: one lookup in a table keyed on everything the checks and the launch depend on (each
# tensor's shape and dtype, the device; dh_out's too, or None), made on a miss together with the checks, the plan
# and the configured kernels; a hit has passed those checks and makes no plan, no kernel name, no lookup. What the key
# does not hold is checked each call: contiguity (.contiguous() copies a strided tensor), the 16-byte alignment of the
# addresses (the kernels' flag: 16-byte loads where every row's chunks of 8 start on a 16-byte boundary, else element
# loads) and, in the backward, each tensor's device (by the generated launch, which hands a tensor on
# another device to the launch path's checks and their error). Inputs of any number of dimensions go in as they are:
# the kernels see rows x cols, the outputs are empty_like of the inputs, already in their shape.
_FORWARD: dict = {}     # (shapes, dtypes, devices of x, r, w, b) -> (launch or None, rows, cols, row threads, 16-byte)
_BACKWARD: dict = {}    # (shapes, dtypes of dy, h, w; device; dh_out's or None) -> see _backward_launch


def _forward_launch(key, x, r, w, b):
    """The _FORWARD entry of these arguments: checked (the user-facing errors), planned, the kernel configured."""
    _check(x, r, w, b)
    cols = x.shape[-1]
    rows = x.numel() // cols if cols else 0
    launch = row_threads = None
    if rows and cols:
        row_threads, block, grid = plan_forward(rows, cols)
        launch = kernels(x.device.type)[f"add_layernorm_rows<{CTYPE[x.dtype]}, {CTYPE[r.dtype]}, 1>"][grid, block]
    hit = _FORWARD[key] = (launch, rows, cols, row_threads, cols % CHUNK == 0)
    return hit


def add_layernorm(x, r, w, b, eps=1e-5):
    """(h, y): h = x + r in x's dtype, y = LayerNorm(h) * w + b in r's dtype, over the last dimension."""
    key = (x.shape, r.shape, w.shape, b.shape, x.dtype, r.dtype, w.dtype, b.dtype, x.device, r.device, w.device,
           b.device)
    hit = _FORWARD.get(key)
    if hit is None:                          # once per shape and dtypes: the checks, the plan, the configured kernel
        hit = _forward_launch(key, x, r, w, b)
    launch, rows, cols, row_threads, chunked = hit
    x, r, w, b = x.contiguous(), r.contiguous(), w.contiguous(), b.contiguous()
    h, y = torch.empty_like(x), torch.empty_like(r)
    if launch is not None:
        aligned = chunked and not (x.data_ptr() | r.data_ptr() | w.data_ptr() | b.data_ptr() | h.data_ptr()
                                   | y.data_ptr()) & 15
        launch(x, r, w, b, h, y, rows, cols, row_threads, 1 if aligned else 0, float(eps))
    return h, y


def _check_backward(dy, dh_out, h, w):
    if dy.shape != h.shape or (dh_out is not None and (dh_out.shape != h.shape or dh_out.dtype != h.dtype)):
        raise ArgumentError(f"add_layernorm_backward: dy {tuple(dy.shape)} and dh_out "
                            f"{None if dh_out is None else (tuple(dh_out.shape), dh_out.dtype)} must be shaped like h "
                            f"{tuple(h.shape)} (dh_out of h's dtype {h.dtype})")
    if (h.dtype, dy.dtype) not in PAIRS or w.dtype != h.dtype or w.shape != h.shape[-1:]:
        raise ArgumentError(f"add_layernorm_backward takes (h, dy) dtypes {', '.join(f'({a}, {c})' for a, c in PAIRS)}"
                            f" and w [{h.shape[-1]}] of h's dtype; got ({h.dtype}, {dy.dtype}), w {tuple(w.shape)} "
                            f"{w.dtype}")


def _backward_launch(key, dy, dh_out, h, w):
    """The _BACKWARD entry of these arguments, checked and planned: (main kernel or None where there are no rows or
    columns, its row threads, rows, cols, grid, the partial sums' shape, the finish kernel, 16-byte rows, dy's dtype
    is h's). Nothing on the device: an entry made while a CUDA graph is captured (torch.compile's cudagraph trees
    check that their pool holds only their outputs) keeps none of its memory."""
    _check_backward(dy, dh_out, h, w)
    cols = h.shape[-1] if h.dim() else 0
    rows = h.numel() // cols if cols else 0
    main = row_threads = grid = finish = None
    if rows and cols:
        chunks, row_threads, block, grid = plan_backward(rows, cols, _sms(h.device))
        mod = kernels(h.device.type)
        main = mod[f"add_layernorm_backward_rows<{CTYPE[h.dtype]}, {CTYPE[dy.dtype]}, {chunks}>"][grid, block]
        finish = mod[f"add_norm_finish<{CTYPE[w.dtype]}>"][-(-cols // FINISH_COLS), 256]
    hit = _BACKWARD[key] = (main, row_threads, rows, cols, grid, (grid, 2, cols), finish, cols % CHUNK == 0,
                            dy.dtype == h.dtype)
    return hit


def add_layernorm_backward(dy, dh_out, h, w, eps=1e-5):
    """(dh, dr, dw, db) of add_layernorm: dh = dh_out + LayerNorm's input gradient (h's dtype), dr the same rounded
    to dy's dtype (an empty tensor where that is h's dtype: dh serves both), dw, db in w's dtype. dh_out None: no
    gradient from later in the stream."""
    key = (dy.shape, h.shape, w.shape, dy.dtype, h.dtype, w.dtype, h.device,
           None if dh_out is None else (dh_out.shape, dh_out.dtype))
    hit = _BACKWARD.get(key)
    if hit is None:                          # once per shape and dtypes: the checks, the plan, the configured kernels
        hit = _backward_launch(key, dy, dh_out, h, w)
    main, row_threads, rows, cols, grid, partial_shape, finish, chunked, same = hit
    dy, h, w = dy.contiguous(), h.contiguous(), w.contiguous()
    up = None if dh_out is None else dh_out.contiguous()
    dh = torch.empty_like(h)
    dr = dy.new_empty(0) if same else torch.empty_like(dy)
    dw, db = torch.empty_like(w), torch.empty_like(w)
    if main is None:                         # no rows or no columns
        dw.zero_(), db.zero_()
        if up is not None:
            dh.copy_(up)
        return dh, dr, dw, db
    partial = h.new_empty(partial_shape, dtype=torch.float32)
    dr_arg = None if same else dr
    aligned = chunked and not (dy.data_ptr() | h.data_ptr() | w.data_ptr() | dh.data_ptr()
                               | (0 if up is None else up.data_ptr()) | (0 if same else dr.data_ptr())) & 15
    main(dy, up, h, w, dh, dr_arg, partial, rows, cols, row_threads, 1 if aligned else 0, float(eps))
    finish(partial, grid, cols, dw, db)
    return dh, dr, dw, db


def make_inputs(rows, cols, x_dtype, r_dtype, dist="normal", device="cpu", seed=0):
    """(x, r, w, b, dy, dh_out) for checking the op: x ~ N(0, 1), or N(1000, 1) with dist="mean1e3" (a large mean);
    r, dy, dh_out ~ N(0, 1); w ~ N(1, 0.5); b ~ N(0, 1); drawn in float64 from `seed`, then x, w, b, dh_out in
    x_dtype and r, dy in r_dtype, on `device`."""
    g = torch.Generator().manual_seed(seed)
    x, r, dy, up = (torch.randn(rows, cols, generator=g, dtype=torch.float64) for _ in range(4))
    if dist == "mean1e3":
        x = x + 1e3
    w = 1 + 0.5 * torch.randn(cols, generator=g, dtype=torch.float64)
    b = torch.randn(cols, generator=g, dtype=torch.float64)
    return tuple(t.to(d).to(device) for t, d in ((x, x_dtype), (r, r_dtype), (w, x_dtype), (b, x_dtype),
                                                 (dy, r_dtype), (up, x_dtype)))


def reference_add_layernorm(x, r, w, b, eps=1e-5):
    """The same in PyTorch: (x + r, F.layer_norm(x + r) in r's dtype), what the op replaces (and, on the CPU,
    a model's add_norm_op for a test of the wiring)."""
    h = x + r
    return h, F.layer_norm(h, (h.shape[-1],), w, b, eps).to(r.dtype)


# ---- the ops ----------------------------------------------------------------------------------------------------

def _backward_outputs(dy, dh_out, h, w, eps):
    return (h, kernellab.out(dy, shape=(0,) if dy.dtype == h.dtype else dy.shape), w, w)


def _forward_outputs(x, r, w, b, eps):
    return (x, kernellab.out(x, dtype=r.dtype))


def _save(ctx, inputs, output):
    ctx.save_for_backward(output[0], inputs[2])          # h and w; the statistics are recomputed from h
    ctx.eps, ctx.r_dtype = inputs[4], inputs[1].dtype
    ctx.set_materialize_grads(False)                     # a last norm's h is not used: no zeros made for it


def _grad(ctx, dh_out, dy):
    h, w = ctx.saved_tensors
    if dy is None:                                       # y not used: LayerNorm's part of the gradient is 0
        dh = dh_out if dh_out is not None else torch.zeros_like(h)
        return dh, dh.to(ctx.r_dtype), torch.zeros_like(w), torch.zeros_like(w), None
    dh, dr, dw, db = kl_add_layernorm_backward(dy, dh_out, h, w, ctx.eps)
    return dh, (dh if ctx.r_dtype == h.dtype else dr), dw, db, None


kl_add_layernorm_backward = kernellab.op(
    "kl::add_layernorm_backward", "(Tensor dy, Tensor? dh_out, Tensor h, Tensor w, float eps) -> (Tensor, Tensor, "
    "Tensor, Tensor)", outputs=_backward_outputs, device_types=("cuda", "cpu"))(add_layernorm_backward)
kl_add_layernorm_backward.__doc__ = "(dh, dr, dw, db) of kl::add_layernorm (add_layernorm_backward) as an op."

kl_add_layernorm = kernellab.op(
    "kl::add_layernorm", "(Tensor x, Tensor r, Tensor w, Tensor b, float eps) -> (Tensor, Tensor)",
    outputs=_forward_outputs, backward=_grad, setup_context=_save, device_types=("cuda", "cpu"))(add_layernorm)
kl_add_layernorm.__doc__ = ("(h, y) = (x + r, LayerNorm(x + r) in r's dtype) as the op kl::add_layernorm; "
                            "differentiable: a GPT's add_norm_op.")


def ops() -> dict:
    """{"forward": kl::add_layernorm, "backward": kl::add_layernorm_backward}."""
    return {"forward": kl_add_layernorm, "backward": kl_add_layernorm_backward}


def model_us(rows: int, cols: int, x_bytes: int = 4, r_bytes: int = 2, tbps: float = 3.0,
             launch_us: float = 2.5) -> dict:
    """The prediction, from bytes at `tbps` TB/s plus launch_us a kernel: {variant: µs} of a forward + backward of
    the fused op, of x + r then kl::layernorm (with the casts autocast adds around it: y to r's dtype, dy back, dr),
    and of torch.compile's fused kernels (same bytes as ours). Partial sums and the finish are left out."""
    n = rows * cols

    def us(bytes_, kernels_):
        return bytes_ / (tbps * 1e6) + launch_us * kernels_
    x, r = x_bytes, r_bytes
    fused_fwd = us(n * (x + r + x + r), 1)                       # read x, r; write h, y (r's dtype)
    fused_bwd = us(n * (r + x + x + x + (r if r != x else 0)), 2)   # read dy, dh_out, h; write dh (and dr); finish
    sep_fwd = (us(n * (x + r + x), 1) + us(n * (x + x), 1)       # add; kl::layernorm (y in x's dtype)
               + (us(n * (x + r), 1) if r != x else 0.0))        # autocast's cast of y
    sep_bwd = ((us(n * (r + x), 1) if r != x else 0.0)           # dy back to x's dtype
               + us(n * (x + x + x), 2)                          # kl::layernorm_backward: dy, x -> dx; finish
               + us(n * (x + x + x), 1)                          # dh_out + dx
               + (us(n * (x + r), 1) if r != x else 0.0))        # dr: dh rounded to r's dtype
    return {"fused": fused_fwd + fused_bwd, "fused forward": fused_fwd, "fused backward": fused_bwd,
            "add + kl_layernorm": sep_fwd + sep_bwd, "torch.compile": fused_fwd + fused_bwd}


__all__ = ["add_layernorm", "add_layernorm_backward", "kl_add_layernorm", "reference_add_layernorm", "ops",
           "plan_forward", "plan_backward", "model_us", "kernels", "SOURCE"]
