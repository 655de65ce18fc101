"""The one GPU runner: named suites of GPU tests, notebooks and benchmarks, with logs under $OUT and a summary table.

    python3 tools/gpu/run.py SUITE [SUITE ...]       # on the GPU machine, from anywhere in the repository
    python3 tools/gpu/run.py notebooks 04 07         # a suite's arguments follow it (here: which tutorials)
    python3 tools/gpu/run.py bench-matmul --only sgemm    # (a benchmark's: passed to its script)
    python3 tools/gpu/run.py --gpus 4 SUITE ...      # suites spread over 4 GPUs of this host, one lane each
    python3 tools/gpu/run.py --list                  # the suites, what each runs, its time limit
    python3 tools/gpu/run.py --dry-run SUITE ...     # the commands it would run

It uses the machine's own python3 (torch, CuPy, numba-cuda), first installing the wheels carried in .whl/
(tools/gpu/wheels.sh fetches them: IPython, Jupyter's kernel, Dask, ...) into /tmp/site, ahead on PYTHONPATH. Each
suite runs under its time limit (each fits one 10-minute call on its own) with its output in $OUT/<suite>.log (OUT
defaults to ./gpu-out), artifacts in $OUT/<suite>/ (KERNELLAB_ARTIFACTS, executed notebooks, benchmark tables), and
all of them in one $OUT/0-<suite>[.<suite>...].tgz (the device tool brings back a limited number of files, by path
order: that one comes first and holds everything). The last thing printed is one line per suite: its seconds and
passed/failed. The exit status is 0 only if every suite passed. `make gpu-test` runs every test suite (`tests`).
"""
from __future__ import annotations

import glob
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SITE = Path("/tmp/site")


@dataclass(frozen=True)
class Suite:
    """What one named suite runs: pytest over `tests` (with `-m gpu`), or the commands in `commands` (each an argv
    from the repository root; "{out}" becomes the suite's artifact folder), under `limit_s` seconds in all."""
    about: str
    limit_s: int
    tests: tuple[str, ...] = ()
    commands: tuple[tuple[str, ...], ...] = ()
    takes_args: bool = False
    needs_kernel: bool = False              # a Jupyter kernel spec (notebooks, the fault suite)
    all_gpus: bool = False                  # uses every GPU of the host: runs alone, after the lanes of --gpus
    select: str = ""                        # pytest -k: a share of the files' tests (the others in sibling suites)
    env: dict = field(default_factory=dict)

    def paths(self) -> list[str]:
        """Every file in the repository this suite names (test files and scripts), for the check that none rots."""
        named = list(self.tests)
        for argv in self.commands:
            named += [a for a in argv if a.endswith((".py", ".sh")) and "/" in a]
        return named


PY = "python3"
GPU_TESTS = "tests/gpu/"
PYTEST_GPU = (PY, "-m", "pytest", "-p", "no:cacheprovider", "-m", "gpu", "-q", "--tb=short")   # + report flags, files

def backward_variant_suite(about: str, select: str, variants: str, *bench_args: str) -> Suite:
    """A suite for tutorial 08's backward variants: their GPU tests (-k select), then benchmarks/attention_backward.py
    timing them at N = 4096, d = 64 and 128 beside SDPA (and the variants named)."""
    return Suite(about, 300, commands=(
        (*PYTEST_GPU, "-rfEs", "-s", "-k", select, GPU_TESTS + "test_attention_backward_gpu.py"),
        (PY, "benchmarks/attention_backward.py", "--quick", *bench_args, "--dims", "64,128", "--variants", variants,
         "--ns", "4096", "--out", "{out}")))


def train_gpt2(*configs: str) -> tuple:
    """The command of a training suite: benchmarks/train_gpt2.py over `configs`, 3 profiled steps each."""
    return ((PY, "benchmarks/train_gpt2.py", "--profile", "3", "--configs", ",".join(configs), "--out", "{out}"),)


