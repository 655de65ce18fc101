// exercise: 07-ldmatrix-swizzle
// expect: no_ldmatrix on cpu
extern "C" __global__ void ldmatrix_frags(const unsigned short* q, unsigned int* frag, unsigned short* image,
                                          int tiles) {
    __shared__ uint4 smem[4][16 * 8];                    // [warp][16 rows x 8 chunks of 16 bytes]: 2 KB per warp
    const int lane = threadIdx.x % 32;
    const int w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;   // this warp's tile
    if (w >= tiles) return;                              // the whole warp leaves together
    uint4* tile = smem[threadIdx.x / 32];
    const uint4* src = reinterpret_cast<const uint4*>(q + (size_t)w * 16 * 64);   // [16 rows x 8 chunks]
    for (int c = lane; c < 16 * 8; c += 32) {            // chunk c % 8 of row c / 8 goes to chunk (c % 8) ^ (row % 8)
        const int r = c / 8, k = c % 8;
        tile[r * 8 + (k ^ (r % 8))] = src[c];
    }
    __syncwarp();                                        // the lanes read chunks that other lanes wrote
    const int g = lane / 4, t = lane % 4;                // the fragment table: rows g, g + 8; columns 2t, 2t + 8
    const unsigned* words = reinterpret_cast<const unsigned*>(tile);   // [16 rows x 32 words of two values]
    for (int kc = 0; kc < 4; ++kc) {
        unsigned a[4];
        for (int i = 0; i < 4; ++i) {                    // register i: row g + 8 (i % 2), column 16 kc + 2t + 8 (i / 2)
            const int r = g + 8 * (i % 2), col = 16 * kc + 2 * t + 8 * (i / 2);
            a[i] = words[r * 32 + (((col / 8) ^ (r % 8)) * 4) + (col % 8) / 2];
        }
        const unsigned a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
        reinterpret_cast<uint4*>(frag)[((size_t)w * 4 + kc) * 32 + lane] = make_uint4(a0, a1, a2, a3);
    }
    uint4* dst = reinterpret_cast<uint4*>(image + (size_t)w * 16 * 64);
    for (int c = lane; c < 16 * 8; c += 32) dst[c] = tile[c];   // the shared tile, byte for byte
}
