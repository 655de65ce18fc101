// kl/add_norm.cuh: the residual add fused with LayerNorm, forward and backward, for a pre-norm transformer's stream
// (kernellab.teach.add_norm registers them as the op kl::add_layernorm).
//   forward:  h = x + r (the new residual stream, in x's type T), y = LayerNorm(h) * w + b (in r's type R: the
//             branch's type, bf16 under autocast, so the next matmul reads y without a cast)
//   backward: dh = dh_out + LayerNorm'(h)^T dy (the gradient of h from later in the stream plus the norm's), stored
//             as dh (T) and, where R is not T, as dr (R); dw, db as fp32 partial sums per block, added up by
//             add_norm_finish (tutorial 04's scheme: deterministic, no atomics).
// A row of `cols` values is held in registers by `row_threads` threads (a multiple of 32, not only a power of two:
// 768 columns are 96 threads, 3 warps, none idle), Chunks chunks of 8 consecutive columns a thread: chunk j of
// thread t holds columns (t + j * row_threads) * 8 ... + 7. blockDim.x / row_threads rows a block at a time.
// The backward's scheme is tutorial 04's norm_backward cell's (norm_backward_rows: statistics recomputed, the mean's
// rounding undone, dw/db in registers over a row loop, one partial row a block; row_sum, write_partial,
// norm_backward_finish), generalised here to row threads that are any multiple of 32 and to two element types; the
// tutorial's cell keeps its own, which it teaches step by step.
#pragma once
#include "convert.cuh"
#include "ptx.cuh"
#include "reduce.cuh"

constexpr int kChunk = 8;   // columns of a chunk: one 16-byte load of bf16, two of float

// 8 values of E from p (columns c ... c + 7 of a row of `cols`) as floats: 16-byte loads where the row's chunks are
// 16-byte aligned and the chunk is whole, element loads otherwise; columns past the row (and dead rows) read 0.
template <typename E>
__device__ __forceinline__ void load_chunk(float (&f)[kChunk], const E* __restrict__ p, int c, int cols, bool live,
                                           bool aligned) {
    if (live && aligned && c + kChunk <= cols) {
        if constexpr (sizeof(E) == 4) {
            float4 a = reinterpret_cast<const float4*>(p + c)[0], b = reinterpret_cast<const float4*>(p + c)[1];
            f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w; f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
        } else {
            uint4 u = *reinterpret_cast<const uint4*>(p + c);
            unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int k = 0; k < kChunk; ++k) {
                unsigned short bits = (unsigned short)(k % 2 ? w[k / 2] >> 16 : w[k / 2] & 0xffffu);
                E e;
                *reinterpret_cast<unsigned short*>(&e) = bits;
                f[k] = to_float(e);
            }
        }
        return;
    }
#pragma unroll
    for (int k = 0; k < kChunk; ++k) f[k] = live && c + k < cols ? to_float(p[c + k]) : 0.0f;
}

// 8 floats rounded to E into columns c ... c + 7 of the row (only those inside it).
template <typename E>
__device__ __forceinline__ void store_chunk(const float (&f)[kChunk], E* __restrict__ p, int c, int cols,
                                            bool aligned) {
    if (aligned && c + kChunk <= cols) {
        if constexpr (sizeof(E) == 4) {
            reinterpret_cast<float4*>(p + c)[0] = make_float4(f[0], f[1], f[2], f[3]);
            reinterpret_cast<float4*>(p + c)[1] = make_float4(f[4], f[5], f[6], f[7]);
        } else {
            unsigned w[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                E lo = from_float<E>(f[2 * i]), hi = from_float<E>(f[2 * i + 1]);
                w[i] = (unsigned)*reinterpret_cast<unsigned short*>(&lo) |
                       (unsigned)*reinterpret_cast<unsigned short*>(&hi) << 16;
            }
            *reinterpret_cast<uint4*>(p + c) = make_uint4(w[0], w[1], w[2], w[3]);
        }
        return;
    }
#pragma unroll
    for (int k = 0; k < kChunk; ++k)
        if (c + k < cols) p[c + k] = from_float<E>(f[k]);
}