SUITES: dict[str, Suite] = {
    "tests-launch": Suite(
        "launching: kernels from CuPy/torch arguments, the launch fast path, TMA descriptors, Numba kernels, faults "
        "isolated in workers, occupancy against the driver, source lines of SASS, kernels as torch ops", 570,
        tests=tuple(GPU_TESTS + f for f in (
            "test_launch_gpu.py", "test_launch_path_gpu.py", "test_tma_gpu.py", "test_numba_gpu.py",
            "test_faults_gpu.py", "test_occupancy_gpu.py", "test_source_view_gpu.py", "test_ops_gpu.py")),
        needs_kernel=True),
    "tests-launch-limits": Suite(
        "the launches kernellab refuses before the driver (registers per SM sub-partition, shared memory with the "
        "opt-in; the CPU path's checks on the arch table) against the driver's own verdicts and words, every block "
        "size to 1024 at 96-255 registers, and max_threads_per_block against CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK; "
        "a failure lists each disagreement as (threads, who refuses)", 180,
        tests=(GPU_TESTS + "test_launch_limits_gpu.py",)),
    "tests-measure": Suite(
        "measuring: bench against triton's do_bench, check, autotune (one GPU and Dask), Nsight Compute and "
        "compute-sanitizer wrappers, bank conflicts against ncu", 570,
        tests=tuple(GPU_TESTS + f for f in (
            "test_bench_gpu.py", "test_check_gpu.py", "test_hostile_gpu.py", "test_autotune_gpu.py",
            "test_tools_gpu.py", "test_ncu_banks_gpu.py", "test_as_called_gpu.py"))),
    "tests-sanitizer-pool": Suite(
        "warm compute-sanitizer processes (kernellab.run.nvtools.sanitize_pool), jobs split by the program order of "
        "the tool's output: racecheck and memcheck each over clean, racy, clean, racy in one process (the race on the "
        "racy jobs only, stats ordered, memcheck's end-of-job report before each end line, the second job's CUDA "
        "context part small), memcheck keeping its process over out of bounds, clean, out of bounds, clean "
        "(--destroy-on-device-error kernel), a hang replacing it, the one-shot path (KERNELLAB_SANITIZER_POOL=0) "
        "agreeing, tutorial 02's grader with KERNELLAB_SANITIZER_POOL=1 over reference, racy variant, out-of-bounds "
        "variant, reference (no process started after the first grade, each finding on its variant only); a table "
        "last (tool, job, process started, context_s, wall, errors, findings)",
        120, tests=(GPU_TESTS + "test_sanitizer_pool_gpu.py",), env={"PYTEST_ADDOPTS": "-s"}),
    "tests-sim": Suite(
        "the simulators against the hardware: racecheck's corpus, tutorial 00's puzzles graded on the GPU "
        "(compute-sanitizer and the simulator's checks side by side; ~7 s a test), CUDA C++ on the CPU path against "
        "the GPU", 570,
        tests=(GPU_TESTS + "test_racecheck_gpu.py", GPU_TESTS + "test_exercises_gpu.py",
               GPU_TESTS + "test_cuda_cpu_gpu.py"),
        select="00- or not test_exercises_gpu"),
    "tests-exercises-01-04": Suite(
        "tutorials 01-04's exercises graded on the GPU: reference solutions and every wrong variant; the grader's "
        "fault, race and out-of-bounds reports", 570,
        tests=(GPU_TESTS + "test_exercises_gpu.py",), select="01- or 02- or 03- or 04- or not ["),
    "tests-exercises-05-07": Suite(
        "tutorials 05-07's exercises graded on the GPU, and tutorials 08's and 09's", 570,
        tests=(GPU_TESTS + "test_exercises_gpu.py", GPU_TESTS + "test_exercises07_gpu.py"),
        select="05- or 06- or 07- or 08- or 09- or test_exercises07_gpu"),
    "tests-tutorials": Suite(
        "the tutorials' kernels on awkward shapes: row kernels (03/04), matmul ladders (05/06), attention (07), and "
        "the device headers they include (kernellab/include/kl); a notebook run stamped with the GPU for its recorded "
        "outputs", 570,
        tests=tuple(GPU_TESTS + f for f in (
            "test_kl_headers_gpu.py", "test_memory_bound_gpu.py", "test_matmul_gpu.py", "test_attention_gpu.py",
            "test_attention_steps_gpu.py", "test_recorded_gpu.py")), needs_kernel=True),
    "tests-attention-inference": Suite(
        "tutorial 09's grouped-query attention and flash-decoding kernels against float64 and SDPA (enable_gqa) on "
        "awkward lengths, GQA ratios, batches of different cache lengths, both dtypes; the one-launch decode against "
        "its two-kernel step, across split floors, 300 repeated calls, two streams; the ops compiled and in a "
        "CUDA graph (the decode variants' tests: tests-decode-variants)", 300,
        tests=(GPU_TESTS + "test_attention_inference_gpu.py",), select="not online_merge and not early_first_tile"),
    "tests-decode-variants": Suite(
        "tutorial 09's decode variants that profile-decode times: merge='online' (the last block's merge in one "
        "pass) and early=True (the first tile asked for before cache_seqlens, NaN past every length) against float64 "
        "and SDPA on cache lengths 1, 63, 65, 1000, 1031, 4097, 33000 and a batch of different lengths, GQA ratios 1, "
        "4, 8, both dtypes, and bitwise or within rounding of the default", 300,
        tests=(GPU_TESTS + "test_attention_inference_gpu.py",), select="online_merge or early_first_tile"),
    "tests-attention-dispatch": Suite(
        "tutorial 07's entry point (kl::attention, from the notebook's launcher cell): its output equals the kernel "
        "its plan names, opcheck; the short-sequence variant (fa3p_*_bm64) on awkward shapes against SDPA; the "
        "attention grid's paired timing (bench-attention-grid runs those first too)", 300,
        tests=(GPU_TESTS + "test_attention_dispatch_gpu.py", GPU_TESTS + "test_attention_grid_pairing_gpu.py")),
    "tests-train": Suite(
        "training on kernellab's ops: a 2-layer GPT's --quick run of benchmarks/train_gpt2.py (PyTorch eager, two "
        "seeds, torch.compile, tutorials 08/04's kl_flash_attention and kl_layernorm) inside the seed noise band; one "
        "step's gradients with kernellab's ops against float64", 420,
        tests=(GPU_TESTS + "test_train_gpt2_gpu.py",), select="not graph"),
    "tests-train-graphs": Suite(
        "the training step as one CUDA graph: a 2-layer GPT's forward and backward captured (PyTorch's ops, then "
        "kernellab's) and replayed on new batches against the eager step's loss and gradients; a --quick run of "
        "eager, kernellab and their graphed steps (graphs, kernellab-graphs) inside the seed band, every step after "
        "the warm-up a replay", 420,
        tests=(GPU_TESTS + "test_train_gpt2_gpu.py",), select="graph"),
    "tests-norm-backward": Suite(
        "tutorial 04's LayerNorm/RMSNorm backward: gradients against float64 beside PyTorch's on awkward shapes and "
        "three distributions, the long rows' statistics by column slices and by rows (3x100003, 7x65537), "
        "determinism, kl::layernorm/kl::rmsnorm under loss.backward(), opcheck, torch.compile",
        300, tests=(GPU_TESTS + "test_norm_backward_gpu.py",)),
    "bench-norm-backward": Suite(
        "benchmarks/norm_backward.py: the norm backward as called (the op's autograd) against torch eager and "
        "torch.compile backward, kernellab.bench / do_bench / sustained; bf16 at every shape, float32 at two; the "
        "model's prediction beside each (3x100003: statistics by column slices); --plans: the launcher alone at "
        "1000x1031 with blocks of 512 (default) and 1024", 300,
        commands=((PY, "benchmarks/norm_backward.py", "--quick", "--dtypes", "bfloat16", "--plans", "--out",
                   "{out}/bf16"),
                  (PY, "benchmarks/norm_backward.py", "--quick", "--dtypes", "float32", "--shapes",
                   "4096x1024,4096x32768", "--out", "{out}/fp32"))),
    "tests-add-norm": Suite(
        "the residual add fused with LayerNorm (kl::add_layernorm, kernellab.teach.add_norm): h, y and the gradients "
        "of x, r, w, b against float64 beside PyTorch's own error on awkward shapes (1x1 to 16384x768, 9x8192), two "
        "distributions, (x, r) float32/float32, float32/bf16, bf16/bf16; determinism; the op under loss.backward() "
        "against F.layer_norm(x + r), opcheck, torch.compile, a CUDA graph, a GPT under bf16 autocast; a 2-layer GPT "
        "trained 30 steps with it, eager and as one CUDA graph a step, inside eager PyTorch's seed band", 300,
        tests=(GPU_TESTS + "test_add_norm_gpu.py",)),
    "bench-add-norm": Suite(
        "tests-add-norm's GPU tests (but the training run), then benchmarks/add_norm.py at 16384x768 (float32 "
        "stream + bf16 branch, and bf16 + bf16): the fused add + LayerNorm forward + backward as called against our "
        "add + kl_layernorm and torch.compile of F.layer_norm(x + r) (kernellab.bench / do_bench / sustained), the "
        "fused forward and "
        "backward alone, each beside its prediction; the table printed last", 300,
        commands=((*PYTEST_GPU, "-rfEs", "-k", "not tiny_gpt", GPU_TESTS + "test_add_norm_gpu.py"),
                  (PY, "benchmarks/add_norm.py", "--quick", "--dtypes", "float32:bfloat16,bfloat16:bfloat16",
                   "--out", "{out}"))),
    "profile-add-norm": Suite(
        "tools/gpu/norm_stalls.py on the fused add + LayerNorm's backward rows kernel at 16384x768 (float32 stream + "
        "bf16 branch, and bf16 + bf16): Nsight Compute's DRAM and L2 throughput, bytes, warp states, occupancy and "
        "the SASS lines with the most stall samples, side by side", 240,
        commands=((PY, "tools/gpu/norm_stalls.py", "{out}", "add_norm_bwd float32:bfloat16 16384x768",
                   "add_norm_bwd bfloat16:bfloat16 16384x768"),)),
    "norm-host-path": Suite(
        "benchmarks/norm_backward.py --host-only on the GPU host's CPU (no GPU used: launches to a stand-in driver): "
        "the host µs of the backward bench-norm-backward times as called, layer by layer, beside autograd's "
        "Python-node floor and torch's C++ node, for LayerNorm and RMSNorm bf16 4096x1024 and 8192x768; set beside "
        "bench-norm-backward's do_bench figures it gives that host's µs per CPU µs here", 240,
        commands=((PY, "benchmarks/norm_backward.py", "--host-only", "--calls", "5000", "--rounds", "5"),)),
    "add-norm-host-path": Suite(
        "benchmarks/add_norm.py --host-only on the GPU host's CPU (no GPU used: launches to a stand-in driver): the "
        "host µs of kl::add_layernorm's forward op, backward op and forward + backward through autograd.grad (what "
        "bench-add-norm times as called), layer by layer, at 16384x768 float32 + bf16, the launchers before the "
        "per-call cut (main at cbb02e8, interleaved) beside the tree's, autograd's Python-node floor and add + "
        "kl_layernorm; set beside bench-add-norm's do_bench figures it gives that host's µs per CPU µs here", 240,
        commands=((PY, "benchmarks/add_norm.py", "--host-only", "--against", "cbb02e8", "--calls", "5000",
                   "--rounds", "5"),)),
    "notebooks": Suite(
        "tutorials top to bottom (all, or those named: `notebooks 04 07`); executed copies in $OUT/notebooks/", 580,
        commands=((PY, "tools/gpu/run_notebooks.py", "{out}"),), takes_args=True, needs_kernel=True),
    "tests-attention-backward": Suite(
        "tutorial 08: attention backward (variants a, b, the ladder's rungs, step 3's Hopper backward 'hopper') "
        "against SDPA's backward and float64 on "
        "awkward shapes, both "
        "dtypes, head dims 64/128, causal or not; the forward's LSE; the op's loss.backward() eager and compiled", 570,
        tests=(GPU_TESTS + "test_attention_backward_gpu.py",)),
    "bench-attention-backward": Suite(
        "benchmarks/attention_backward.py --quick: tutorial 08's backward (atomics, separate dQ pass, the ladder's "
        "rungs, step 3's Hopper backward 'hopper'; the fastest per (d, causal) printed as the op's BWD_OP_VARIANT "
        "line) against SDPA FLASH and CUDNN backward at N = 1024, 4096 (B*N = 16k, H*d = 2048), also as called "
        "(do_bench, sustained)", 300,
        commands=((PY, "benchmarks/attention_backward.py", "--quick", "--out", "{out}"),), takes_args=True),
    "hopper-backward": backward_variant_suite(
        "tutorial 08's step 3 (the Hopper backward: 384 threads, setmaxnreg 24 / 240) and step 3b (hopper_rows: "
        "the LSE and Dv by the producer's TMA into shared memory): their GPU tests (-k hopper: launches at d = 64 and "
        "128, gradients against float64 within 2x SDPA's error, agreement with atomic_w8 and of 3b with 3 on the "
        "awkward N), then the benchmark at d = 64 and 128, N = 4096, full and causal: 3 and 3b side by side against "
        "atomic_w8 and SDPA FLASH / CUDNN, 3b beside its written prediction in the table last",
        "hopper", "hopper,hopper_rows,atomic_w8"),
    "bench-attention-backward-2d": backward_variant_suite(
        "tutorial 08's rungs 8, 9 and 10 (atomic_2d: 2-D warp tiles, 32 keys x 32 queries a warp or warp pair, dQ by "
        "reductions; atomic_2d_ilp: the same with dQ's mma chains in two accumulator sets and the LSE / Dv rows by "
        "16-byte cp.async; atomic_fa2: FlashAttention-2's tile, 8 warps, 128 keys, 64-query steps, P and dS in "
        "shared memory): their GPU tests (-k 'atomic_2d or atomic_fa2': gradients against float64 within 2x SDPA's "
        "error, both dtypes, d 64/128, causal or not, N = 1 .. 4097; rung 9's LSE rows aligned and 4 bytes off), then "
        "the benchmark at N = 4096, d = 64 and 128, full and causal, beside atomic_w8 and SDPA FLASH / CUDNN by "
        "kernellab.bench, rungs 9's and 10's written predictions beside their measurements; a table last",
        "atomic_2d or atomic_fa2", "atomic_fa2,atomic_2d_ilp,atomic_2d,atomic_w8", "--no-as-called"),
    "bench-attention": Suite(
        "benchmarks/attention.py: tutorial 07's kernels against SDPA/FlashAttention", 400,
        commands=((PY, "benchmarks/attention.py", "--no-check"),), takes_args=True),
    "bench-attention-sched": Suite(
        "tutorial 07's step 3b with ping-pong scheduling (fa3p_sched): its GPU tests against SDPA on the awkward N, "
        "then benchmarks/attention.py --sched: fa3p_sched beside fa3p, SDPA FLASH and CUDNN at N = 2048, 4096, 8192, "
        "d = 64 and 128, causal and not (B*N = 16k, H*d = 2048), the ratio to fa3p last", 300,
        commands=((*PYTEST_GPU, "-rfEs", GPU_TESTS + "test_attention_steps_gpu.py", "-k", "fa3p_sched"),
                  (PY, "benchmarks/attention.py", "--no-check", "--sched")), takes_args=True),
    "bench-attention-inference": Suite(
        "benchmarks/attention_inference.py --quick: tutorial 09's GQA op and its two kernels (mma.sync, wgmma) "
        "against SDPA flash on K/V expanded beforehand, enable_gqa (cuDNN) and cudnn; decoding (one launch) as a "
        "share of copy, against the fastest PyTorch path and the two-kernel step, a split-floor sweep at B = 1; "
        "timed as called", 300,
        commands=((PY, "benchmarks/attention_inference.py", "--quick", "--out", "{out}"),), takes_args=True),
    "bench-attention-grid": Suite(
        "benchmarks/attention.py --grid --quick: the entry point against each of its steps and SDPA FLASH/CUDNN on "
        "short to long sequences, timed as called, and at each shape the entry point and the step it chose (the "
        "same kernel) timed again in both orders (entry, step, step, entry); last lines: where it loses to a step "
        "(by that paired timing: a gap beyond the spread of the same kernel's repeated timings and 3 %; inside it: "
        "noise or order) or to FLASH, the plan's "
        "constants (the device's: the H200's on an H200, else the H100's), then each shape whose choice moved from "
        "the golden run's on that GPU (attention_plan_h200.json or _h100.json) with both steps' times; "
        "$OUT/attention_plan_golden.json: the run as a golden table; first the paired timing's GPU tests (one "
        "kernel under two names is not a loss, 10 % more bytes is)", 300,
        commands=((*PYTEST_GPU, "-rfEs", GPU_TESTS + "test_attention_grid_pairing_gpu.py"),
                  (PY, "benchmarks/attention.py", "--grid", "--quick")), takes_args=True),
    "profile-attention-short": Suite(
        "benchmarks/attention.py --profile: Nsight Compute on each of tutorial 07's steps at short N (B*H 16 and 256, "
        "N = 512, d 64/128, causal or not; N = 4096 for contrast): tensor pipe, SMs active, occupancy, stall reasons, "
        "time per item beside the model's; last lines: what each outcome means", 300,
        commands=((PY, "benchmarks/attention.py", "--profile"),), takes_args=True),
    "profile-decode": Suite(
        "benchmarks/attention_inference.py --part decode --profile: tutorial 09's one-launch decode at B = 1 (caches "
        "1k, 8k, 32k, 128k) and B = 32 (8k) under Nsight Compute (the fused kernel, the same with empty caches, the "
        "split kernel alone, a lower split floor, the merge variant merge_loads=16, the variants merge='online', "
        "early=True and both, each against its written prediction): duration, DRAM %, bytes read, occupancy, SMs "
        "active, L2 hit rate, top stalls; the op by kernellab.bench with the L2 written, read, not flushed and in a "
        "CUDA graph; each beside the latency model; last lines: what each outcome means", 300,
        commands=((PY, "benchmarks/attention_inference.py", "--part", "decode", "--profile", "--out", "{out}"),),
        takes_args=True),
    "tests-decode-pdl": Suite(
        "programmatic dependent launch on the GPU: pdl=True launches wait for a producer that writes late and a "
        "control without griddepcontrol.wait shows the overlap; tutorial 09's decode_attention(pdl=True) behind "
        "decode_append equal to the plain step bit for bit, eagerly, through the op and from a captured CUDA graph "
        "(bench-decode-pdl runs these first too)", 240,
        tests=(GPU_TESTS + "test_decode_pdl_gpu.py",)),
    "bench-decode-pdl": Suite(
        "a decode step behind its producer with programmatic dependent launch (PDL): tests-decode-pdl's GPU tests, "
        "then benchmarks/attention_inference.py --part decode --pdl --quick: B = 1, "
        "caches 1k, 8k, 32k, 128k (and a QKV projection producer at 8k), producer, decode alone, the step plain and "
        "with PDL, by kernellab.bench, do_bench, sustained and a CUDA graph; decode's share of copy alone and in the "
        "step; a table last", 300,
        commands=(
            (*PYTEST_GPU, "-rfEsP", GPU_TESTS + "test_decode_pdl_gpu.py"),
            (PY, "benchmarks/attention_inference.py", "--part", "decode", "--pdl", "--quick", "--out", "{out}"))),
    "bench-decode-floor": Suite(
        "benchmarks/attention_inference.py --part decode --floor: tutorial 09's decode at B = 1 (caches 512, 1k, 2k, "
        "4k, 8k), the launcher with the plan's default split floor (decode_floor) against min_keys 64 (the old "
        "default), 16 and 32, and the op as called, each checked against SDPA, kernellab.bench clean and written L2; "
        "last lines: the model's table, then a line per cache with both and the ratio; fails where the plans differ "
        "and the default is > 3 % slower than min_keys 64", 300,
        commands=((PY, "benchmarks/attention_inference.py", "--part", "decode", "--floor", "--out", "{out}"),),
        takes_args=True),
    "profile-attention-backward": Suite(
        "benchmarks/attention_backward.py --profile: Nsight Compute on tutorial 08's atomic_w8 (preprocess, dK/dV "
        "with dQ reductions, dQ convert), atomic_2d (rung 8: its wavefronts per HMMA and time against its "
        "prediction, d 64/128), atomic_2d_ilp (rung 9: bank conflicts, wavefronts per HMMA and speed against rung 8 "
        "and its prediction), step 3 and SDPA FLASH's backward kernels (flash_bwd_*) at N = 4096, "
        "d 64/128, bf16, one launch each: duration, tensor pipe, issue slots, occupancy, top stalls, shared "
        "wavefronts and bank conflicts, L2 reductions, DRAM, beside the model of atomic_w8's tile step; last: the "
        "short table and one line per hypothesis (SUPPORTED / not shown); before it, ncu's per-source-line shared "
        "wavefronts (SourceCounters) of rungs 8 and 9 at d = 64: which instructions the bank conflicts are on", 300,
        commands=((PY, "benchmarks/attention_backward.py", "--profile", "--out", "{out}"),), takes_args=True),
    "train-gpt2": Suite(
        "benchmarks/train_gpt2.py: GPT-2 small on the standard library's bytes, 200 steps of batch 16 x 1024 for each "
        "of PyTorch eager (seeds 0 and 1; SDPA FLASH and EFFICIENT), kernellab's attention and LayerNorm (together and "
        "each alone), torch.compile of both: loss curves within the noise band, step times, each configuration's top "
        "kernels by torch.profiler (PNG, JSON, profiles in $OUT/train-gpt2/); `train-gpt2 --diagnose` adds where "
        "each configuration's step time goes (diagnose-CONFIG.txt)", 420,
        commands=((PY, "benchmarks/train_gpt2.py", "--profile", "3", "--out", "{out}"),), takes_args=True),
    "train-gpt2-graphs": Suite(
        "benchmarks/train_gpt2.py with the whole training step as one CUDA graph: GPT-2 small, 200 steps of batch 16 "
        "x 1024 each of eager (seeds 0 and 1: the noise band), torch.compile, their graphed steps (graphs, "
        "compiled-graphs), kernellab's eager and compiled steps and their graphed steps (kernellab-graphs, "
        "kernellab-compiled-graphs): loss curves in the band, step times against eager and compiled, the capturing "
        "step's time, 3 profiled steps each (GPU ms a step); the table printed last", 420,
        commands=train_gpt2("eager", "eager-seed1", "compiled", "graphs", "compiled-graphs", "kernellab",
                            "kernellab-compiled", "kernellab-graphs", "kernellab-compiled-graphs"), takes_args=True),
    "train-gpt2-fused": Suite(
        "benchmarks/train_gpt2.py with each residual add fused with the LayerNorm after it (kl_add_layernorm as the "
        "GPT's add_norm_op): GPT-2 small, 200 steps of batch 16 x 1024 each of eager (seeds 0 and 1: the noise "
        "band), torch.compile and its graphed step, kernellab's compiled graphed step without and with the fused op "
        "(kernellab-compiled-graphs, kernellab-fused-compiled-graphs) and the fused op's eager step: loss curves in "
        "the band, step times against eager and compiled, 3 profiled steps each (the norms' kernels); the table "
        "printed last", 540,
        commands=train_gpt2("eager", "eager-seed1", "compiled", "compiled-graphs", "kernellab-compiled-graphs",
                            "kernellab-fused", "kernellab-fused-compiled-graphs"), takes_args=True),
    "train-gpt2-diagnose": Suite(
        "benchmarks/train_gpt2.py --diagnose, 40 steps of eager and kernellab's configurations: host against GPU time "
        "a step, kernellab's launches and waits per thread, torch's synchronising calls, the allocator's "
        "cudaMalloc/cudaFree, Python's GC a step and the same steps with gc.freeze() and with the GC off, the "
        "launchers' host time split (driver launch calls, torch allocations, tensor maps and their cache misses, "
        "their own Python) and each launcher replayed alone (caches hot, and cold after a 64 MiB host write), "
        "torch.profiler's top host-side functions with Python stacks (diagnose-CONFIG.txt); the summary tables "
        "printed last", 300,
        commands=((PY, "benchmarks/train_gpt2.py", "--steps", "40", "--diagnose", "--configs",
                   "eager,kernellab-norm,kernellab-attention,kernellab", "--out", "{out}"),), takes_args=True),
    "bench-matmul": Suite(
        "benchmarks/matmul.py: tutorials 05/06's ladders against cuBLAS (every family)", 400,
        commands=((PY, "benchmarks/matmul.py"),), takes_args=True),
    "bench-memory": Suite(
        "benchmarks/memory_bound.py: tutorials 03/04's row kernels against PyTorch, torch.compile and the copy", 500,
        commands=((PY, "benchmarks/memory_bound.py", "--no-ladders", "--out", "{out}"),), takes_args=True),
    "launch-overhead": Suite(
        "benchmarks/launch_overhead.py: host cost per launch by path, its breakdown by stage, a registered op's "
        "host path on this host's CPU with the stand-in driver (--cpu: the same Python as the CPU machine's table, "
        "so the two hosts can be compared; --context: tutorial 04's op there with a large heap, gc.freeze(), the GC "
        "off and cold CPU caches, beside F.layer_norm's; --cold: its forward + backward stage by stage, warm and "
        "cold, against F.layer_norm's), registered ops", 290,
        commands=((PY, "benchmarks/launch_overhead.py", "--launches", "1000", "--rounds", "11"),
                  (PY, "benchmarks/launch_overhead.py", "--breakdown", "--launches", "1000", "--rounds", "11"),
                  (PY, "benchmarks/launch_overhead.py", "--cpu", "--launches", "50000", "--rounds", "10"),
                  (PY, "benchmarks/launch_overhead.py", "--context", "--launches", "2000", "--rounds", "7"),
                  (PY, "benchmarks/launch_overhead.py", "--cold", "--launches", "2000", "--rounds", "7"),
                  (PY, "benchmarks/launch_overhead.py", "--ops", "--launches", "500", "--rounds", "5"))),
    "attention-host-path": Suite(
        "benchmarks/launch_overhead.py --attention on this host's CPU: tutorial 08's attention op forward + backward "
        "with the stand-in driver and tensor maps, stage by stage, warm and with cold caches (the same Python as the "
        "CPU machine's table, so the two hosts compare; compiles tutorial 08's kernels for sm_90/sm_90a on a bare "
        "machine first); then --entry: tutorial 07's entry point and kl::attention against the step each picks at "
        "small grid shapes, and the grid's step op (07's kernels compiled for sm_90/sm_90a first)", 300,
        commands=((PY, "benchmarks/launch_overhead.py", "--attention", "--launches", "10000", "--rounds", "10"),
                  (PY, "benchmarks/launch_overhead.py", "--entry", "--launches", "4000", "--rounds", "10"))),
    "bench-validate": Suite(
        "benchmarks/validate_bench.py: kernellab.bench against triton's do_bench and Nsight Compute, burst and "
        "sustained", 580,
        commands=((PY, "benchmarks/validate_bench.py", "--workloads", "matmul,copy", "--modes", "burst,sustained"),),
        takes_args=True),
    "worker-overhead": Suite(
        "benchmarks/worker_overhead.py: a launch in the isolated worker against one in process, by argument path", 300,
        commands=((PY, "benchmarks/worker_overhead.py", "--budget", "30"),), takes_args=True),
    "autotune-multigpu": Suite(
        "benchmarks/autotune_multigpu.py: one SGEMM sweep on one GPU and over every GPU (needs Dask: DASK=1 "
        "tools/gpu/wheels.sh)", 500,
        commands=((PY, "benchmarks/autotune_multigpu.py"),), takes_args=True, all_gpus=True),
    "probe": Suite(
        "what the machine has: GPUs, driver, Python packages, CUDA tools", 60,
        commands=(("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"),
                  (PY, "-c", "import sys, numpy, torch, cupy; print(sys.version.split()[0], 'numpy', numpy.__version__,"
                   " 'torch', torch.__version__, 'cupy', cupy.__version__)"),
                  ("bash", "-c", "for t in nvcc ptxas cuobjdump nvdisasm ncu compute-sanitizer; do "
                   "printf '%s: %s\\n' $t \"$(command -v $t || echo missing)\"; done"))),
}
GROUPS = {"tests": [s for s in SUITES if s.startswith("tests-")]}     # `make gpu-test`


