"""What a fresh notebook shows after `%load_ext kernellab`, in a real IPython shell in its own process (as a new
kernel is): a Figure returned by a cell as a PNG without `%matplotlib inline`, kernellab's figures once (not also
through pyplot), and the simulator's notice as a quiet note on stdout, not a warning on stderr."""
import json
import subprocess
import sys
import textwrap
import warnings

import pytest

SCRIPT = textwrap.dedent('''
    import json, sys
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
    ip.display_formatter.active_types = ["text/plain", "image/png", "text/html"]    # as in a kernel
    ip.run_line_magic("load_ext", "kernellab")
    import kernellab
    fig = kernellab.plot_occupancy(256, registers=32, shared_bytes=1024)
    data, _ = ip.display_formatter.format(fig)
    print("FIG", json.dumps({"mimes": sorted(data), "png": data.get("image/png", "")[:8],
                      "pyplot": "matplotlib.pyplot" in sys.modules}))
    sys.stdout.flush()
    ok = ip.run_cell("""%%numba --sim
    @cuda.jit
    def negate(x):
        i = cuda.grid(1)
        if i < x.size:
            x[i] = -x[i]
    """).success
    import numpy as np
    x = ip.user_ns["x"] = np.ones(8, np.float32)
    ok = ok and ip.run_cell("negate[1, 8](x)").success
    print("RAN", json.dumps({"ran": ok, "x": float(x.sum())}))
''')


def _line(out: str, tag: str) -> dict:
    [line] = [s for s in out.splitlines() if s.startswith(tag + " ")]
    return json.loads(line.split(" ", 1)[1])


@pytest.fixture(scope="module")
def fresh_shell():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "MPLBACKEND": "Agg", "PYTHONWARNINGS": "default"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_a_figure_from_a_fresh_notebook_shows_as_a_png(fresh_shell):
    first = _line(fresh_shell.stdout, "FIG")
    assert "image/png" in first["mimes"] and first["png"].startswith("iVBOR"), first     # base64 of b"\x89PNG"
    assert not first["pyplot"], "kernellab's plots are made without pyplot"


def test_the_simulator_notice_is_a_note_not_a_warning(fresh_shell):
    out, err = fresh_shell.stdout, fresh_shell.stderr
    assert _line(out, "RAN") == {"ran": True, "x": -8.0}
    assert "note: negate runs in Numba's CUDA simulator" in out, out
    assert "SimulatorNotice" not in err and "Warning" not in err, err


def test_other_warnings_still_go_where_they_went():
    from kernellab.notebook import show_notices_as_notes

    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, category, *rest: seen.append((str(message), category))
        show_notices_as_notes()
        warnings.warn("an ordinary warning", UserWarning)
    assert seen == [("an ordinary warning", UserWarning)]


def test_roofline_and_sweep_figures_are_not_pyplots():
    """A cell returning them shows them once: pyplot's inline backend would show a pyplot figure again."""
    import matplotlib.pyplot as plt

    from kernellab.render.bench_html import new_figure

    plt.close("all")
    fig, ax = new_figure((4, 3))
    ax.plot([1, 2], [3, 4])
    assert plt.get_fignums() == [] and fig.canvas.get_renderer() is not None
