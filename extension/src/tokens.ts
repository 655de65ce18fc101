/** Names shared by the kernellab front end: MIME types, plugin ids, command ids, cell magics. */

/** The report MIME type: one JSON object per result (compile, occupancy, check, bench, ...). */
export const REPORT_MIME = 'application/vnd.kernellab.report+json';

/** The GPU status MIME type published by kernellab.notebook.status (see README.md: "Status contract"). */
export const STATUS_MIME = 'application/vnd.kernellab.status+json';

/** Cell magics whose body is CUDA C++ (the rest of the cell is highlighted as C++). */
export const CUDA_CELL_MAGICS: ReadonlyArray<string> = ['cuda'];

/** The name CodeMirror puts in the editor's `data-language` attribute for a CUDA cell. */
export const CUDA_LANGUAGE_NAME = 'cuda';

/** Plugin ids (the part after the colon is what users see in the plugin manager). */
export const PLUGIN_ID = {
  cells: 'kernellab-jupyter:cuda-cells',
  report: 'kernellab-jupyter:report',
  status: 'kernellab-jupyter:gpu-status',
  clean: 'kernellab-jupyter:clean-on-open'
} as const;

/** Renderer ranks: lower wins, and text/html is 50, so the designed panel is preferred over the HTML fallback. */
export const REPORT_RENDERER_RANK = 20;
export const STATUS_RENDERER_RANK = 20;