def notebook_paths(names: list[str]) -> list[str]:
    """notebooks/NN-*.py for each name ("04", "04-layernorm", "notebooks/04-layernorm.py"); all of them for none."""
    every = sorted(glob.glob("notebooks/[0-9]*.py", root_dir=ROOT))
    if not names:
        return every
    picked = []
    for name in names:
        stem = Path(name).stem
        hits = [p for p in every if Path(p).stem == stem or Path(p).stem.startswith(stem + "-")]
        if len(hits) != 1:
            raise SystemExit(f"notebooks: {name!r} names {len(hits)} tutorials; expected one of "
                             f"{', '.join(Path(p).stem for p in every)}")
        picked += hits
    return picked


def parse_args(argv: list[str]) -> list[tuple[str, list[str]]]:
    """[(suite, its arguments)] from `SUITE [ARG ...] SUITE ...`; a group name ("tests") stands for its suites."""
    plan: list[tuple[str, list[str]]] = []
    for word in argv:
        if word in GROUPS:
            plan += [(s, []) for s in GROUPS[word]]
        elif word in SUITES:
            plan.append((word, []))
        elif plan and SUITES[plan[-1][0]].takes_args:
            plan[-1][1].append(word)
        else:
            raise SystemExit(f"unknown suite {word!r}; the suites: {', '.join(list(SUITES) + list(GROUPS))} "
                             "(--list says what each runs)")
    if not plan:
        raise SystemExit("name at least one suite (--list shows them)")
    return plan


