"""kernellab: write CUDA kernels in notebook cells, and see what they cost, whether they are right and how fast they are.

`%load_ext kernellab` registers the `%%cuda` (and `%%numba`) cell magics. The library works without IPython:
`compile_cuda`, `occupancy`, `bank_wavefronts`, `check`, `bench`, `roofline`, `tensor_map` (TMA descriptors), `op`
(a launcher as a PyTorch operator: torch.compile, CUDA graphs, autograd), `set_launch_blocking` (whether launches wait
for their kernel), and the graded exercises of the tutorials: `exercises()`, `grade(id, kernel)`.
"""
import importlib

from ._version import __version__
from .errors import ArgumentError, CompileError, Diagnostic, KernellabError, LaunchError, NoGPUError

# Public names, imported on first use so that `import kernellab` stays light (no torch, no IPython).
_LAZY = {
    "compile_cuda": ("kernellab.kernel", "compile_cuda"),
    "Kernel": ("kernellab.kernel", "Kernel"),
    "Module": ("kernellab.kernel", "Module"),
    "Resources": ("kernellab.kernel", "Resources"),
    "occupancy": ("kernellab.analysis.occupancy", "occupancy"),
    "Occupancy": ("kernellab.analysis.occupancy", "Occupancy"),
    "best_block_sizes": ("kernellab.analysis.occupancy", "best_block_sizes"),
    "bank_wavefronts": ("kernellab.analysis.banks", "bank_wavefronts"),
    "analyze_access": ("kernellab.analysis.banks", "analyze_access"),
    "trace_shared": ("kernellab.run.sim.trace", "trace_shared"),
    "plot_occupancy": ("kernellab.notebook.occupancy_plots", "plot_occupancy"),
    "occupancy_explorer": ("kernellab.notebook.occupancy_widget", "occupancy_explorer"),
    "plot_bank_access": ("kernellab.notebook.bank_plots", "plot_bank_access"),
    "plot_shared_trace": ("kernellab.notebook.bank_plots", "plot_shared_trace"),
    "sweep_plot": ("kernellab.render.bench_html", "sweep_plot"),
    "check": ("kernellab.run.measure.check", "check"),
    "CheckReport": ("kernellab.run.measure.check", "CheckReport"),
    "bench": ("kernellab.run.measure.bench", "bench"),
    "sweep": ("kernellab.run.measure.bench", "sweep"),
    "BenchResult": ("kernellab.run.measure.bench", "BenchResult"),
    "roofline": ("kernellab.notebook.bench_plots", "roofline"),
    "has_gpu": ("kernellab.run.launch.device", "has_gpu"),
    "tensor_map": ("kernellab.run.launch.tensor_map", "tensor_map"),
    "TensorMap": ("kernellab.run.launch.tensor_map", "TensorMap"),
    "set_isolation": ("kernellab.run.launch.worker", "set_isolation"),
    "isolation": ("kernellab.run.launch.worker", "isolation"),
    "numba_kernel": ("kernellab.kernel_numba", "numba_kernel"),
    "NumbaKernel": ("kernellab.kernel_numba", "NumbaKernel"),
    "compile_numba": ("kernellab.compile.numba_backend", "compile_numba"),
    "exercises": ("kernellab.teach", "exercises"),
    "grade": ("kernellab.teach", "grade"),
    "GradeResult": ("kernellab.teach", "GradeResult"),
    "Exercise": ("kernellab.teach", "Exercise"),
    "autotune": ("kernellab.kernel", "autotune"),
    "AutotuneResult": ("kernellab.run.measure.autotune", "AutotuneResult"),
    "autotune_plot": ("kernellab.notebook.autotune_plots", "autotune_plot"),
    "grade_many": ("kernellab.teach.grading", "grade_many"),
    "grade_class": ("kernellab.teach.grading", "grade_class"),
    "op": ("kernellab.ops", "op"),
    "Op": ("kernellab.ops", "Op"),
    "out": ("kernellab.ops", "out"),
    "set_launch_blocking": ("kernellab.run.launch.launch", "set_launch_blocking"),
    "launch_blocking": ("kernellab.run.launch.launch", "launch_blocking"),
    "synchronize": ("kernellab.run.launch.launch", "synchronize"),
    "recent_launches": ("kernellab.run.launch.launch", "recent_launches"),
}

__all__ = ["__version__", "ArgumentError", "CompileError", "Diagnostic", "KernellabError", "LaunchError",
           "NoGPUError", "load_ipython_extension", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kernellab' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def load_ipython_extension(ipython):
    """`%load_ext kernellab`: register the cell magics."""
    # The presentation layer loads with the extension, not with `import kernellab`.
    from .notebook import load_ipython_extension as _load

    _load(ipython)
