/* kernellab's <cuda.h> for NVRTC: the part of the driver API header that device code uses.
 *
 * The toolkit's cuda.h declares the host driver API and includes <stdlib.h>, so NVRTC (which compiles device code
 * only and has no C library headers) cannot include it. Kernels need one thing from it: the CUtensorMap type of a
 * `const __grid_constant__ CUtensorMap` parameter, 128 bytes, laid out as in cuda.h. kernellab puts this file
 * first on NVRTC's include path, so `#include <cuda.h>` compiles the same in a %%cuda cell as under nvcc.
 * The map itself is made on the host: kernellab.tensor_map(tensor, box).
 */
#ifndef __cuda_cuda_h__
#define __cuda_cuda_h__
#define KERNELLAB_NVRTC_CUDA_H 1

typedef unsigned int cuuint32_t;
typedef unsigned long long cuuint64_t;

#define CU_TENSOR_MAP_NUM_QWORDS 16

typedef struct CUtensorMap_st {
    alignas(64) cuuint64_t opaque[CU_TENSOR_MAP_NUM_QWORDS];
} CUtensorMap;

#endif /* __cuda_cuda_h__ */
