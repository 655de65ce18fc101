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


def _aligned(cols: int, *tensors) -> int:
    """1 where every row's chunks of 8 start on a 16-byte boundary (16-byte loads), else 0 (element loads)."""
    return int(cols % CHUNK == 0 and all(t is None or t.data_ptr() % 16 == 0 for t in tensors))


_FORWARD: dict = {}     # (device, rows, cols, x dtype, r dtype) -> (the configured kernel, row threads)
_BACKWARD: dict = {}    # (device, rows, cols, h dtype, dy dtype) -> (main kernel, row threads, grid, finish kernel)


def add_layernorm(x, r, w, b, eps=1e-5):
    """(h, y): h = x + r in x's dtype, y = LayerNorm(h) * w + b in r's dtype, over the last dimension."""
    _check(x, r, w, b)
    cols = x.shape[-1]
    x2, r2 = x.contiguous().reshape(-1, cols), r.contiguous().reshape(-1, cols)
    rows = x2.shape[0]
    h, y = torch.empty_like(x2), torch.empty_like(r2)
    if rows and cols:
        key = (x.device, rows, cols, x.dtype, r.dtype)
        hit = _FORWARD.get(key)
        if hit is None:                      # once per shape: the plan and the configured kernel
            row_threads, block, grid = plan_forward(rows, cols)
            kernel = kernels(x.device.type)[f"add_layernorm_rows<{CTYPE[x.dtype]}, {CTYPE[r.dtype]}, 1>"]
            hit = _FORWARD[key] = (kernel[grid, block], row_threads)
        launch, row_threads = hit
        w, b = w.contiguous(), b.contiguous()
        launch(x2, r2, w, b, h, y, rows, cols, row_threads, _aligned(cols, x2, r2, w, b, h, y), float(eps))
    return h.reshape(x.shape), y.reshape(x.shape)


def _check_backward(dy, dh_out, h, w):
    if dy.shape != h.shape or (dh_out is not None and (dh_out.shape != h.shape or dh_out.dtype != h.dtype)):
        raise ArgumentError(f"add_layernorm_backward: dy {tuple(dy.shape)} and dh_out "
                            f"{None if dh_out is None else (tuple(dh_out.shape), dh_out.dtype)} must be shaped like h "
                            f"{tuple(h.shape)} (dh_out of h's dtype {h.dtype})")
    if (h.dtype, dy.dtype) not in PAIRS or w.dtype != h.dtype or w.shape != h.shape[-1:]:
        raise ArgumentError(f"add_layernorm_backward takes (h, dy) dtypes {', '.join(f'({a}, {c})' for a, c in PAIRS)}"
                            f" and w [{h.shape[-1]}] of h's dtype; got ({h.dtype}, {dy.dtype}), w {tuple(w.shape)} "
                            f"{w.dtype}")


def add_layernorm_backward(dy, dh_out, h, w, eps=1e-5):
    """(dh, dr, dw, db) of add_layernorm: dh = dh_out + LayerNorm's input gradient (h's dtype), dr the same rounded
    to dy's dtype (an empty tensor where that is h's dtype: dh serves both), dw, db in w's dtype. dh_out None: no
    gradient from later in the stream."""
    _check_backward(dy, dh_out, h, w)
    cols = h.shape[-1]
    h2, dy2 = h.contiguous().reshape(-1, cols), dy.contiguous().reshape(-1, cols)
    up = None if dh_out is None else dh_out.contiguous().reshape(-1, cols)
    rows = h2.shape[0]
    dh = torch.empty_like(h2)
    same = dy.dtype == h.dtype
    dr = torch.empty(0, dtype=dy.dtype, device=h.device) if same else torch.empty_like(dy2)
    dw, db = torch.empty_like(w), torch.empty_like(w)
    if rows == 0 or cols == 0:
        dw.zero_(), db.zero_()
        if up is not None:
            dh.copy_(up)
        return dh.reshape(h.shape), dr if same else dr.reshape(h.shape), dw, db
    key = (h.device, rows, cols, h.dtype, dy.dtype)
    hit = _BACKWARD.get(key)
    if hit is None:                          # once per shape: the plan and the configured kernels
        chunks, row_threads, block, grid = plan_backward(rows, cols, _sms(h.device))
        mod = kernels(h.device.type)
        main = mod[f"add_layernorm_backward_rows<{CTYPE[h.dtype]}, {CTYPE[dy.dtype]}, {chunks}>"][grid, block]
        finish = mod[f"add_norm_finish<{CTYPE[w.dtype]}>"][-(-cols // FINISH_COLS), 256]
        hit = _BACKWARD[key] = (main, row_threads, grid, finish)
    main, row_threads, grid, finish = hit
    partial = torch.empty(grid, 2, cols, dtype=torch.float32, device=h.device)
    w = w.contiguous()
    dr_arg = None if same else dr
    main(dy2, up, h2, w, dh, dr_arg, partial, rows, cols, row_threads, _aligned(cols, dy2, up, h2, w, dh, dr_arg),
         float(eps))
    finish(partial, grid, cols, dw, db)
    return dh.reshape(h.shape), dr if same else dr.reshape(h.shape), dw, db


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
