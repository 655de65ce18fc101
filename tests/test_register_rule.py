"""The register rule (registers per SM sub-partition) written once, in kernellab.analysis.occupancy, and the three
places that use it agreeing: occupancy(), the launch check's message (registers_do_not_fit) and a kernel's
max_threads_per_block (max_threads_for)."""
import numpy as np
import pytest

from kernellab.analysis.arch import ARCHS
from kernellab.analysis.occupancy import (OccupancyInputError, max_registers_at_threads, max_threads_at_registers,
                                          occupancy, occupancy_sweep, warps_per_sub_partition)
from kernellab.kernel import max_threads_for
from kernellab.run.launch import launch as L

SIZES = np.arange(32, 1025, 32)        # every block size in whole warps
REGS = np.arange(32, 256)              # every register count ptxas gives a kernel that needs more than 32


def verdicts(arch) -> np.ndarray:
    """(len(REGS), len(SIZES)) bool: whether occupancy_sweep says a block launches (at least 1 block per SM)."""
    sweep = occupancy_sweep(SIZES[None, :], REGS[:, None], 0, arch)
    return sweep.blocks_per_sm > 0


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_max_threads_and_max_registers_are_occupancys_verdicts_inverted(arch):
    """For every register count 32..255 and block size 32..1024 (whole warps): the blocks that launch are exactly
    those up to max_threads_at_registers, and the register counts that launch a block are exactly those up to
    max_registers_at_threads, as occupancy() counts blocks per SM."""
    fits = verdicts(arch)
    for i, r in enumerate(REGS):
        most = max_threads_at_registers(int(r), arch)
        assert np.array_equal(fits[i], SIZES <= most), (arch, int(r), most, SIZES[fits[i]])
    for j, t in enumerate(SIZES):
        most = max_registers_at_threads(int(t), arch)
        assert np.array_equal(fits[:, j], REGS <= most), (arch, int(t), most)
        assert most % 8 == 0 or most == ARCHS[arch].max_registers_per_thread   # whole 256-register units a warp


def test_the_scalar_occupancy_agrees_with_the_sweep_and_the_function_on_sm90():
    fits = verdicts("sm_90")
    for i, r in enumerate(REGS):
        row = [occupancy(int(t), int(r), 0, "sm_90").blocks_per_sm > 0 for t in SIZES]
        assert row == list(fits[i]), int(r)
        assert max(SIZES[row]) == max_threads_at_registers(int(r), "sm_90")


