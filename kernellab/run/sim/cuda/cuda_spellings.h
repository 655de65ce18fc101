// The C++ library headers and the CUDA C++ keywords (as nothing, or inline) that both CPU emulators start from:
// cuda_host.h (emulate.py) and ptx_emu.h (ptx_emu.py) include it after their own library headers, so that no library
// header sees the keywords defined away.
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
