// exercise: 07-ldmatrix-swizzle
// expect: missing_guard on cpu
extern "C" __global__ void ldmatrix_frags(const unsigned short* q, unsigned int* frag, unsigned short* image,
                                          int tiles) {
    __shared__ uint4 smem[4][16 * 8];                    // [warp][16 rows x 8 chunks of 16 bytes]: 2 KB per warp
    const int lane = threadIdx.x % 32;
    const int w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;   // this warp's tile
    uint4* tile = smem[threadIdx.x / 32];
    const uint4* src = reinterpret_cast<const uint4*>(q + (size_t)w * 16 * 64);   // [16 rows x 8 chunks]
    for (int c = lane; c < 16 * 8; c += 32) {            // chunk c % 8 of row c / 8 goes to chunk (c % 8) ^ (row % 8)
        const int r = c / 8, k = c % 8;
        tile[r * 8 + (k ^ (r % 8))] = src[c];
    }
    __syncwarp();                                        // the lanes read chunks that other lanes wrote
    const int r = lane % 16;                             // lane l points at row l % 16, chunk 2 kc + l / 16
    for (int kc = 0; kc < 4; ++kc) {
        const int k = 2 * kc + lane / 16;
        const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(&tile[r * 8 + (k ^ (r % 8))]));
        unsigned a0, a1, a2, a3;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(addr));
        reinterpret_cast<uint4*>(frag)[((size_t)w * 4 + kc) * 32 + lane] = make_uint4(a0, a1, a2, a3);
    }
    uint4* dst = reinterpret_cast<uint4*>(image + (size_t)w * 16 * 64);
    for (int c = lane; c < 16 * 8; c += 32) dst[c] = tile[c];   // the shared tile, byte for byte
}
