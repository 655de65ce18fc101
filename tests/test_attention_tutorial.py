"""Tutorial 07 without a GPU: every step compiles for its arch, with the instructions its text promises, and the
Hopper step's tensor-map parameters are what kernellab.tensor_map feeds."""
import pytest

pytest.importorskip("torch")   # benchmarks/attention.py imports torch at the top (it times against SDPA)

from attention_steps import attention_benchmark  # noqa: E402

A = attention_benchmark()


@pytest.fixture(scope="module")
def steps():
    return A.load_families(None, None)


def test_the_notebook_has_steps_2_and_3_for_both_dtypes_head_dims_and_masks(steps):
    families, configs = steps
    assert set(families) == {"fa2", "fa3", "fa3p", "fa3p_sched"}
    for fam in ("fa2", "fa3"):
        assert sorted(families[fam]) == sorted(f"{fam}_{dt}_d{d}{c}" for dt in ("bf16", "f16") for d in (64, 128)
                                                for c in ("", "_causal"))
    # step 3b: at d = 64 both heights (192 rows, and 128 rows named _bm128), and the short-sequence variant (_bm64)
    assert sorted(families["fa3p"]) == sorted(f"fa3p_{dt}_d{d}{c}{h}" for dt in ("bf16", "f16") for d in (64, 128)
                                              for c in ("", "_causal") for h in ("", "_bm128", "_bm64")
                                              if d == 64 or not h)
    assert configs["fa2"]["MT"] == 2 and configs["fa2"]["NWARPS"] == 4 and configs["fa3"]["WG64"] == 3
    # step 3b with ping-pong scheduling: fa3p's heights at each head dim (192 rows at d = 64), fa3p's tiles
    assert sorted(families["fa3p_sched"]) == sorted(f"fa3p_sched_{dt}_d{d}{c}" for dt in ("bf16", "f16")
                                                    for d in (64, 128) for c in ("", "_causal"))
    assert configs["fa3p_sched"] == configs["fa3p"] and configs["fa3p"]["BN128"] == 128


@pytest.mark.parametrize("name, threads", [("fa3p_bf16_d64", 512), ("fa3p_f16_d64_causal_bm128", 384),
                                           ("fa3p_bf16_d128_causal", 384)])
def test_step3b_is_persistent_wgmma_with_a_work_counter(steps, name, threads):
    k = steps[0]["fa3p"][name]
    text = str(k.instruction_summary)
    assert k.arch == "sm_90a" and "HGMMA.64x128x16.F32" in text and "UTMALDG" in text, text
    assert not k.resources.spills and k.resources.local_bytes == 0, k.resources
    assert k.resources.max_threads_per_block == threads
    assert [p.name for p in k.params] == ["tq", "tk", "tv", "o", "n", "bh", "heads_per_section", "work_counter",
                                          "scale"]
    assert "ATOMG" in k.sass or "RED" in k.sass or "ATOM" in k.sass      # the draw from the work counter


def test_step3b_block_height_model():
    """128-row blocks where whole tiles across the causal diagonal waste more than the 0.86 throughput costs."""
    assert A.computed_area(1024, 192, 128, True) == 192 * 128 * (2 + 3 + 5 + 6 + 8 + 8)
    assert A.computed_area(1024, 128, 128, True) == 128 * 128 * sum(range(1, 9))
    assert A.computed_area(1000, 192, 128, False) == 6 * 192 * 8 * 128        # padding of the last block counted
    assert A.persistent_block_m(1024, 64, True) == 128
    assert A.persistent_block_m(2048, 64, True) == 192
    assert all(A.persistent_block_m(n, 64, False) == 192 for n in (1000, 1024, 4096, 16384))
    assert all(A.persistent_block_m(n, 128, c) == 128 for n in (1024, 4096) for c in (False, True))


@pytest.mark.parametrize("name", ["fa2_bf16_d64", "fa2_f16_d128_causal"])
def test_step2_is_mma_sync_with_ldmatrix_and_cp_async(steps, name):
    k = steps[0]["fa2"][name]
    assert k.arch == "sm_90" and k.resources.max_threads_per_block == 128
    s = k.instruction_summary
    text = str(s)
    assert "HMMA.16816.F32" in text and "LDSM" in text and "LDGSTS" in text and "HGMMA" not in text, text
    assert k.resources.spill_store_bytes <= 64, k.resources       # d = 128 spills a few bytes, d = 64 none
    assert [p.name for p in k.params] == ["q", "k", "v", "o", "lse", "n", "scale"]


