"""kernellab.check on the CPU: plain torch callables and a Numba kernel in the simulator."""
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kernellab.report import REPORT_MIME  # noqa: E402
from kernellab.run.measure.check import TOLERANCES, CheckError, CheckReport, check  # noqa: E402

N = 1001  # odd on purpose: not a multiple of any block size


def two_vectors(g):
    return torch.randn(N, generator=g), torch.randn(N, generator=g)


def with_out(g):
    return torch.randn(N, generator=g), torch.randn(N, generator=g), torch.empty(N)


def reference_add(x, y, out=None):
    return x + y


# --- passes -----------------------------------------------------------------------------------------------------


def test_plain_torch_passes_and_states_its_tolerance():
    r = check(lambda x, y: x + y, torch.add, two_vectors)
    assert r.passed and bool(r)
    assert r.trials == 5 and r.mismatches == 0 and r.failing_seed is None and r.reproduce is None
    assert r.precision == "float32" and r.rtol == TOLERANCES["float32"][0]
    assert "float32 defaults" in r.tolerance and "rms(ref)" in r.tolerance
    assert r.reference_precision == "float64"
    assert r.max_abs_error < 1e-5
    assert "PASSED" in str(r) and "seeds 0..4" in str(r)


def test_each_trial_gets_fresh_inputs_from_its_seed():
    seen = []

    def candidate(x):
        seen.append(x[0].item())
        return x.clone()

    check(candidate, lambda x: x, lambda g: (torch.randn(7, generator=g),), trials=3, seed=40, outputs=())
    expected = [torch.randn(7, generator=torch.Generator().manual_seed(40 + t))[0].item() for t in range(3)]
    assert seen == expected


# --- failures located -------------------------------------------------------------------------------------------


def test_one_bad_element_is_located():
    def candidate(x, y):
        out = x + y
        out[517] += 0.5
        return out

    r = check(candidate, torch.add, two_vectors, seed=3)
    assert not r.passed
    assert r.mismatches == 1
    assert r.worst[0] == (517,)
    assert r.failing_trial == 0 and r.failing_seed == 3
    assert r.reproduce == "args = inputs(torch.Generator().manual_seed(3))"
    idx, yours, ref, ratio = r.worst_values[0]
    assert idx == (517,) and yours == pytest.approx(ref + 0.5, abs=1e-5) and ratio > 1
    assert "(517,)" in str(r) and "1 of 1,001 elements" in str(r)


def test_bad_element_in_2d_output_is_located_by_row_and_column():
    def inputs(g):
        return torch.randn(37, 53, generator=g), torch.randn(53, 29, generator=g)

    def candidate(a, b):
        out = a @ b
        out[20, 11] = 0.0
        return out

    r = check(candidate, torch.matmul, inputs)
    assert not r.passed and r.worst[0] == (20, 11) and r.mismatches == 1
    assert r.shape == (37, 29)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_or_inf_where_the_reference_is_finite_fails_whatever_the_tolerance(bad):
    def candidate(x, y):
        out = x + y
        out[100] = bad
        return out

    r = check(candidate, torch.add, two_vectors, atol=1e30, rtol=1e30)
    assert not r.passed and r.worst[0] == (100,) and r.mismatches == 1
    assert r.max_abs_error == float("inf") and r.worst_values[0][3] == float("inf")


def test_nan_where_the_reference_has_nan_passes():
    inputs = lambda g: (torch.randn(N, generator=g),)  # noqa: E731 - half the elements are negative: log gives NaN
    r = check(lambda x: torch.log(x), torch.log, inputs)
    assert r.passed


def test_unwritten_elements_of_an_output_argument_fail():
    def candidate(x, y, out):        # forgets the last element, as a kernel without the tail block would
        out[:-1] = x[:-1] + y[:-1]
        return out

    r = check(candidate, reference_add, with_out)
    assert not r.passed
    assert r.output_arguments == (2,)
    assert r.worst[0] == (N - 1,) and r.mismatches == 1
    assert "filled with NaN" in str(r)