def commands(name: str, args: list[str], out: Path) -> list[list[str]]:
    """The argv of each command a suite runs."""
    suite = SUITES[name]
    if suite.tests:
        extra = shlex.split(os.environ.get("PYTEST_ARGS", ""))       # as a shell splits it: -k "a or b" is one
        select = ["-k", suite.select] if suite.select else []
        return [[*PYTEST_GPU, "-rfEs", *select, *suite.tests, *extra]]
    cmds = [[a.replace("{out}", str(out / name)) for a in argv] for argv in suite.commands]
    if name == "notebooks":
        cmds[0] += notebook_paths(args)
    elif args:
        cmds[-1] += args
    return cmds


def outcome(name: str, log: str, rcs: list[int]) -> str:
    """"12 passed, 1 failed" from pytest's last line, else "ok" / "FAILED (rc ...)"; "TIMEOUT" past the limit."""
    if any(rc == 124 for rc in rcs):
        return "TIMEOUT"
    if any(rc == 130 for rc in rcs):
        return "INTERRUPTED"
    if not rcs:
        return "not run (interrupted)"
    if SUITES[name].tests:
        summaries = [line for line in log.splitlines()                    # pytest's own summary lines only: a
                     if re.search(r"\d+ (passed|failed|errors?)\b.* in [\d.]+s", line)]   # test's output may say
        counts = dict((k, int(n)) for line in summaries                   # "1.05 errors=513"
                      for n, k in re.findall(r"(?<![\d.])(\d+) (passed|failed|error|errors|skipped)\b", line))
        if counts:
            return ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "error", "errors", "skipped")
                             if k in counts)
    return "ok" if all(rc == 0 for rc in rcs) else f"FAILED (rc {', '.join(map(str, rcs))})"