// Sums of Count values over a row's threads (row_warps whole warps, from warp group * row_warps), in every thread of
// the row: the warp by shuffles, then the row's warps through shared memory. SLOT and `parity` (a row loop's iteration,
// mod 2) keep the slots of consecutive reductions apart, so that each needs one barrier. Every thread of the block
// calls it (dead rows too).
template <int SLOT, int Count>
__device__ __forceinline__ void row_sums(float (&v)[Count], int group, int row_warps, int parity) {
    __shared__ float part[2][Count][32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int i = 0; i < Count; ++i) v[i] = warp_sum(v[i]);
    if (row_warps > 1) {
        if (lane == 0)
#pragma unroll
            for (int i = 0; i < Count; ++i) part[parity][i][warp] = v[i];
        __syncthreads();
        int first = group * row_warps;
#pragma unroll
        for (int i = 0; i < Count; ++i) v[i] = warp_sum(lane < row_warps ? part[parity][i][first + lane] : 0.0f);
    }
}

// Where a thread sits: its row group, its index in the row, the groups of a block.
struct RowSeat {
    int group, t, groups, row_warps;
    __device__ __forceinline__ explicit RowSeat(int row_threads) {
        group = threadIdx.x / row_threads;
        t = threadIdx.x - group * row_threads;
        groups = blockDim.x / row_threads;
        row_warps = row_threads / 32;
    }
};

// h = x + r, y = (h - mean) * rstd * w + b: one row a group, grid = ceil(rows / groups). The statistics are those of
// h as stored (rounded to T), in two passes over registers: the mean, then the deviations from it (their sum
// corrects the mean's rounding, as the backward does).
template <typename T, typename R, int Chunks>
__global__ void __launch_bounds__(1024) add_layernorm_rows(const T* __restrict__ x, const R* __restrict__ r,
                                                           const T* __restrict__ w, const T* __restrict__ b,
                                                           T* __restrict__ h, R* __restrict__ y, int rows, int cols,
                                                           int row_threads, int aligned, float eps) {
    constexpr int V = Chunks * kChunk;
    RowSeat s(row_threads);
    int row = blockIdx.x * s.groups + s.group;
    bool live = row < rows;                              // a last block's spare rows still meet at the barriers
    size_t start = (size_t)(live ? row : 0) * cols;
    float v[V], wv[V], bv[V];
#pragma unroll
    for (int j = 0; j < Chunks; ++j) {
        int c = (s.t + j * row_threads) * kChunk;
        float xf[kChunk], rf[kChunk];
        load_chunk(xf, x + start, c, cols, live, aligned);
        load_chunk(rf, r + start, c, cols, live, aligned);
        // w, b (the same columns every row, from L1/L2) in flight with x and r, not after the reductions
        load_chunk(*reinterpret_cast<float(*)[kChunk]>(&wv[j * kChunk]), w, c, cols, live, aligned);
        load_chunk(*reinterpret_cast<float(*)[kChunk]>(&bv[j * kChunk]), b, c, cols, live, aligned);
#pragma unroll
        for (int k = 0; k < kChunk; ++k) v[j * kChunk + k] = to_float(from_float<T>(xf[k] + rf[k]));   // h as stored
        if (live) store_chunk<T>(*reinterpret_cast<float(*)[kChunk]>(&v[j * kChunk]), h + start, c, cols, aligned);
    }
    float n = (float)cols, sum[1] = {0.0f};
#pragma unroll
    for (int i = 0; i < V; ++i) sum[0] += v[i];          // columns past the row hold 0
    row_sums<0>(sum, s.group, s.row_warps, 0);
    float mean = sum[0] / n, m[2] = {0.0f, 0.0f};        // sum (h - mean)^2, sum (h - mean)
#pragma unroll
    for (int i = 0; i < V; ++i) {
        int c = (s.t + (i / kChunk) * row_threads) * kChunk + i % kChunk;
        float d = c < cols ? v[i] - mean : 0.0f;
        m[0] = fmaf(d, d, m[0]);
        m[1] += d;
    }
    row_sums<1>(m, s.group, s.row_warps, 0);
    float shift = m[1] / n;                              // the first mean's rounding (sum h of a mean of 1e3 in
    mean += shift;                                       // float32: 1e-4), measured on the deviations and undone
    float rstd = rsqrtf(fmaxf(m[0] / n - shift * shift, 0.0f) + eps);
    if (!live) return;
#pragma unroll
    for (int j = 0; j < Chunks; ++j) {
        int c = (s.t + j * row_threads) * kChunk;
        if (c >= cols) continue;
        float out[kChunk];
#pragma unroll
        for (int k = 0; k < kChunk; ++k) {
            int i = j * kChunk + k;
            out[k] = fmaf((v[i] - mean) * rstd, wv[i], bv[i]);
        }
        store_chunk<R>(out, y + start, c, cols, aligned);
    }
}