def test_unwritten_elements_fail_even_when_the_buffer_happens_to_hold_the_answer():
    def inputs(g):
        x, y = torch.randn(N, generator=g), torch.randn(N, generator=g)
        return x, y, x + y  # a stale buffer with the right values: only the NaN fill exposes the skipped write

    def candidate(x, y, out):
        out[:500] = x[:500] + y[:500]
        return out

    r = check(candidate, reference_add, inputs)
    assert not r.passed and r.mismatches == N - 500


def test_free_blocks_are_the_default_pools_inactive_ones():
    """What fill_free_memory fills, from a torch.cuda.memory_snapshot()-shaped list (a GPU test fills real ones)."""
    from kernellab.run.measure.check import free_blocks

    snapshot = [
        {"device": 0, "address": 0x1000, "segment_pool_id": (0, 0), "blocks": [
            {"size": 512, "state": "active_allocated", "address": 0x1000},
            {"size": 1536, "state": "inactive", "address": 0x1200},
            {"size": 2048, "state": "active_pending_free", "address": 0x1800}]},
        {"device": 0, "address": 0x9000, "blocks": [          # older torch: no pool id, no block addresses
            {"size": 256, "state": "inactive"}, {"size": 256, "state": "active_allocated"},
            {"size": 1024, "state": "inactive"}]},
        {"device": 0, "address": 0x20000, "segment_pool_id": (1, 0), "blocks": [   # a CUDA graph's private pool
            {"size": 4096, "state": "inactive", "address": 0x20000}]},
        {"device": 1, "address": 0x40000, "segment_pool_id": (0, 0), "blocks": [
            {"size": 8192, "state": "inactive", "address": 0x40000}]},
    ]
    assert free_blocks(snapshot, 0) == [(0x1200, 1536), (0x9000, 256), (0x9200, 1024)]
    assert free_blocks(snapshot, 1) == [(0x40000, 8192)]


def test_no_gpu_no_fill_and_the_report_says_nothing_of_it():
    r = check(lambda x: x * 2, lambda x: x * 2, lambda g: (torch.randn(N, generator=g),))
    assert r.free_memory_filled_bytes == 0 and "free GPU memory" not in str(r)


def test_named_outputs_for_a_candidate_that_returns_nothing():
    def candidate(x, y, out):
        out[1:] = x[1:] + y[1:]      # returns None, like a raw kernel launch

    r = check(candidate, reference_add, with_out, outputs=(2,))
    assert not r.passed and r.worst[0] == (0,)
    def launch(x, y, out):
        torch.add(x, y, out=out)

    assert check(launch, reference_add, with_out, outputs=(2,)).passed


def test_in_place_candidates_are_not_poisoned():
    inputs = lambda g: (torch.randn(N, generator=g),)  # noqa: E731
    assert check(lambda x: x.relu_(), torch.relu, inputs).passed
    assert check(lambda x: x.mul_(3), lambda x: x * 3, inputs).passed


def test_input_mutation_is_reported():
    def candidate(x, y):
        x[3] = 0.0                    # scribbles on an input it does not return
        return x * 0 + y

    r = check(candidate, lambda x, y: y, two_vectors)
    assert not r.passed
    assert r.mutated_inputs == ("argument 0",)
    assert "changed its inputs" in r.message and "(3,)" in r.message


def test_all_zero_output_fails_even_for_tiny_values():
    # With a fixed atol of 1e-5 (torch.testing's float32 default) zeros would pass here.
    inputs = lambda g: (1e-6 * torch.randn(N, generator=g),)  # noqa: E731
    r = check(lambda x: torch.zeros_like(x), lambda x: x.clone(), inputs)
    assert not r.passed and r.mismatches > 0.9 * N
    assert torch.allclose(torch.zeros(N), 1e-6 * torch.randn(N), rtol=1.3e-6, atol=1e-5)


# --- per-dtype tolerances ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,precision", [(torch.float64, "float64"), (torch.float32, "float32"),
                                             (torch.bfloat16, "bfloat16"), (torch.float16, "float16")])