def environment(out: Path) -> dict:
    """PYTHONPATH with the carried wheels (installed once) ahead of the repository, Agg plots, unbuffered output."""
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    paths = [str(ROOT)]
    wheels = sorted(glob.glob(str(ROOT / ".whl" / "*.whl")))
    stamp = SITE / ".kernellab-wheels"
    if wheels:
        listed = "\n".join(Path(w).name for w in wheels)
        if not stamp.exists() or stamp.read_text() != listed:      # once per wheel set, not once per runner
            subprocess.run([PY, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                            "--no-cache-dir", "--upgrade", "--target", str(SITE), *wheels], check=False)
            stamp.write_text(listed)
        paths.insert(0, str(SITE))
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return env


def run_suite(name: str, args: list[str], out: Path, env: dict, log_name: str = "") -> tuple[float, str]:
    """Run one suite's commands in turn under its time limit; (seconds, outcome). log_name: the log's name where the
    plan names the suite more than once (`notebooks 07 notebooks 08` in two lanes), else the suite's."""
    suite = SUITES[name]
    (out / name).mkdir(parents=True, exist_ok=True)
    env = dict(env, KERNELLAB_ARTIFACTS=str(out / name), OUT=str(out / name), **suite.env)
    if suite.needs_kernel:
        subprocess.run([PY, "-m", "ipykernel", "install", "--user", "--name", "python3"], env=env,
                       capture_output=True, check=False)
    t0, rcs, text = time.monotonic(), [], ""
    log_path = out / f"{log_name or name}.log"
    log_path.write_text("")
    for argv in commands(name, args, out):
        if INTERRUPTED:
            break
        left = suite.limit_s - (time.monotonic() - t0)
        rc, printed = run_logged(argv, env, log_path, max(left, 1))
        rcs.append(rc)
        text += printed
        if rc == 124:
            with open(log_path, "a") as log:
                log.write(f"\n[stopped at the suite's limit of {suite.limit_s} s]\n")
            break
        if rc == 130:
            break
    seconds = time.monotonic() - t0
    print(f"{log_name or name}: {seconds:.0f} s, {outcome(name, text, rcs)} (log: {log_path})", flush=True)
    return seconds, outcome(name, text, rcs)


