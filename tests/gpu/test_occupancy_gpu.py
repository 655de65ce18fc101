"""occupancy() against the live driver (cuOccupancyMaxActiveBlocksPerMultiprocessor) and the arch table against
the live device's attributes. Run on a GPU machine: tools/gpu/run.py tests-launch, or pytest -m gpu tests/gpu."""
import pytest

from kernellab.analysis.arch import ARCHS, device_mismatches, get_arch
from kernellab.analysis.occupancy import occupancy

pytestmark = pytest.mark.gpu

# A kernel whose register appetite grows with ACC (capped by -maxrregcount), with STATIC floats of static shared
# memory and dynamic shared memory on top.
SOURCE = r"""
extern "C" __global__ void k(const float* __restrict__ x, float* __restrict__ y, int n) {
  __shared__ float tile[STATIC];
  extern __shared__ float dyn[];
  float acc[ACC];
#pragma unroll
  for (int i = 0; i < ACC; ++i) acc[i] = x[(threadIdx.x * (i + 1)) % n];
  for (int it = 0; it < n; ++it) {
#pragma unroll
    for (int i = 0; i < ACC; ++i) acc[i] = fmaf(acc[i], acc[(i + 1) % ACC], x[(it + i) % n]);
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < ACC; ++i) s += acc[i];
  tile[threadIdx.x % STATIC] = s;
  dyn[threadIdx.x] = s;
  __syncthreads();
  y[blockIdx.x * blockDim.x + threadIdx.x] = tile[(threadIdx.x + 1) % STATIC] + dyn[0];
}
"""


@pytest.fixture(scope="module")
def device():
    import cupy

    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = f"sm_{props['major']}{props['minor']}"
    if name not in ARCHS:
        pytest.skip(f"no table for this GPU's architecture {name}")
    return dev, props, get_arch(name)


def _kernel(acc, cap, static_floats):
    import cupy

    src = SOURCE.replace("STATIC", str(static_floats)).replace("ACC", str(acc))
    opts = ("--std=c++17",) + ((f"--maxrregcount={cap}",) if cap else ())
    return cupy.RawModule(code=src, options=opts, backend="nvrtc").get_function("k")


def test_arch_table_matches_the_device(device):
    dev, props, spec = device
    assert device_mismatches(spec, props) == {}
    assert dev.attributes["MaxSharedMemoryPerBlockOptin"] == spec.shared_memory_per_block_optin_bytes
    assert dev.attributes["MaxRegistersPerMultiprocessor"] == spec.registers_per_sm
    assert dev.attributes["MaxBlocksPerMultiprocessor"] == spec.max_blocks_per_sm


@pytest.mark.parametrize("acc, cap, static_floats", [(1, 0, 1), (8, 40, 256), (32, 72, 1024), (64, 128, 4096),
                                                      (96, 255, 8192), (16, 33, 12000)])
def test_occupancy_matches_the_driver(device, acc, cap, static_floats):
    from cupy.cuda import driver

    dev, props, spec = device
    fn = _kernel(acc, cap, static_floats)
    regs, static = fn.num_regs, fn.shared_size_bytes
    optin = spec.shared_memory_per_block_optin_bytes
    fn.max_dynamic_shared_size_bytes = optin - static
    bad = []
    for block in (1, 32, 33, 96, 128, 255, 256, 384, 512, 640, 768, 1024):
        if block > fn.max_threads_per_block:
            continue
        for dyn in (0, 1, 4096, 48 * 1024 - static, 100 * 1024, optin - static):
            if not 0 <= dyn <= optin - static:
                continue
            want = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, block, dyn)
            got = occupancy(block, regs, static + dyn, spec).blocks_per_sm
            if got != want:
                bad.append((block, regs, static, dyn, got, want))
    assert not bad, f"(block, regs, static, dynamic, ours, driver): {bad}"


@pytest.mark.parametrize("carveout", [0, 25, 50, 100])
def test_carveout_matches_the_driver(device, carveout):
    """cudaFuncAttributePreferredSharedMemoryCarveout as the driver's occupancy answer sees it."""
    from cupy.cuda import driver

    dev, props, spec = device
    fn = _kernel(8, 32, 256)
    regs, static = fn.num_regs, fn.shared_size_bytes
    fn.max_dynamic_shared_size_bytes = spec.shared_memory_per_block_optin_bytes - static
    fn.preferred_shared_memory_carveout = carveout
    bad = []
    for block in (32, 128, 256):
        for dyn in (0, 2048, 16 * 1024, 40 * 1024):
            want = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, block, dyn)
            got = occupancy(block, regs, static + dyn, spec, carveout=carveout).blocks_per_sm
            if got != want:
                bad.append((block, dyn, got, want))
    assert not bad, f"carveout {carveout}%: (block, dynamic, ours, driver): {bad}"
