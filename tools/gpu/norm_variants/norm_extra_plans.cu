
// ---- session 8 candidates: cluster kernels the cell does not instantiate, for tools/gpu/try_norms.py ----------
// bf16 rows of 512 KB as 16 blocks of 512 threads x 4 packs: w loads next to x (4 packs fit), b in one round
// trip after the reduction, two blocks an SM; against the cell's 16 x 256 x 8 (four blocks an SM, a chain of
// 8 w/b round trips per thread). Measured on an H100 (session 8 run F): 490.7 µs against 425.7 (and 418.6 for
// 8 x 512 x 8): slower; kept as a candidate.
NORM_CLUSTER(__nv_bfloat16, 16, 4)
