"""What the tools/gpu/try_*.py scripts share: timing by CUDA events, the GEMM error measure, the copy ceiling."""
import torch


def gemm_error(C, A, B, dtype) -> str | float:
    """C against A B^T in float64, relative to |ref| + rms(ref): the error, or a WRONG line over the dtype's bound."""
    ref = A.double() @ B.double().T
    err = ((C.double() - ref).abs() / (ref.abs() + ref.pow(2).mean().sqrt())).max().item()
    if err != err or err > (1e-2 if dtype == torch.bfloat16 else 2e-3):
        M, K = A.shape
        return f"WRONG at {M}x{B.shape[0]}x{K} {str(dtype)[6:]}: err {err:.3g}"
    return err


def time_ms(fn, args, budget_ms=60.0):
    """Median ms per call over batches of back-to-back launches (CUDA events), after a warm-up."""
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn(*args)
    end.record()
    torch.cuda.synchronize()
    one = max(start.elapsed_time(end), 1e-3)
    per_batch = max(1, min(20, int(budget_ms / 7 / one)))
    times = []
    for _ in range(7):
        start.record()
        for _ in range(per_batch):
            fn(*args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / per_batch)
    return sorted(times)[len(times) // 2]


def print_gemm_table(title: str, rows, torch_ms: dict, sizes, extra_name: str) -> None:
    """One GEMM table: rows of (label, regs, the `extra_name` column, check, {n: ms}) against torch at each n^3."""
    tflops = lambda n, ms: 2 * n**3 / ms / 1e9  # noqa: E731
    print(f"\n{title}; torch.matmul in the same run:")
    print("  " + ", ".join(f"{n}^3 torch {torch_ms[n]:.3f} ms = {tflops(n, torch_ms[n]):.0f} TFLOP/s"
                           for n in sizes if n in torch_ms))
    head = f"{'variant':32s} {'regs':>4s} {extra_name:>10s} {'check':>10s}"
    for n in sizes:
        head += f" | {n:>5d}: {'ms':>7s} {'TFLOP/s':>7s} {'% torch':>7s}"
    print(head)
    for label, regs, extra, ok, times in rows:
        line = f"{label:32s} {regs!s:>4s} {extra:>10s} {ok[:10]:>10s}"
        for n in sizes:
            if n in times:
                line += f" | {'':>5s}  {times[n]:7.3f} {tflops(n, times[n]):7.0f} {torch_ms[n] / times[n]:7.1%}"
            else:
                line += f" | {'':>5s}  {'-':>7s} {'-':>7s} {'-':>7s}"
        print(line)
        if ok.startswith(("WRONG", "FAILED")):
            print(f"    {ok}")


def copy_ceiling(emulate: bool) -> tuple[float, str]:
    """The copy bandwidth (GB/s) the memory-bound scripts' "% of copy" is against, and the device's name (3000 GB/s
    on the CPU emulation); prints both. On a GPU it also lets torch.compile recompile once per shape and dtype."""
    if emulate:
        copy_gbps, device = 3000.0, "CPU emulation"
    else:
        from kernellab.run.measure.ceilings import device_ceilings
        copy_gbps, device = device_ceilings().dram_gbps, torch.cuda.get_device_name()
        torch._dynamo.config.recompile_limit = 64
    print(f"{device}, torch {torch.__version__}; copy bandwidth {copy_gbps / 1e3:.2f} TB/s", flush=True)
    return copy_gbps, device
