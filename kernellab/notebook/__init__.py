"""Presentation: magics, rich cards, plots and widgets. Nothing below this layer imports it."""


def load_ipython_extension(ipython):
    """Register kernellab's magics (`%load_ext kernellab`)."""
    from .magics import KernellabMagics

    ipython.register_magics(KernellabMagics)
    from .gpu_magic import GpuMagics

    ipython.register_magics(GpuMagics)
    try:
        from .numba_magics import NumbaMagics
    except ImportError:
        NumbaMagics = None
    if NumbaMagics is not None:
        ipython.register_magics(NumbaMagics)
    from . import run_magics

    run_magics.load_ipython_extension(ipython)
    try:
        from .status import publish_status
    except ImportError:
        return
    publish_status()