INTERRUPTED = False   # set by SIGINT/SIGTERM (the caller's `timeout -s INT`): the running suite stops, no other starts


def run_logged(argv: list[str], env: dict, log_path: Path, timeout_s: float) -> tuple[int, str]:
    """Run one command with its output appended to the log as it is printed (a suite cut short keeps what it
    printed); (exit status, the output). 124: past timeout_s; 130: interrupted. Either way the command's whole
    process group is ended (pytest's workers, a notebook's kernel)."""
    global INTERRUPTED
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        start = log.tell()
        p = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while True:                                  # a lane's thread sees the interruption by polling
            try:
                rc = p.wait(timeout=1)
                break
            except subprocess.TimeoutExpired:
                if INTERRUPTED:
                    rc = 130
                    break
                if time.monotonic() > deadline:
                    rc = 124
                    break
            except KeyboardInterrupt:
                INTERRUPTED, rc = True, 130
                break
        if p.poll() is None:
            _end_group(p)
    with open(log_path, errors="replace") as log:
        log.seek(start)
        printed = log.read()
    if rc == 130:
        with open(log_path, "a") as log:
            log.write("\n[interrupted: the runner was stopped]\n")
    return rc, printed


def bundle(out: Path, names: list[str]) -> Path | None:
    """$OUT/0-<suite>[.<suite>...].tgz: every log and artifact of these suites in one file. The device tool brings back
    a limited number of files (8 seen), in the order of their paths, and none whose name has a '+': the "0-" puts the
    bundle first; the loose files stay for a bundle over its size limit. None where there is nothing."""
    members = [p for name in names for p in (out / f"{name}.log", out / name) if p.exists()]
    if not members:
        return None
    path = out / ("0-" + ".".join(dict.fromkeys(names)) + ".tgz")
    with tarfile.open(path, "w:gz") as tar:
        for p in members:
            tar.add(p, arcname=p.name)
    return path


