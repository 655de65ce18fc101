"""Hostile submissions against kernellab.check on the CPU: each attack of docs/GRADING.md's threat model is rejected
with a finding that names it, and honest candidates beside them still pass."""
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from kernellab.run.measure.check import check  # noqa: E402
from kernellab.run.measure.integrity import ATTACKS, IntegrityFinding, output_problems, redraw  # noqa: E402

N = 1001


def two_vectors(g):
    return torch.randn(N, generator=g), torch.randn(N, generator=g)


def rejected(report, kind):
    """The report failed and its findings name `kind` (a known attack)."""
    assert kind in ATTACKS
    assert not report.passed, str(report)
    assert report.finding == kind, str(report)
    assert kind in str(report) and report.to_json()["finding"] == kind
    return report


# --- 1. stale memory -------------------------------------------------------------------------------------------------


class FreedBlock:
    """What torch's caching allocator does on a GPU, in miniature: the block a computation freed is the next
    `torch.empty` of its size, contents and all."""

    last = None

    @classmethod
    def empty_like(cls, x):
        return cls.last.clone() if cls.last is not None and cls.last.shape == x.shape else torch.empty_like(x)


def test_stale_memory_from_the_reference_is_named_when_the_candidate_runs_first():
    FreedBlock.last = None

    def reference(x, y):
        out = x + y
        if out.dtype == torch.float32:   # (not its float64 run, which lives elsewhere)
            FreedBlock.last = out        # freed by the caller; its memory still holds the answer
        return out

    def writes_nothing(x, y):
        return FreedBlock.empty_like(x)   # "torch.empty": the kernel never writes it

    r = rejected(check(writes_nothing, reference, two_vectors, fill_free_memory=False), "stale_output")
    assert r.failing_trial == 1          # trial 0 ran reference-then-candidate and was fooled; trial 1 was not


def test_the_free_memory_fill_is_recognised_in_an_output():
    def unwritten(x, y):
        out = torch.empty_like(x)
        out.view(torch.int32).fill_(-1)   # what fill_free_memory leaves in a block: every byte 0xFF
        out[:10] = x[:10] + y[:10]
        return out

    r = rejected(check(unwritten, torch.add, two_vectors), "stale_output")
    assert "991" in r.findings[0].message


# --- 2. input mutation ----------------------------------------------------------------------------------------------


def test_zeroing_an_input_is_named():
    def zeroes_its_input(x, y):
        out = x * y
        x.zero_()                         # so that a reference run after it on the same memory agrees
        return out

    r = rejected(check(zeroes_its_input, torch.mul, two_vectors), "input_mutated")
    assert r.mutated_inputs == ("argument 0",)


def test_declared_outputs_and_in_place_ops_are_not_mutation():
    assert check(lambda x: x.mul_(2), lambda x: x * 2, lambda g: (torch.randn(N, generator=g),)).passed

    def launch(x, y, out):
        torch.add(x, y, out=out)

    inputs = lambda g: (*two_vectors(g), torch.empty(N))  # noqa: E731
    assert check(launch, lambda x, y, out: x + y, inputs, outputs=(2,)).passed


# --- 3. background threads -------------------------------------------------------------------------------------------


def test_work_left_on_a_background_thread_is_named():
    started = []

    def returns_before_the_work(x, y):
        out = torch.zeros_like(x)
        t = threading.Thread(target=lambda: (time.sleep(0.3), torch.add(x, y, out=out)), name="late-writer")
        t.start()
        started.append(t)
        return out

    r = rejected(check(returns_before_the_work, torch.add, two_vectors), "background_thread")
    assert "late-writer" in r.findings[0].message
    for t in started:
        t.join()


def test_a_thread_joined_before_returning_is_fine():
    def joined(x, y):
        out = torch.empty_like(x)
        t = threading.Thread(target=torch.add, args=(x, y), kwargs={"out": out})
        t.start()
        t.join()
        return out

    assert check(joined, torch.add, two_vectors).passed


# --- 4. lazy or fake outputs -----------------------------------------------------------------------------------------