// A block's sums of one vector (dw or db) for its columns into `dst` (cols floats): one group writes its registers;
// several add theirs up in shared memory in group order (the same sums every run; groups * cols <= 8192).
template <int V>
__device__ __forceinline__ void write_partials(const float (&acc)[V], float* __restrict__ dst, float* stage, int cols,
                                               RowSeat s, int row_threads) {
    if (s.groups == 1) {
#pragma unroll
        for (int i = 0; i < V; ++i) {
            int c = (s.t + (i / kChunk) * row_threads) * kChunk + i % kChunk;
            if (c < cols) dst[c] = acc[i];
        }
        return;
    }
    __syncthreads();                                     // stage is free (its last reader is done)
#pragma unroll
    for (int i = 0; i < V; ++i) {
        int c = (s.t + (i / kChunk) * row_threads) * kChunk + i % kChunk;
        if (c < cols) stage[s.group * cols + c] = acc[i];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float sum = 0.0f;
        for (int g = 0; g < s.groups; ++g) sum += stage[g * cols + c];
        dst[c] = sum;
    }
}

// dh = dh_out + rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w, xhat = (h - mean) * rstd; dh_out null:
// no gradient from later in the stream (a last norm). dr (R): dh again, rounded to R; null where R is T (the caller
// hands dh for both). Each block takes rows blockIdx.x * groups + group, then gridDim.x * groups further; a thread
// keeps the same columns every row, so it adds up dy * xhat (dw) and dy (db) in registers, and the block writes
// partial[blockIdx.x] = [dw (cols), db (cols)] at the end.
template <typename T, typename R, int Chunks>
__global__ void __launch_bounds__(512, Chunks == 1 ? 2 : 1)
add_layernorm_backward_rows(const R* __restrict__ dy, const T* __restrict__ dh_out, const T* __restrict__ h,
                            const T* __restrict__ w, T* __restrict__ dh, R* __restrict__ dr,
                            float* __restrict__ partial, int rows, int cols, int row_threads, int aligned,
                            float eps) {
    constexpr int V = Chunks * kChunk;
    __shared__ float stage[8192];
    RowSeat s(row_threads);
    float n = (float)cols;
    float dw[V], db[V];
#pragma unroll
    for (int i = 0; i < V; ++i) dw[i] = db[i] = 0.0f;
    int parity = 0;
    for (int first = blockIdx.x * s.groups; first < rows; first += gridDim.x * s.groups, parity ^= 1) {
        int row = first + s.group;                       // every group takes part in the block's barriers
        bool live = row < rows;
        size_t start = (size_t)(live ? row : 0) * cols;
        float hv[V], gv[V];
#pragma unroll
        for (int j = 0; j < Chunks; ++j) {
            int c = (s.t + j * row_threads) * kChunk;
            load_chunk(*reinterpret_cast<float(*)[kChunk]>(&hv[j * kChunk]), h + start, c, cols, live, aligned);
            load_chunk(*reinterpret_cast<float(*)[kChunk]>(&gv[j * kChunk]), dy + start, c, cols, live, aligned);
            // dh_out is read after the reductions: asked into L1 now (no registers), in flight during them
            if (dh_out != nullptr && live && c < cols) prefetch_l1(dh_out + start + c);
        }
        float sum[1] = {0.0f};                           // sum h: the mean first, then deviations from it
#pragma unroll
        for (int i = 0; i < V; ++i) sum[0] += hv[i];
        row_sums<0>(sum, s.group, s.row_warps, parity);
        float mean = sum[0] / n;
        float m[4] = {0.0f, 0.0f, 0.0f, 0.0f};           // sum (h - mean)^2, sum g, sum g (h - mean), sum (h - mean)
#pragma unroll
        for (int j = 0; j < Chunks; ++j) {
            int c0 = (s.t + j * row_threads) * kChunk;
            float wf[kChunk];
            load_chunk(wf, w, c0, cols, true, aligned);   // w: the same columns every row, from L1
#pragma unroll
            for (int k = 0; k < kChunk; ++k) {
                int i = j * kChunk + k;
                float d = c0 + k < cols ? hv[i] - mean : 0.0f, g = __fmul_rn(gv[i], wf[k]);   // g as below
                m[0] = fmaf(d, d, m[0]);
                m[1] += g;
                m[2] = fmaf(g, d, m[2]);
                m[3] += d;
            }
        }
        row_sums<1>(m, s.group, s.row_warps, parity);
        float shift = m[3] / n;                          // the first mean's rounding, measured and undone
        mean += shift;
        float rstd = rsqrtf(fmaxf(m[0] / n - shift * shift, 0.0f) + eps);
        float mean_g = m[1] / n, mean_gx = (m[2] - shift * m[1]) * rstd / n;
#pragma unroll
        for (int j = 0; j < Chunks; ++j) {               // dh one chunk at a time, stored as it is made
            int c = (s.t + j * row_threads) * kChunk;
            float wf[kChunk], f[kChunk], up[kChunk];
            load_chunk(wf, w, c, cols, true, aligned);
            if (dh_out != nullptr) load_chunk(up, dh_out + start, c, cols, live, aligned);
#pragma unroll
            for (int k = 0; k < kChunk; ++k) {
                int i = j * kChunk + k;
                float xhat = (hv[i] - mean) * rstd, dyv = gv[i];
                // g rounded before mean(g) is taken from it (__fmul_rn: not contracted into an FMA), so that
                // g - mean(g) is exactly 0 where the row is one value (rstd, 1 / sqrt(eps), would scale the residue)
                f[k] = rstd * (__fmul_rn(dyv, wf[k]) - mean_g - xhat * mean_gx) + (dh_out != nullptr ? up[k] : 0.0f);
                dw[i] = fmaf(dyv, xhat, dw[i]);          // dy is 0 past the row and in rows past the last
                db[i] += dyv;
            }
            if (!live || c >= cols) continue;
            store_chunk<T>(f, dh + start, c, cols, aligned);
            if (dr != nullptr) store_chunk<R>(f, dr + start, c, cols, aligned);
        }
    }
    float* mine = partial + (size_t)blockIdx.x * 2 * cols;
    write_partials(dw, mine, stage, cols, s, row_threads);
    write_partials(db, mine + cols, stage, cols, s, row_threads);
}