def test_the_rule_in_numbers_a_sub_partition_not_the_register_file():
    """The rule stated here independently, from the sm_90 table's numbers: a warp's registers are registers x 32
    rounded up to 256; the fullest of the 4 sub-partitions holds ceil(warps / 4) of them within 65536 / 4."""
    spec = ARCHS["sm_90"]
    for r in REGS:
        per_warp = -(-int(r) * 32 // 256) * 256
        by_hand = max(t for t in SIZES if -(-(int(t) // 32) // 4) * per_warp <= 65536 // 4)
        assert max_threads_at_registers(int(r), spec) == by_hand, int(r)
        assert warps_per_sub_partition(int(r), spec) * 4 * 32 >= by_hand
    # whole-register-file division (65536 // 7168 = 9 warps = 288 threads) is what the rule is not
    assert max_threads_at_registers(224) == 256 and 65536 // (224 * 32) * 32 == 288
    assert max_registers_at_threads(288) == 168 and max_registers_at_threads(256) == 255
    assert max_threads_at_registers(0) == 1024 and max_threads_at_registers(32, launch_bounds_threads=100) == 100
    with pytest.raises(OccupancyInputError, match="registers=256"):
        max_threads_at_registers(256)
    with pytest.raises(OccupancyInputError, match="threads=1025"):
        max_registers_at_threads(1025)


# Recorded on an NVIDIA H100 (sm_90), driver 580, 2026-11-27, with tests/gpu/test_launch_limits_gpu.py's HEAVY kernel
# (ptxas's count equals its __maxnreg__ at 168 and 224): (registers a thread, threads, what the driver said), and the
# driver's CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK for the 224-register kernel.
DRIVER_SM90 = [
    (224, 288, L.OUT_OF_RESOURCES),
    (224, 256, ""),
    (168, 288, ""),
]
DRIVER_MAX_THREADS_SM90 = {224: 256}


@pytest.mark.parametrize("registers, threads, said", DRIVER_SM90)
def test_the_drivers_verdicts_on_an_h100(registers, threads, said):
    why = L.registers_do_not_fit(threads, registers, 0, "sm_90")
    assert bool(why) == bool(said), why
    assert (threads <= max_threads_at_registers(registers, "sm_90")) == (not said)
    assert (registers <= max_registers_at_threads(threads, "sm_90")) == (not said)


def test_max_threads_per_block_is_the_drivers_attribute():
    for registers, threads in DRIVER_MAX_THREADS_SM90.items():
        assert max_threads_for(registers, None, "sm_90") == threads
        assert max_threads_for(registers, None, "sm_90a") == threads
        assert max_threads_for(registers, (128, 1, 1), "sm_90") == 128          # launch bounds below it


def test_the_launch_checks_message_comes_from_the_same_function():
    why = L.registers_do_not_fit(288, 224, 0, "sm_90")
    assert "3 x 7168" in why and "16384 each holds" in why
    assert f"at most {max_registers_at_threads(288)} registers" in why
    assert f"at most {max_threads_at_registers(224)} threads" in why
    assert L.registers_do_not_fit(256, 224, 0, "sm_90") == ""


def test_a_block_above_the_register_limit_gets_the_drivers_error_one_above_launch_bounds_an_argument_error():
    """make_config, which the GPU path and the CPU path both use: above the max_threads_per_block the registers set,
    the LaunchError of CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES with the sub-partition arithmetic (what the driver says at
    288 threads x 224 registers); above __launch_bounds__, the ArgumentError naming max_threads_per_block."""
    from kernellab.errors import ArgumentError, LaunchError
    from kernellab.run.launch.device import device_for_arch

    h100 = device_for_arch("sm_90")
    limit = max_threads_for(224, None, "sm_90")
    for threads in (288, 320, 1024):
        with pytest.raises(LaunchError) as info:
            L.make_config(1, threads, 0, max_threads_per_block=limit, static_shared_bytes=0, device=h100,
                          registers=224, name="heavy")
        assert info.value.cuda_error == L.OUT_OF_RESOURCES and "sub-partitions" in str(info.value)
    L.make_config(1, 256, 0, max_threads_per_block=limit, static_shared_bytes=0, device=h100, registers=224)
    bounded = max_threads_for(224, (128, 1, 1), "sm_90")
    with pytest.raises(ArgumentError, match="max_threads_per_block = 128"):
        L.make_config(1, 288, 0, max_threads_per_block=bounded, static_shared_bytes=0, device=h100, registers=224)
    with pytest.raises(ArgumentError, match="max_threads_per_block = 256"):     # no device: no register check
        L.make_config(1, 288, 0, max_threads_per_block=limit, static_shared_bytes=0, device=None, registers=224)
    with pytest.raises(ArgumentError, match="grid dimension y"):                # argument errors still come first
        L.make_config((1, 70000), 288, 0, max_threads_per_block=limit, static_shared_bytes=0, device=h100,
                      registers=224)


from launch_plans import HEAVY  # noqa: E402  (NVRTC compile-only here; the GPU test launches the same source)


def test_a_compiled_kernels_max_threads_per_block_and_card_count_a_sub_partition(tmp_cache):
    import kernellab
    from kernellab.errors import ArgumentError

    for nreg in (168, 200, 224, 255):
        k = kernellab.compile_cuda(HEAVY.replace("NREG", str(nreg)), arch="sm_90").heavy
        r = k.resources
        assert r.max_threads_per_block == max_threads_at_registers(r.registers, "sm_90"), (nreg, r)
        card = {c["name"]: c for c in k.module.to_json()["kernels"]}["heavy"]
        assert card["max_threads_per_block"] == r.max_threads_per_block
        assert card["occupancy"]["block_size"] <= r.max_threads_per_block
    assert r.registers == 255 and r.max_threads_per_block == 256
    k = kernellab.compile_cuda(HEAVY.replace("NREG", "224"), arch="sm_90").heavy
    assert k.resources.registers == 224 and k.resources.max_threads_per_block == 256           # the driver's 256
    assert "max 256 threads/block" in str(k.resources)
    with pytest.raises(ArgumentError, match="7168 a warp; one of the SM's 4 sub-partitions holds 2 such warps, so "
                                            "256 threads at most"):
        k.occupancy(288)
    assert k.occupancy(256).blocks_per_sm == 1