def _interrupt(signum, frame) -> None:
    """SIGINT/SIGTERM: the running suites stop (their logs keep what they printed) and the table is still printed."""
    global INTERRUPTED
    INTERRUPTED = True


def _end_group(p: subprocess.Popen) -> None:
    """SIGINT to the command's process group (pytest and notebooks end cleanly on it), then SIGKILL after 5 s."""
    for sig, wait_s in ((signal.SIGINT, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(p.pid, sig)
            p.wait(timeout=wait_s)
            return
        except (ProcessLookupError, subprocess.TimeoutExpired):
            if p.poll() is not None:
                return


def lanes(plan: list[tuple[str, list[str]]], gpus: int, suite_of: dict[str, str] | None = None
          ) -> list[list[tuple[str, list[str]]]]:
    """The plan's suites (those that use one GPU) spread over `gpus` lanes, longest limit first onto the lane with
    the least limit so far; each lane runs on its own GPU, its suites in turn. suite_of: the suite each of the plan's
    names stands for, where they are tags (a suite named twice)."""
    suite_of = suite_of or {}
    out: list[list[tuple[str, list[str]]]] = [[] for _ in range(gpus)]
    load = [0] * gpus
    for name, args in sorted(plan, key=lambda s: -SUITES[suite_of.get(s[0], s[0])].limit_s):
        i = load.index(min(load))
        out[i].append((name, args))
        load[i] += SUITES[suite_of.get(name, name)].limit_s
    return out


def run_plan(plan: list[tuple[str, list[str]]], out: Path, env: dict, gpus: int) -> list[tuple[str, float, str]]:
    """Run every suite: one after another, or with gpus > 1 in concurrent lanes (CUDA_VISIBLE_DEVICES=lane), then
    the suites that use every GPU alone. Rows (suite, seconds, result) in the plan's order; a lane's GPU is named."""
    counts = {name: sum(n == name for n, _ in plan) for name, _ in plan}
    tags = [f"{name}.{'-'.join(args) or k}" if counts[name] > 1 else name      # a suite named twice: a log each
            for k, (name, args) in enumerate(plan)]
    if gpus <= 1:
        return [(tag, *run_suite(name, args, out, env, tag)) for tag, (name, args) in zip(tags, plan)]
    from concurrent.futures import ThreadPoolExecutor
    tagged = {tag: (name, args) for tag, (name, args) in zip(tags, plan)}
    single = [(tag, args) for tag, (name, args) in tagged.items() if not SUITES[name].all_gpus]
    done: dict[str, tuple[str, float, str]] = {}

    def lane(i: int, suites: list[tuple[str, list[str]]]) -> None:
        for tag, args in suites:
            name = tagged[tag][0]
            seconds, result = run_suite(name, args, out, dict(env, CUDA_VISIBLE_DEVICES=str(i)), tag)
            done[tag] = (f"{tag} (GPU {i})", seconds, result)

    with ThreadPoolExecutor(gpus) as pool:
        list(pool.map(lane, range(gpus), lanes(single, gpus, {tag: name for tag, (name, _) in tagged.items()})))
    for tag, (name, args) in tagged.items():
        if SUITES[name].all_gpus:
            done[tag] = (tag, *run_suite(name, args, out, env, tag))
    return [done[tag] for tag in tags]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv[0] == "--list":
        for name, s in SUITES.items():
            print(f"{name:22s} {s.limit_s:4d} s  {s.about}")
        for name, members in GROUPS.items():
            print(f"{name:22s}         {' + '.join(members)}")
        return 0
    gpus = 1
    if argv[0] == "--gpus":                         # spread the suites over this many GPUs of the host
        gpus, argv = int(argv[1]), argv[2:]
    dry_run = bool(argv) and argv[0] == "--dry-run"  # print the commands each suite would run
    plan = parse_args(argv[1:] if dry_run else argv)
    out = Path(os.environ.get("OUT") or ROOT / "gpu-out").resolve()
    if dry_run:
        for name, args in plan:
            for argv in commands(name, args, out):
                print(f"{name}: {' '.join(argv)}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    env = environment(out)
    saved = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        rows = run_plan(plan, out, env, gpus)
    finally:                                        # main() called in a process that goes on (a test) leaves it as
        for sig, handler in saved.items():          # it was
            signal.signal(sig, handler)
    bundle(out, [name for name, _ in plan])
    width = max(len(r[0]) for r in rows)
    print(f"\n{'suite':{width}s}  seconds  result")
    for name, seconds, result in rows:
        print(f"{name:{width}s}  {seconds:7.0f}  {result}")
    ok = all(r[2] == "ok" or (re.match(r"\d+ passed", r[2]) and not re.search(r"failed|error", r[2])) for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