// dw[c] = sum over the partial rows p of partial[p][0][c], db[c] of partial[p][1][c]: 256 threads, 32 columns x 8
// slices of the partial rows a block; each slice's sum, then the slices in a fixed tree (the same sums every run).
template <typename T>
__global__ void __launch_bounds__(256) add_norm_finish(const float* __restrict__ partial, int parts, int cols,
                                                       T* __restrict__ dw, T* __restrict__ db) {
    __shared__ float sums[2][256];
    int lane = threadIdx.x % 32, slice = threadIdx.x / 32;
    int c = blockIdx.x * 32 + lane;
#pragma unroll
    for (int v = 0; v < 2; ++v) {
        float sum = 0.0f;
        if (c < cols)
#pragma unroll 8                                          // 8 loads in flight, not one round trip per partial row
            for (int p = slice; p < parts; p += 8) sum += partial[((size_t)p * 2 + v) * cols + c];
        sums[v][threadIdx.x] = sum;
    }
    for (int half = 4; half > 0; half /= 2) {            // slice i += slice i + half, for the slices below half
        __syncthreads();
        if (slice < half)
#pragma unroll
            for (int v = 0; v < 2; ++v) sums[v][threadIdx.x] += sums[v][threadIdx.x + half * 32];
    }
    __syncthreads();
    if (slice < 2 && c < cols) (slice == 0 ? dw : db)[c] = from_float<T>(sums[slice][lane]);
}