class LyingTensor(torch.Tensor):
    """A subclass that answers every comparison with the reference's own values."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs)


def test_a_tensor_subclass_is_a_fake_output():
    r = rejected(check(lambda x, y: torch.Tensor._make_subclass(LyingTensor, x + y), torch.add, two_vectors),
                 "fake_output")
    assert "LyingTensor" in r.findings[0].message


def test_a_view_of_an_input_is_a_fake_output():
    inputs = lambda g: (torch.randn(31, 33, generator=g),)  # noqa: E731
    r = rejected(check(lambda x: x.t(), lambda x: x.t().contiguous(), inputs), "fake_output")
    assert "argument 0" in r.findings[0].message
    assert check(lambda x: x.t().contiguous(), lambda x: x.t().contiguous(), inputs).passed


def test_an_expanded_tensor_is_a_fake_output():
    inputs = lambda g: (torch.randn(N, generator=g),)  # noqa: E731

    def reference(x):
        return torch.full_like(x, float(x.mean()))

    r = rejected(check(lambda x: x.mean().reshape(1).expand(N), reference, inputs), "fake_output")
    assert "expanded" in r.findings[0].message
    assert check(lambda x: x.mean().reshape(1).expand(N).contiguous(), reference, inputs).passed


def test_output_problems_accepts_plain_dense_layouts():
    x = torch.randn(4, 6)
    assert output_problems((torch.randn(6, 4).t(), torch.randn(3, 1, 5)), (x,)) == []
    assert output_problems((x[:, ::2],), ()) != []          # gapped strides


# --- 5. caching and replay -------------------------------------------------------------------------------------------


def test_a_result_cached_by_shape_is_named():
    cache = {}

    def cached(x, y):
        key = tuple(x.shape)
        if key not in cache:
            cache[key] = x + y
        return cache[key].clone()

    rejected(check(cached, torch.add, two_vectors), "cached_result")


def test_a_result_cached_by_pointer_is_named():
    cache = {}

    def by_pointer(x, y):
        # Every trial's copy lands on recycled memory in a long run: key on the size as a pointer stand-in.
        key = (x.numel(), x.dtype)
        if key not in cache:
            cache[key] = (x + y).clone()
        return cache[key].clone()

    rejected(check(by_pointer, torch.add, two_vectors, trials=3), "cached_result")


# --- 6. the check's own functions patched ----------------------------------------------------------------------------


def test_patching_the_comparison_is_named_and_undone():
    import kernellab.run.measure.check as check_mod

    real_compare, real_le = check_mod._compare, torch.Tensor.__le__

    def says_equal(x, y):
        torch.Tensor.__le__ = lambda a, b: torch.ones_like(a, dtype=torch.bool)   # every error "within tolerance"
        return torch.zeros_like(x)

    def quiet_compare(x, y):
        check_mod._compare = lambda j, c, rv, rn, *a: real_compare(j, rv, rv, rn, *a)
        return torch.zeros_like(x)

    try:
        for cheat in (says_equal, quiet_compare):
            r = rejected(check(cheat, torch.add, two_vectors), "harness_patched")
            assert "put back" in r.findings[0].message
            assert check_mod._compare is real_compare and torch.Tensor.__le__ is real_le
    finally:
        check_mod._compare, torch.Tensor.__le__ = real_compare, real_le


# --- 8. answers that only fit the test data --------------------------------------------------------------------------


def test_a_closed_form_that_fits_randn_is_named_in_strict_mode():
    inputs = lambda g: (torch.randn(32, 1024, generator=g),)  # noqa: E731

    def mean_square(x):
        return (x * x).mean(dim=-1)

    def closed_form(x):                   # E[x^2] = 1 for randn: right within ~15 % on the given inputs
        return torch.ones(x.shape[0])

    loose = dict(rtol=0.1, atol=0.05)
    assert check(closed_form, mean_square, inputs, **loose).passed        # the given distribution alone is fooled
    r = rejected(check(closed_form, mean_square, inputs, strict=True, **loose), "fits_test_data")
    assert r.distribution in ("uniform", "heavy_tailed", "offset") and "redraw" in r.reproduce
    assert check(mean_square, mean_square, inputs, strict=True, allowed_ops=("mul", "mean")).passed


def test_redraw_keeps_shapes_dtypes_and_skipped_arguments():
    x, out, idx = torch.randn(5, 7), torch.empty(5, 7), torch.arange(5)
    for dist in ("uniform", "heavy_tailed", "offset"):
        a, o, i = redraw((x, out, idx), dist, 3, skip=(1,))
        assert a.shape == x.shape and a.dtype == x.dtype and not torch.equal(a, x)
        assert o is out and i is idx
    assert redraw((x,), "given", 0)[0] is x
    assert float(redraw((torch.randn(100_000),), "heavy_tailed", 0)[0].abs().max()) > 50


# --- 9. lower precision ----------------------------------------------------------------------------------------------


def fp16_add(x, y):
    return (x.half() + y.half()).float()


def test_fp16_arithmetic_for_an_fp32_task_is_named():
    rejected(check(fp16_add, torch.add, two_vectors), "low_precision")                 # fails the fp32 tolerance
    loose = check(fp16_add, torch.add, two_vectors, rtol=1e-2, atol=1e-2)               # a loose tolerance lets it
    assert loose.passed
    rejected(check(fp16_add, torch.add, two_vectors, rtol=1e-2, atol=1e-2, strict=True, allowed_ops=("add",)),
             "low_precision")


def test_fp32_with_another_summation_order_is_not_low_precision():
    inputs = lambda g: (torch.randn(96, 2048, generator=g),)  # noqa: E731

    def sequential_halves(x):             # a different order of the same fp32 sums
        return x[:, 1::2].sum(-1) + x[:, ::2].flip(-1).sum(-1)

    assert check(sequential_halves, lambda x: x.sum(-1), inputs, strict=True, allowed_ops=("sum",)).passed


# --- 10. not a kernel at all -----------------------------------------------------------------------------------------


def matrices(g):
    return torch.randn(67, 45, generator=g), torch.randn(45, 33, generator=g)


def test_calling_the_library_op_is_named_in_strict_mode():
    rejected(check(lambda a, b: torch.matmul(a, b), torch.matmul, matrices, strict=True), "library_call")

    def falls_back(a, b):
        try:
            raise RuntimeError("my kernel does not handle this shape")
        except RuntimeError:
            return a @ b

    r = rejected(check(falls_back, torch.matmul, matrices, strict=True), "library_call")
    assert "aten::mm" in r.findings[0].message


def test_own_arithmetic_passes_and_allowed_ops_are_allowed():
    def by_broadcast(a, b):
        return (a[:, :, None] * b[None, :, :]).sum(1)

    assert check(by_broadcast, torch.matmul, matrices, strict=True).passed
    assert check(torch.matmul, torch.matmul, matrices, strict=True, allowed_ops=("aten::mm",)).passed
    rejected(check(by_broadcast, torch.matmul, matrices, forbidden_ops=("mul",)), "library_call")


# --- 11. reads of memory it never wrote -------------------------------------------------------------------------------


def test_an_answer_that_depends_on_the_initial_memory_is_named_in_strict_mode():
    def reads_its_output_first(x, y, out):
        # Right only where `out` starts as NaN (the check's own fill): a kernel that reads before it writes.
        out.copy_(torch.where(torch.isnan(out), x + y, out))

    inputs = lambda g: (*two_vectors(g), torch.empty(N))  # noqa: E731
    assert check(reads_its_output_first, lambda x, y, out: x + y, inputs, outputs=(2,)).passed
    rejected(check(reads_its_output_first, lambda x, y, out: x + y, inputs, outputs=(2,), strict=True,
                   allowed_ops=("add",)), "nondeterministic")


# --- honest candidates ----------------------------------------------------------------------------------------------


def numpy_add(x, y):
    """A kernel stand-in: its arithmetic is no aten op."""
    return torch.from_numpy(x.numpy() + y.numpy())


@pytest.mark.parametrize("strict", [False, True])
def test_honest_candidates_pass_with_every_defence_on(strict):
    assert check(numpy_add, torch.add, two_vectors, strict=strict).passed
    assert check(lambda x, y: x + y, torch.add, two_vectors, strict=strict, allowed_ops=("add",)).passed
    assert check(lambda a, b: (a[:, :, None] * b[None]).sum(1), torch.matmul, matrices, strict=strict).passed
    rows = lambda g: (torch.randn(37, 129, generator=g),)  # noqa: E731
    assert check(lambda x: torch.exp(x - x.amax(-1, keepdim=True)) / torch.exp(x - x.amax(-1, keepdim=True)).sum(
        -1, keepdim=True), lambda x: torch.softmax(x, -1), rows, strict=strict).passed


def test_findings_serialise():
    f = IntegrityFinding("fake_output", "output 0 is a view")
    assert f.to_json() == {"kind": "fake_output", "message": "output 0 is a view"}
    assert str(f) == "fake_output: output 0 is a view"


# --- bench: the timing defences, on a fake clock ----------------------------------------------------------------------

from kernellab.run.measure.bench import bench  # noqa: E402


class FakeClock:
    """Each call's time is its output's first element (ms); `escaped_ms` models a device-synchronised probe: the
    output's second element, where present, is work on another stream."""

    device = "NVIDIA H200"
    flush_bytes = 2 * 2**20
    l2_bytes = 2**20

    def __init__(self, persistence=None):
        self.persistence = persistence

    def check_measurable(self, name, returned, args):
        pass

    def time_calls(self, calls):
        return [float(call().reshape(-1)[0]) for call in calls]

    def escaped_ms(self, calls):
        outs = [call().reshape(-1) for call in calls]
        return float(np.median([float(o[0]) + (float(o[1]) if o.numel() == 2 else 0.0) for o in outs]))

    def persistence_finding(self, who):
        return None if self.persistence is None else self.persistence.finding(0, who)

    def graph(self, calls):
        raise NotImplementedError

    def describe(self):
        return "fake clock"