def test_default_tolerance_follows_the_output_dtype(dtype, precision):
    rtol = TOLERANCES[precision][0]
    inputs = lambda g: (torch.randn(N, generator=g, dtype=torch.float32).to(dtype),)  # noqa: E731

    def scaled(k):
        return lambda x: (x.double() * (1 + k * rtol)).to(dtype)

    within = check(scaled(0.25), lambda x: x.clone(), inputs)
    assert within.passed, str(within)
    assert within.precision == precision and within.rtol == rtol
    outside = check(scaled(4.0), lambda x: x.clone(), inputs)
    assert not outside.passed


def test_tf32_precision_is_looser_than_float32():
    def inputs(g):
        return torch.randn(65, 129, generator=g), torch.randn(129, 33, generator=g)

    def tf32_like(a, b):  # rounds inputs to 10 mantissa bits, as TF32 tensor cores do
        def round10(t):
            return (t.view(torch.int32) + 0x1000 & ~0x1FFF).view(torch.float32)
        return round10(a) @ round10(b)

    strict = check(tf32_like, torch.matmul, inputs)
    assert not strict.passed and "precision='tf32'" in strict.message
    loose = check(tf32_like, torch.matmul, inputs, precision="tf32")
    assert loose.passed and loose.precision == "tf32"


def test_explicit_tolerances_are_used_and_stated():
    r = check(lambda x, y: x + y + 1e-3, torch.add, two_vectors, atol=2e-3, rtol=0.0)
    assert r.passed and r.atol == 2e-3 and r.rtol == 0.0 and r.precision == "explicit"
    assert "atol=0.002" in r.tolerance


def test_integer_outputs_compare_exactly():
    inputs = lambda g: (torch.randint(0, 100, (N,), generator=g),)  # noqa: E731
    assert check(lambda x: x * 2, lambda x: x * 2, inputs).passed
    r = check(lambda x: x * 2 + (x == 7), lambda x: x * 2, inputs)
    assert not r.passed and r.precision == "exact"


def test_half_precision_is_compared_with_a_float64_reference():
    def inputs(g):
        return (torch.randn(33, 47, generator=g).half(), torch.randn(47, 29, generator=g).half())

    r = check(lambda a, b: (a.float() @ b.float()).half(), torch.matmul, inputs)
    assert r.passed and r.reference_precision == "float64"
    assert r.reference_own_error is not None and r.reference_own_error > 0


def test_a_reference_that_refuses_float64_is_run_in_the_inputs_dtype():
    w = torch.randn(N)

    def reference(x):  # mixes a float32 weight: raises on float64 input
        if x.dtype != w.dtype:
            raise RuntimeError("expected float32")
        return x * w

    r = check(lambda x: x * w, reference, lambda g: (torch.randn(N, generator=g),))
    assert r.passed and r.reference_precision == "float32"
    # ... and the report says so, and why, instead of falling back silently.
    assert r.reference_note.startswith("the reference could not run in float64 (it raised RuntimeError: expected "
                                       "float32)")
    assert "inputs' dtypes (float32)" in r.reference_note
    assert f"note: {r.reference_note}" in str(r) and "could not run in float64" in r._repr_html_()
    assert r.to_json()["reference_note"] == r.reference_note


def test_a_float64_reference_that_runs_out_of_memory_is_named():
    def reference(x):
        if x.dtype == torch.float64:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")
        return x * 2

    r = check(lambda x: x * 2, reference, lambda g: (torch.randn(N, generator=g).half(),))
    assert r.passed and r.reference_precision == "float16"
    assert "(it raised OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB)" in r.reference_note


def test_a_float64_reference_with_other_shapes_is_named():
    r = check(lambda x: x * 2, lambda x: x[None] * 2 if x.dtype == torch.float64 else x * 2,
              lambda g: (torch.randn(N, generator=g).half(),))
    assert r.passed and "returned other outputs (count or shapes)" in r.reference_note


def test_no_note_when_the_float64_reference_ran():
    r = check(lambda x: x * 2, lambda x: x * 2, lambda g: (torch.randn(N, generator=g).half(),))
    assert r.reference_precision == "float64" and r.reference_note is None


# --- bad input ---------------------------------------------------------------------------------------------------


def test_output_count_mismatch_is_a_failed_report():
    r = check(lambda x, y: (x + y, x), torch.add, two_vectors)
    assert not r.passed and "2 outputs" in r.message and "1 output" in r.message


