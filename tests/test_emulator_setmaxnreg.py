"""setmaxnreg on the CPU runtime's fibers (kernellab/run/sim/cuda/hopper.h), through emulate(): registers are not
modelled, so a legal reallocation changes nothing, and what a GPU requires of it is checked: the count a multiple of
8 in [24, 256], the same count executed by every thread of a whole warpgroup, inc not lowering and dec not raising,
and the block's warpgroups within an SM's 65,536 registers."""
import numpy as np
import pytest

from kernellab.run.sim.cuda.emulate import EmulationError, compiler, emulate

pytestmark = pytest.mark.skipif(compiler() is None, reason="no host C++ compiler for the emulation")

SOURCE = r"""
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R)); }

// Warpgroup 0 the producer, the others consumers, as tutorial 08's step 3; mode picks a mistake (0: none).
extern "C" __global__ void __launch_bounds__(384, 1) rebalance(int* out, int mode) {
    const int wg = threadIdx.x / 128, warp = threadIdx.x / 32;
    if (wg == 0) {
        if (mode == 1 && warp == 1) {                       // one warp of the producer skips it and exits
            out[threadIdx.x] = -1;
            return;
        }
        if (mode == 2 && warp == 3) setmaxnreg_dec<32>();   // another count in one warp
        else setmaxnreg_dec<PRODUCER>();
        out[threadIdx.x] = 1;
        return;
    }
    setmaxnreg_inc<CONSUMER>();
    if (mode == 3) setmaxnreg_inc<200>();                   // an inc that lowers
    out[threadIdx.x] = 2 + wg;
}
"""


def run(mode=0, producer=24, consumer=240, threads=384):
    out = np.zeros(threads, np.int32)
    src = SOURCE.replace("PRODUCER", str(producer)).replace("CONSUMER", str(consumer))
    emulate(src, "rebalance", (1,), (threads,), [out, mode], 0)
    return out


def test_a_legal_rebalance_runs_and_changes_nothing():
    out = run()
    assert (out[:128] == 1).all() and (out[128:256] == 3).all() and (out[256:] == 4).all()


@pytest.mark.parametrize("mode,match", [
    (1, "exited without executing it|exited having executed 0"),
    (2, "every thread of a warpgroup must execute the same setmaxnreg"),
    (3, "inc may not lower it")])
def test_a_warpgroup_that_does_not_agree_is_an_error(mode, match):
    with pytest.raises(EmulationError, match=match):
        run(mode)


def test_more_registers_than_an_sm_has_is_an_error():
    with pytest.raises(EmulationError, match="more than an SM's 65,536"):       # 128 x 24 + 256 x 256 = 68,608
        run(consumer=256)


def test_a_partial_warpgroup_is_an_error():
    with pytest.raises(EmulationError, match="needs whole warpgroups"):
        run(threads=288)


@pytest.mark.parametrize("count", [20, 236, 264])
def test_an_illegal_count_does_not_compile(count):
    with pytest.raises(EmulationError, match="multiple of 8 in \\[24, 256\\]"):
        run(consumer=count)