def test_step2_takes_its_softmax_and_p_v_from_the_header(steps):
    """Step 2's S = Q K^T, online softmax and O += P V (tutorial 09's mma.sync kernels run the same code) are written
    once, in kernellab/include/kl/attention_mma.cuh: the cell calls scores_qk and softmax_pv and holds no copy."""
    src = next(iter(steps[0]["fa2"].values())).module.source
    assert "#include <kl/attention_mma.cuh>" in src and src.count("softmax_pv<") == 1, src[:400]
    assert src.count("scores_qk<") == 1 and "mma_16816<T>(" not in src
    assert not any(s in src for s in ("exp2_approx(", "__any_sync", "ldmatrix_x4_trans(", "uint32_t swz("))
    # and the registers' start (init_oml) and the output's 1 / l (the quad's sum of l, quad_sum_inv), which tutorial
    # 09's mma.sync kernels share
    assert src.count("init_oml(") == 1 and src.count("quad_sum_inv(") == 1 and "__shfl_xor_sync" not in src


@pytest.mark.parametrize("name", ["fa3_bf16_d64", "fa3_f16_d128_causal"])
def test_step3_is_wgmma_fed_by_tma(steps, name):
    k = steps[0]["fa3"][name]
    assert k.arch == "sm_90a"
    text = str(k.instruction_summary)
    assert "HGMMA.64x128x16.F32" in text and "UTMALDG" in text and "HMMA.16816" not in text, text
    assert not k.resources.spills and k.resources.local_bytes == 0, k.resources
    maps = [p for p in k.params if p.ctype.endswith("CUtensorMap")]
    assert [p.name for p in maps] == ["tq", "tk", "tv"] and all(p.size_bytes == 128 for p in maps)
    threads = 128 * ((3 if "d64" in name else 2) + 1)                 # producer + consumer warpgroups
    assert k.resources.max_threads_per_block == threads


@pytest.mark.slow
def test_step3_needs_sm90a(steps):
    """The Hopper cell compiled for plain sm_90 fails with the hint to use sm_90a."""
    import kernellab

    src = next(iter(steps[0]["fa3"].values())).module.source
    with pytest.raises(kernellab.CompileError) as info:
        kernellab.compile_cuda(src, arch="sm_90")
    assert "sm_90a" in str(info.value)


def test_steps_3_and_3b_share_one_consumer_from_the_headers(steps):
    """The consumer warpgroup's work (S = Q K^T, the softmax, O += P V, the output) is written once, in
    kernellab/include/kl/attention.cuh: the step-3 cell calls it from both kernels and holds no copy of it."""
    import pathlib

    from kernellab.compile import toolkit

    src = next(iter(steps[0]["fa3"].values())).module.source
    assert "#include <kl/attention.cuh>" in src and src.count("wg_attention<") == 2, src[:400]
    assert not any(s in src for s in ("wgmma_ss<", "wgmma_rs_tb<", "exp2_approx(", "__shfl_xor_sync"))
    header = (pathlib.Path(toolkit.KL_INCLUDE) / "kl" / "attention.cuh").read_text()
    assert "wgmma_ss<" in header and "wgmma_rs_tb<" in header and "exp2_approx(" in header
    # the producer's copies too: Q and the K/V ring (QKvRing, init_kv_ring, produce_q, produce_kv), written once in the
    # header; step 3 takes its shared-memory layout from QKvRing, step 3b (two Q buffers) its ring's barriers
    assert src.count("produce_kv<") == 2 and src.count("produce_q<") == 2, src[:400]
    assert src.count("QKvRing<") == 1 and src.count("init_kv_ring<") == 1 and "mbar_expect_tx(" not in src
    assert "tma_load_3d(" not in src and "tma_load_3d(" in header
    # and step 3's block prologue (the causal tile count, the fenced mbarrier inits), which tutorial 09's GQA kernel
    # shares: kv_tiles and QKvRing::init_barriers_and_sync; step 3b fences its own barriers with fence_mbarrier_init
    assert src.count("kv_tiles<") == 1 and src.count("init_barriers_and_sync(") == 1, src[:400]
    assert "fence.mbarrier_init" not in src and src.count("fence_mbarrier_init();") == 1
