// The C++ library headers and the CUDA C++ keywords (as nothing, or inline) that the CPU runtime starts from:
// cuda_host.h (emulate.py) includes it after its own library headers, so that no library header sees the keywords
// defined away.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __maxnreg__(...)
