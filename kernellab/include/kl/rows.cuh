// kl/rows.cuh: a row of a rows x cols matrix held in registers, 16 bytes at a time (tutorials 03 and 04).
// A row is cut into 16-byte packs (4 float or 8 bf16/half), counted from the first 16-byte boundary inside it;
// thread t of the row's threads holds packs t, t + stride, ... (kPacks of them), each one LDG.E.128 / STG.E.128, all
// in flight before any is used. The few elements before the first boundary and after the last whole pack are the
// row's edge elements, loaded and stored one at a time (RowLayout::edge).
#pragma once
#include "convert.cuh"

// ---- a thread's share of a row: kPacks packs of 16 bytes in registers ---------------------------------------------
// A pack is kept as its four 32-bit words, so that 8 bf16 or fp16 values take 4 registers (an array of 8
// __nv_bfloat16 would take 8); get(k) widens value k to fp32 where it is used, from_floats packs kVec results.
template <typename T> struct alignas(16) Pack {
    unsigned u[4];
    __device__ __forceinline__ float get(int k) const;
};
template <> __device__ __forceinline__ float Pack<float>::get(int k) const { return __uint_as_float(u[k]); }
template <> __device__ __forceinline__ float Pack<__nv_bfloat16>::get(int k) const {
    return __uint_as_float(k % 2 ? u[k / 2] & 0xffff0000u : u[k / 2] << 16);    // a bf16 is an fp32's top half
}
template <> __device__ __forceinline__ float Pack<__half>::get(int k) const {
    return __half2float(__ushort_as_half((unsigned short)(k % 2 ? u[k / 2] >> 16 : u[k / 2] & 0xffffu)));
}
template <typename T> __device__ __forceinline__ unsigned bits16(float v) {     // v rounded to T, as its 16 bits
    T h = from_float<T>(v);
    return *reinterpret_cast<const unsigned short*>(&h);
}
// kVec fp32 values as one pack of T (rounded to nearest even for bf16/fp16).
template <typename T, int kVec = 16 / sizeof(T)>
__device__ __forceinline__ Pack<T> from_floats(const float (&f)[kVec]) {
    Pack<T> p;
#pragma unroll
    for (int i = 0; i < 4; ++i)
        p.u[i] = sizeof(T) == 4 ? __float_as_uint(f[i]) : bits16<T>(f[2 * i]) | bits16<T>(f[2 * i + 1]) << 16;
    return p;
}
template <typename T> __device__ __forceinline__ unsigned neg_inf_word() {    // a 32-bit word of -inf values
    return sizeof(T) == 4 ? 0xff800000u : bits16<T>(__uint_as_float(0xff800000u)) * 0x10001u;
}
template <typename T> struct Pair { typedef float2 type; };                 // two 16-bit values in one word
template <> struct Pair<__nv_bfloat16> { typedef __nv_bfloat162 type; };
template <> struct Pair<__half> { typedef __half2 type; };
template <typename T> __device__ __forceinline__ typename Pair<T>::type as_pair(unsigned w) {   // word w as a pair
    return *reinterpret_cast<const typename Pair<T>::type*>(&w);
}

// ---- where a row's elements are ------------------------------------------------------------------------------
// The row starts `head` elements past a 16-byte boundary (head = start % kVec). Elements 0 .. lead-1 come before the
// first 16-byte boundary inside the row, then `whole` packs of kVec elements (pack q: elements lead + q*kVec ...),
// then the tail: elements tail0 .. cols-1, fewer than kVec. The lead and the tail, at most 2 * (kVec - 1) elements,
// are the row's edge elements: thread t of the row holds edge element t.
struct RowLayout {
    int lead, whole, tail0;
    __device__ __forceinline__ RowLayout(int cols, int head, int vec) {
        lead = min((vec - head) % vec, cols);
        whole = (cols - lead) / vec;
        tail0 = lead + whole * vec;
    }
    __device__ __forceinline__ int edge(int t, int cols) const {     // row index of edge element t, or -1
        return t < lead ? t : (t - lead < cols - tail0 ? tail0 + t - lead : -1);
    }
};

// What a pack past the row's last whole pack reads as: -inf (for a max) or 0 (for a sum).
enum class Pad { neg_inf, zero };

// Packs first, first + stride, ... of the row, one 16-byte load each, all kPacks in flight before any is used;
// packs past the row's last whole pack read as kPad.
template <Pad kPad, typename T, int kPacks>
__device__ __forceinline__ void load_packs(Pack<T> (&pk)[kPacks], const T* __restrict__ row, RowLayout L, int first,
                                           int stride) {
    const Pack<T>* packs = reinterpret_cast<const Pack<T>*>(row + L.lead);      // 16-byte aligned
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
        int q = first + j * stride;
        if (q < L.whole) {
            pk[j] = packs[q];
        } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) pk[j].u[i] = kPad == Pad::neg_inf ? neg_inf_word<T>() : 0u;
        }
    }
}

// The packs back into the row where load_packs found them (packs past the row's last whole pack are not stored).
template <typename T, int kPacks>
__device__ __forceinline__ void store_packs(const Pack<T> (&pk)[kPacks], T* __restrict__ row, RowLayout L, int first,
                                            int stride) {
    Pack<T>* packs = reinterpret_cast<Pack<T>*>(row + L.lead);
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
        int q = first + j * stride;
        if (q < L.whole) packs[q] = pk[j];
    }
}
