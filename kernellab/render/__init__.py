"""How results render themselves (HTML tables, heatmaps, plots as PNG): below run/, so that results in run/ show in
a notebook without importing notebook/. Imports only kernellab.report, kernellab.errors and, lazily, matplotlib."""