import numpy as np  # noqa: E402

QUICK = dict(warmup_ms=1, rep_ms=20, rounds=2, min_reps=4)


def ms_inputs(ms):
    return lambda g: (torch.full((8,), float(ms)) + 0 * torch.randn(8, generator=g),)


def distrusted(result, kind):
    assert kind in ATTACKS
    assert not result.trusted and kind in [f.kind for f in result.findings], str(result)
    assert f"NOT TRUSTED, {kind}" in str(result)
    assert kind in [f["kind"] for f in result.to_json()["findings"]]
    return result


def test_an_honest_function_is_trusted():
    r = bench(lambda x: x.clone(), ms_inputs(1.0), timer=FakeClock(), **QUICK)
    assert r.trusted and r.findings == () and r.to_json()["trusted"] is True


def test_patching_the_statistics_or_the_clock_is_named_and_undone():
    import statistics
    import time as time_mod

    import kernellab.run.measure.bench as bench_mod

    real_median, real_result, real_perf = statistics.median, bench_mod._result, time_mod.perf_counter
    for target, name, fake in ((statistics, "median", lambda xs: 1e-6), (bench_mod, "_result", real_result),
                               (time_mod, "perf_counter", lambda: 0.0)):
        def patches(x, target=target, name=name, fake=fake):
            setattr(target, name, (lambda *a, **k: fake(*a, **k)))     # a new object, even for the same function
            return x.clone()

        r = distrusted(bench(patches, ms_inputs(1.0), timer=FakeClock(), **QUICK), "timer_patched")
        assert name in next(f.message for f in r.findings if f.kind == "timer_patched")
        assert r.median_ms == 1.0                   # the statistics ran on the originals
    assert (statistics.median, bench_mod._result, time_mod.perf_counter) == (real_median, real_result, real_perf)