def test_shape_mismatch_is_a_failed_report():
    r = check(lambda x, y: (x + y)[:-1], torch.add, two_vectors)
    assert not r.passed and "(1000,)" in r.message and "(1001,)" in r.message and "shape" in r.message


def test_dtype_mismatch_is_a_failed_report():
    r = check(lambda x, y: (x + y).half(), torch.add, two_vectors)
    assert not r.passed and "float16" in r.message and "float32" in r.message


def test_non_tensor_output_is_a_failed_report():
    r = check(lambda x, y: "done", torch.add, two_vectors)
    assert not r.passed and "str" in r.message


def test_candidate_returning_none_without_outputs_explains_how():
    r = check(lambda x, y: None, torch.add, two_vectors)
    assert not r.passed and "outputs=" in r.message


def test_a_candidate_that_raises_is_reported_with_the_trials_seed():
    calls = []

    def candidate(x, y):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("misaligned address")
        return x + y

    r = check(candidate, torch.add, two_vectors, seed=10, outputs=())
    assert not r.passed
    assert r.failing_trial == 2 and r.failing_seed == 12
    assert r.exception == "ValueError: misaligned address"
    assert "misaligned address" in r.traceback
    assert "manual_seed(12)" in str(r)


def test_inputs_that_raise_are_reported():
    def inputs(g):
        raise RuntimeError("out of memory")

    r = check(torch.neg, torch.neg, inputs)
    assert not r.passed and "inputs(generator)" in r.message and "out of memory" in r.exception


def test_a_reference_that_raises_is_reported():
    r = check(torch.neg, lambda x: x.nonexistent(), lambda g: (torch.randn(3, generator=g),))
    assert not r.passed and "the reference raised" in r.message


@pytest.mark.parametrize("kwargs,words", [
    (dict(candidate=3), "candidate must be callable"),
    (dict(trials=0), "trials"),
    (dict(atol=-1.0), "atol"),
    (dict(precision="fp8"), "precision"),
    (dict(outputs=2), "outputs"),
])
def test_wrong_arguments_raise_check_error(kwargs, words):
    args = dict(candidate=torch.neg, reference=torch.neg, inputs=lambda g: (torch.randn(3, generator=g),))
    args.update(kwargs)
    with pytest.raises(CheckError, match=words):
        check(args.pop("candidate"), args.pop("reference"), args.pop("inputs"), **args)


def test_inputs_returning_the_wrong_type_raise_check_error():
    with pytest.raises(CheckError, match="tuple of arguments"):
        check(torch.neg, torch.neg, lambda g: {"x": torch.randn(3)})


def test_outputs_naming_a_missing_argument_raise_check_error():
    with pytest.raises(CheckError, match="outputs"):
        check(torch.neg, torch.neg, lambda g: (torch.randn(3, generator=g),), outputs=(4,))


# --- the report ----------------------------------------------------------------------------------------------------


def _failing_3d_report():
    def candidate(x):
        out = x * 2
        out[2, 40, 250] = 7.0
        return out

    return check(candidate, lambda x: x * 2, lambda g: (torch.randn(3, 50, 300, generator=g),), trials=1)


def test_report_is_frozen_and_serialises_to_json():
    r = _failing_3d_report()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.passed = True
    data = r.to_json()
    assert data["kind"] == "check" and data["version"] == 1 and data["passed"] is False
    assert data["worst"][0] == [2, 40, 250]
    json.dumps(data, allow_nan=False)  # strict JSON: non-finite numbers are strings
    bundle = r._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html", REPORT_MIME}


