"""The fault suite: faulty kernels launched from a real Jupyter kernel (through nbclient) never kill the notebook.

One notebook: it loads kernellab, defines variables on the GPU, compiles a %%cuda cell of faulty kernels, then runs
each fault (isolated, under compute-sanitizer, or caught before launch) followed by a check cell that reads the
variables and runs torch on the GPU. For each fault the test asserts that the kernel is alive, the variables are
intact, and the message names what went wrong and where (the kernel, and the cell line where a tool can tell).
A separate test shows what an in-process sticky fault does, in a throwaway process.

Needs ipykernel, nbclient and nbformat (tools/gpu/run.py installs carried wheels); skipped with a reason otherwise.
With $KERNELLAB_ARTIFACTS set it writes fault_suite.md (the table for docs/RESULTS.md) and the executed notebook.
"""
import datetime
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

MISSING = [m for m in ("nbclient", "nbformat", "ipykernel") if importlib.util.find_spec(m) is None]

FAULTS_CELL = r"""%%cuda --name faults
extern "C" __global__ void oob_write(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    x[i + n] = 1.0f;
}
extern "C" __global__ void oob_read(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = x[i + n];
}
extern "C" __global__ void misaligned(float* x) {
    float* p = (float*)((char*)x + 2);
    p[threadIdx.x] = 1.0f;
}
extern "C" __global__ void spin(int* flag) {
    while (atomicAdd(flag, 0) == 0) { }
}
extern "C" __global__ void trap(float* x) {
    if (threadIdx.x == 7) __trap();
    x[threadIdx.x] = 1.0f;
}
extern "C" __global__ void racy_reverse(const float* x, float* y) {
    __shared__ float tile[64];
    tile[threadIdx.x] = x[blockIdx.x * 64 + threadIdx.x];
    y[blockIdx.x * 64 + threadIdx.x] = tile[63 - threadIdx.x];
}
extern "C" __global__ void nan_out(float* y) {
    float z = 0.0f * threadIdx.x;
    y[threadIdx.x] = z / z;
}
extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""
CELL_LINES = FAULTS_CELL.splitlines()


def cell_line(fragment: str) -> int:
    """The line number (as Jupyter shows it, %%cuda line = 1) of the first line containing `fragment`."""
    return next(i + 1 for i, text in enumerate(CELL_LINES) if fragment in text)


SETUP = """%load_ext kernellab
%load_ext kernellab.notebook.run_magics
import torch
sentinel = "alive-7f3a"
keep = torch.arange(10.0, device="cuda")
buf = torch.zeros(1024, device="cuda")
flag = torch.zeros(1, dtype=torch.int32, device="cuda")
x64, y64 = torch.randn(128, device="cuda"), torch.zeros(128, device="cuda")
"""
CHECK = """assert sentinel == "alive-7f3a" and keep.sum().item() == 45.0 and buf.shape == (1024,)
print("CHECK", sentinel, keep.sum().item(), (torch.ones(3, device="cuda") * 2).sum().item())
"""

# (fault, how it is run, the cell, what the message must say (regexes, all of them), whether the cell errors)
FAULTS = [
    ("out-of-bounds write", "%launch --isolate", "%launch --isolate oob_write[4, 256](buf, 1 << 28)",
     # where a stray address lands decides the driver's word: an illegal address, or (seen on the H200 once the
     # worker's staging buffers moved the heap) an invalid address space
     [r"oob_write faulted", r"(?i)illegal|InvalidAddressSpace", rf"line {cell_line('x[i + n] = 1.0f;')}: x\[i \+ n\] = 1.0f;",
      r"thread \(\d+,\d+,\d+\) in block \(\d+,\d+,\d+\)"], True),
    ("out-of-bounds read", "%launch --isolate", "%launch --isolate oob_read[4, 256](buf, buf, 1 << 28)",
     [r"oob_read faulted", r"(?i)illegal|InvalidAddressSpace", rf"line {cell_line('y[i] = x[i + n];')}: y\[i\] = x\[i \+ n\];"], True),
    ("misaligned access", "%launch --isolate", "%launch --isolate misaligned[1, 32](buf)",
     [r"misaligned faulted", r"(?i)misaligned address",
      rf"line {cell_line('p[threadIdx.x] = 1.0f;')}: p\[threadIdx.x\] = 1.0f;"], True),
    ("infinite loop", "%launch --isolate --timeout=5", "%launch --isolate --timeout=5 spin[1, 1](flag)",
     [r"spin did not finish within 5 s", r"killed", r"session is unaffected"], True),
    ("trap", "%launch --isolate", "%launch --isolate trap[1, 32](buf)",
     [r"trap faulted", r"(?i)launch failure|trap|illegal instruction"], True),
    ("too many resources: shared memory", "%launch --isolate",
     "%launch --isolate vadd[1, 32, 300 * 1024](buf, buf, buf, 1024)",
     [r"shared_bytes = 307200", r"per-block limit"], True),
    ("too many resources: threads", "%launch --isolate", "%launch --isolate vadd[1, 2048](buf, buf, buf, 1024)",
     [r"2048 threads", r"max_threads_per_block"], True),
    ("wrong argument type", "%launch --isolate", "%launch --isolate oob_write[1, 32](buf.double(), 10)",
     [r"argument 0 \('x', float\*\) expects float32", r"float64"], True),
    ("host tensor", "%launch --isolate", "%launch --isolate vadd[1, 32](buf.cpu(), buf, buf, 1024)",
     [r"argument 0 \('a'", r"needs GPU memory"], True),
    ("data race", "%launch --sanitize=racecheck", "%launch --sanitize=racecheck racy_reverse[2, 64](x64, y64)",
     [r"racecheck: \d+ distinct problems? in racy_reverse", r"data race",
      rf"line {cell_line('tile[threadIdx.x] = x[')}", rf"line {cell_line('= tile[63 - threadIdx.x];')}"], False),
    ("kernel writes NaN", "%launch --isolate", "%launch --isolate nan_out[1, 64](y64)",
     [r"y \(float32\[128\]\) holds 64 NaN of 128 elements after the launch, the first at index 0"], False),
    ("notebook-wide isolation", "%config KernellabRun.isolate = True; k[g, b](...)",
     "%config KernellabRun.isolate = True\nfaults.oob_write[4, 256](buf, 1 << 28)",
     [r"oob_write faulted", r"IsolatedLaunchError", rf"line {cell_line('x[i + n] = 1.0f;')}"], True),
]


def _text(cell) -> str:
    """Everything a cell showed: streams, results, errors (name, value and traceback)."""
    parts = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            parts.append(o.get("text", ""))
        elif o.get("output_type") in ("execute_result", "display_data"):
            parts.append(o.get("data", {}).get("text/plain", ""))
        elif o.get("output_type") == "error":
            parts.append(f"{o.get('ename')}: {o.get('evalue')}\n" + "\n".join(o.get("traceback", [])))
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(parts))


def _errored(cell) -> bool:
    return any(o.get("output_type") == "error" for o in cell.get("outputs", [])) or \
        "UsageError" in _text(cell)


def _seconds(cell) -> float | None:
    t = cell.get("metadata", {}).get("execution", {})
    a, b = t.get("iopub.execute_input"), t.get("shell.execute_reply")
    if not (a and b):
        return None
    parse = lambda s: datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))
    return (parse(b) - parse(a)).total_seconds()


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    if MISSING:
        pytest.skip(f"the fault suite runs a Jupyter kernel and needs {', '.join(MISSING)} (tools/gpu/run.py "
                    f"installs carried wheels)")
    import nbformat
    from nbclient import NotebookClient

    cells = [SETUP, FAULTS_CELL]
    index = {}
    for fault in FAULTS:
        index[fault[0]] = len(cells)
        cells += [fault[2], CHECK]
    cells += ["%config KernellabRun.isolate = False\nrun = faults.vadd.run_isolated(1, 32, keep, keep, buf, 10)\n"
              "print('FINAL', sentinel, buf[:10].sum().item(), run.pid)"]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    client = NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path_factory.mktemp("nb"))}})
    client.execute()
    out = os.environ.get("KERNELLAB_ARTIFACTS")
    if out:
        pathlib.Path(out).mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, str(pathlib.Path(out) / "fault_suite.ipynb"))
    return nb, index


def test_setup_and_compile_cells_ran(executed):
    nb, _ = executed
    for cell in nb.cells[:2]:
        assert not _errored(cell), _text(cell)


@pytest.mark.parametrize("fault", FAULTS, ids=[f[0] for f in FAULTS])
def test_fault_is_reported_and_the_notebook_survives(executed, fault):
    nb, index = executed
    name, _, _, patterns, errors = fault
    cell, check = nb.cells[index[name]], nb.cells[index[name] + 1]
    text = _text(cell)
    assert _errored(cell) == errors, text[-3000:]
    for pattern in patterns:
        assert re.search(pattern, text), f"{name}: no /{pattern}/ in:\n{text[-3000:]}"
    ctext = _text(check)
    assert not _errored(check) and "CHECK alive-7f3a 45.0 6.0" in ctext, f"{name}: kernel not healthy:\n{ctext}"


def test_final_cell_and_results_table(executed):
    nb, index = executed
    final = _text(nb.cells[-1])
    assert "FINAL alive-7f3a 90.0" in final, final
    rows = []
    for name, how, _, patterns, _ in FAULTS:
        cell, check = nb.cells[index[name]], nb.cells[index[name] + 1]
        text = _text(cell)
        alive = "CHECK alive-7f3a 45.0 6.0" in _text(check)
        said = next((l.strip() for l in text.splitlines() if re.search(patterns[0], l)), text.strip()[:120])
        lines = [m.group(0) for m in (re.search(p, text) for p in patterns if p.startswith("line")) if m]
        where = ", ".join(lines)
        secs = _seconds(cell)
        rows.append(f"| {name} | `{how}` | {'yes' if alive else 'NO'} | {'yes' if alive else 'NO'} | "
                    f"{said[:110].replace('|', '/')}{' (' + where + ')' if where else ''} | "
                    f"{'%.1f s' % secs if secs is not None else '-'} |")
    import torch

    head = [f"Fault suite on {torch.cuda.get_device_name()} ({datetime.date.today().isoformat()}), "
            f"tests/gpu/test_faults_gpu.py: one Jupyter kernel (nbclient) runs every fault; after each, a cell reads "
            f"the variables defined before and runs torch on the GPU.", "",
            "| fault | run as | kernel alive | variables intact | message (and where) | cell time |",
            "|---|---|---|---|---|---|"]
    table = "\n".join(head + rows) + "\n"
    out = os.environ.get("KERNELLAB_ARTIFACTS")
    if out:
        (pathlib.Path(out) / "fault_suite.md").write_text(table)
    assert all("| yes | yes |" in r for r in rows), table


def test_in_process_sticky_fault_poisons_the_process_and_sanitize_last_finds_the_line():
    """What isolation prevents: in-process, the fault poisons torch too; the error says how to find the line."""
    src = FAULTS_CELL.split("\n", 1)[1]
    code = textwrap.dedent(f"""
        import json, torch, kernellab
        from kernellab.run.nvtools.sanitize import sanitize_last
        m = kernellab.compile_cuda({src!r}, first_line=2, filename="cell.cu")
        x = torch.zeros(1024, device="cuda")
        out = {{}}
        try:
            m.oob_write[4, 256](x, 1 << 28)
            torch.cuda.synchronize()
            out["raised"] = False
        except kernellab.LaunchError as e:
            out.update(raised=True, sticky=e.sticky, message=str(e), has_job=e.job is not None)
            try:
                torch.ones(3, device="cuda").sum().item()
                out["torch_after"] = "ok"
            except Exception as e2:
                out["torch_after"] = f"{{type(e2).__name__}}: {{e2}}"[:300]
            rep = sanitize_last(error=e)
            out["report"] = str(rep)
            out["cell_line"] = rep.findings[0].where.cell_line if rep.findings else None
        print("RESULT " + json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(line[7:])
    assert out["raised"] and out["sticky"] and out["has_job"], out
    assert "context of this process is lost" in out["message"] and "sanitize_last()" in out["message"]
    assert out["torch_after"] != "ok", "expected the in-process fault to poison torch as well"
    assert out["cell_line"] == cell_line("x[i + n] = 1.0f;"), out["report"]
    out_dir = os.environ.get("KERNELLAB_ARTIFACTS")
    if out_dir:
        pathlib.Path(out_dir, "in_process_sticky.txt").write_text(
            f"{out['message']}\n\ntorch afterwards: {out['torch_after']}\n\nsanitize_last():\n{out['report']}\n")