def test_patching_cuda_events_is_named():
    real = torch.cuda.Event.elapsed_time

    def patches(x):
        torch.cuda.Event.elapsed_time = lambda self, end: 1e-6
        return x.clone()

    try:
        distrusted(bench(patches, ms_inputs(1.0), timer=FakeClock(), **QUICK), "timer_patched")
        assert torch.cuda.Event.elapsed_time is real
    finally:
        torch.cuda.Event.elapsed_time = real


def test_a_thread_left_running_by_the_function_is_named():
    started = []

    def launches_later(x):
        t = threading.Thread(target=time.sleep, args=(0.3,), name="launcher")
        t.start()
        started.append(t)
        return x.clone()

    distrusted(bench(launches_later, ms_inputs(1.0), timer=FakeClock(), **QUICK), "background_thread")
    for t in started:
        t.join()


def test_work_on_another_stream_is_named():
    def side_stream(x):                # 0.002 ms on the timed stream, 1 ms on its own
        return torch.tensor([0.002, 1.0])

    distrusted(bench(side_stream, ms_inputs(1.0), timer=FakeClock(), **QUICK), "other_stream")
    honest = bench(lambda x: torch.tensor([1.0]), ms_inputs(1.0), timer=FakeClock(), **QUICK)
    assert honest.trusted


def test_a_cache_by_pointer_is_named_with_or_without_a_reference():
    def make_cached():
        cache = {}

        def by_pointer(x):
            if x.data_ptr() not in cache:
                cache[x.data_ptr()] = x * 2
            return cache[x.data_ptr()]
        return by_pointer

    inputs = lambda g: (1.0 + torch.rand(64, generator=g),)  # noqa: E731
    distrusted(bench(make_cached(), inputs, timer=FakeClock(), reference=lambda x: x * 2, **QUICK), "cached_result")
    distrusted(bench(make_cached(), inputs, timer=FakeClock(), **QUICK), "cached_result")
    assert bench(lambda x: x * 2, inputs, timer=FakeClock(), reference=lambda x: x * 2, **QUICK).trusted