def test_error_map_pools_flattened_rows_and_keeps_the_bad_cell():
    r = _failing_3d_report()
    grid = r.error_map
    assert grid.shape == (64, 128)   # 150 flattened rows x 300 columns, max-pooled
    hot = [divmod(int(k), grid.shape[1]) for k in (grid > 1).ravel().nonzero()[0]]
    expected = ((2 * 50 + 40) * 64 // 150, 250 * 128 // 300)
    assert 1 <= len(hot) <= 4   # adaptive pooling windows overlap by at most one cell each way
    assert all(abs(r - expected[0]) <= 1 and abs(c - expected[1]) <= 1 for r, c in hot)


def test_html_shows_yours_vs_reference_and_a_heatmap():
    r = _failing_3d_report()
    page = r._repr_html_()
    assert "check failed" in page and "(2, 40, 250)" in page
    assert "data:image/png;base64," in page and "flattened rows" in page
    one_d = check(lambda x, y: x + y, torch.add, two_vectors)._repr_html_()
    assert "check passed" in one_d and "data:image/png;base64," in one_d


def test_report_of_a_raising_candidate_has_html_with_the_traceback():
    r = check(lambda x: 1 / 0, torch.neg, lambda g: (torch.randn(3, generator=g),))
    page = r._repr_html_()
    assert "ZeroDivisionError" in page and "<details>" in page
    assert isinstance(r, CheckReport) and r.error_map is None


# --- a Numba kernel in the CUDA simulator --------------------------------------------------------------------------

SIMULATED = textwrap.dedent("""
    import json, torch
    from numba import cuda
    from kernellab.run.measure.check import check

    @cuda.jit
    def add(x, y, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = x[i] + y[i]

    @cuda.jit
    def add_wrong(x, y, out):          # adds 1 at element 517 and never writes the last element
        i = cuda.grid(1)
        if i < x.size - 1:
            out[i] = x[i] + y[i] + (1.0 if i == 517 else 0.0)

    def launcher(kernel):
        def run(x, y, out):            # torch CPU tensors -> NumPy views -> simulated kernel -> torch
            kernel[(x.numel() + 127) // 128, 128](x.numpy(), y.numpy(), out.numpy())
            return torch.from_numpy(out.numpy())
        return run

    n = 1000
    inputs = lambda g: (torch.randn(n, generator=g), torch.randn(n, generator=g), torch.empty(n))
    ok = check(launcher(add), lambda x, y, out: x + y, inputs, trials=2)
    bad = check(launcher(add_wrong), lambda x, y, out: x + y, inputs, trials=2)
    print(json.dumps({"simulator": cuda.is_available() and type(cuda.get_current_device()).__module__,
                      "ok": ok.passed, "bad": bad.passed, "worst": bad.worst[:2],
                      "mismatches": bad.mismatches, "outputs": bad.output_arguments}))
""")


def test_numba_kernel_in_the_simulator():
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-c", SIMULATED], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "simulator" in str(result["simulator"])
    assert result["ok"] is True and result["bad"] is False
    assert result["outputs"] == [2]
    assert sorted(map(tuple, result["worst"])) == [(517,), (999,)] and result["mismatches"] == 2


def test_numpy_outputs_are_filled_with_nan_too():
    """A kernel that forgets the zeros of a ReLU passes when its output starts at zero, as np.zeros inputs do; the
    check fills output arguments with NaN first, NumPy arrays as well as tensors, and leaves the inputs alone."""
    import numpy as np

    snapshot = []

    def inputs(g):
        a = torch.randn(N, generator=g).numpy()
        snapshot.append(a.copy())
        return a, np.zeros(N, np.float32)

    def relu_forgets_zeros(a, out):      # writes the positive elements only
        out[a > 0] = a[a > 0]
        return out

    def relu(a, out):
        np.maximum(a, 0, out=out)
        return out

    def reference(a, out):
        return np.maximum(a, 0)

    good = check(relu, reference, inputs, trials=2)
    assert good.passed and good.output_arguments == (1,), good
    bad = check(relu_forgets_zeros, reference, inputs, trials=1)
    assert not bad.passed and bad.output_arguments == (1,) and bad.mismatches == int((snapshot[-1] <= 0).sum())
    ints = check(lambda a, out: out, lambda a, out: np.zeros(N, np.int32),
                 lambda g: (np.arange(N, dtype=np.int32), np.zeros(N, np.int32)), trials=1, outputs=(1,))
    assert not ints.passed and ints.mismatches == N                   # the integer maximum, not the zeros
    changed = check(lambda a, out: a.__setitem__(0, 5) or out.__setitem__(slice(None), a) or out,
                    lambda a, out: a.copy(), lambda g: (np.zeros(N, np.float32), np.zeros(N, np.float32)), trials=1)
    assert not changed.passed and "changed its inputs" in str(changed)