def test_faster_than_the_roofline_is_flagged_not_trusted():
    from kernellab.analysis.roofline import datasheet_ceilings

    h200 = datasheet_ceilings("NVIDIA H200")
    gib = 2**30
    # 1 GiB read and written in 0.1 ms would be 21 TB/s; an H200 moves 4.8 TB/s.
    fast = distrusted(bench(lambda x: x.clone(), ms_inputs(0.1), timer=FakeClock(), bytes=2 * gib, **QUICK),
                      "impossible_speed")
    assert fast.roofline_floor_ms == pytest.approx(2 * gib / (h200.dram_gbps * 1e9) * 1e3)
    fine = bench(lambda x: x.clone(), ms_inputs(0.5), timer=FakeClock(), bytes=2 * gib, **QUICK)
    assert fine.trusted and fine.roofline_floor_ms < 0.5
    flops = distrusted(bench(lambda x: x.clone(), ms_inputs(0.001), timer=FakeClock(), flops=1e12, **QUICK),
                       "impossible_speed")
    assert "roofline" in flops.findings[0].message


# --- persisting L2, through a fake driver ---------------------------------------------------------------------------


class FakeDriver:
    """The four libcuda calls of integrity.L2Persistence, on a state a hostile function can set."""

    def __init__(self):
        self.limit, self.window, self.resets = 0, 0, 0

    def cuCtxGetLimit(self, ptr, attr):
        ptr._obj.value = self.limit
        return 0

    def cuCtxSetLimit(self, attr, value):
        self.limit = value
        return 0

    def cuCtxResetPersistingL2Cache(self):
        self.resets += 1
        return 0

    def cuStreamGetAttribute(self, stream, attr, ptr):
        ptr._obj.accessPolicyWindow.num_bytes = self.window
        return 0

    def cuStreamSetAttribute(self, stream, attr, ptr):
        self.window = ptr._obj.accessPolicyWindow.num_bytes
        return 0


def test_a_persisting_l2_window_is_named_and_reset():
    from kernellab.run.measure.integrity import L2Persistence

    drv = FakeDriver()

    def persists(x):
        drv.limit, drv.window = 30 * 2**20, 16 * 2**20     # cudaLimitPersistingL2CacheSize + an access-policy window
        return x.clone()

    r = distrusted(bench(persists, ms_inputs(1.0), timer=FakeClock(L2Persistence(drv)), **QUICK), "l2_persistence")
    assert "access-policy window" in next(f.message for f in r.findings if f.kind == "l2_persistence")
    assert (drv.limit, drv.window) == (0, 0) and drv.resets >= 1
    assert bench(lambda x: x.clone(), ms_inputs(1.0), timer=FakeClock(L2Persistence(FakeDriver())), **QUICK).trusted


def test_findings_show_in_the_notebook_views():
    r = check(lambda x, y: torch.Tensor._make_subclass(LyingTensor, x + y), torch.add, two_vectors)
    assert "<b>fake_output</b>" in r._repr_html_()
    b = bench(lambda x: x.clone(), ms_inputs(0.001), timer=FakeClock(), flops=1e12, **QUICK)
    assert "not trusted, impossible_speed" in b._repr_html_()


def test_only_the_first_timed_call_computing_is_named():
    seen = set()

    def first_call_only(x):
        if x.data_ptr() in seen:
            return torch.zeros_like(x)     # later calls skip the work (and the time)
        seen.add(x.data_ptr())
        return x * 2

    inputs = lambda g: (1.0 + torch.rand(64, generator=g),)  # noqa: E731
    r = distrusted(bench(first_call_only, inputs, timer=FakeClock(), reference=lambda x: x * 2, **QUICK),
                   "cached_result")
    assert "a timed call" in next(f.message for f in r.findings if f.kind == "cached_result")


def test_one_output_buffer_shared_by_every_call_is_not_judged_a_cache():
    out = torch.empty(64)

    def into_one_buffer(x):
        return torch.mul(x, 2, out=out)

    inputs = lambda g: (1.0 + torch.rand(64, generator=g),)  # noqa: E731
    assert bench(into_one_buffer, inputs, timer=FakeClock(), reference=lambda x: x * 2, **QUICK).trusted


def test_a_thread_pool_left_working_is_a_background_thread_but_the_frameworks_own_are_not():
    from concurrent.futures import ThreadPoolExecutor

    from kernellab.run.measure.integrity import environment_threads

    pool = ThreadPoolExecutor(1, thread_name_prefix="cheat-pool")

    def async_add(x, y):
        out = torch.zeros_like(x)
        pool.submit(lambda: (time.sleep(0.3), torch.add(x, y, out=out)))
        return out

    try:
        rejected(check(async_add, torch.add, two_vectors), "background_thread")
    finally:
        pool.shutdown(wait=True)
    framework = threading.Thread(target=torch.utils.data.get_worker_info)    # a function of torch's own
    assert environment_threads([framework]) and not environment_threads([threading.Thread(target=time.sleep)])
