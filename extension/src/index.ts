/** kernellab's JupyterLab plugins: CUDA cells in the editor, report renderers, the GPU status item. */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import {
  EditorExtensionRegistry,
  IEditorExtensionRegistry,
  IEditorLanguageRegistry
} from '@jupyterlab/codemirror';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Language, syntaxHighlighting } from '@codemirror/language';
import { classHighlighter } from '@lezer/highlight';

import { cudaCells } from './cuda/language';
import { cellDiagnostics } from './diagnostics/gutter';
import { keepCleanOnKernelMetadata } from './notebook/clean';
import { NotebookDiagnosticsHost } from './diagnostics/host';
import { reportRendererFactory } from './report/widget';
import { GpuStatusModel } from './status/model';
import { watchNotebooks } from './status/listener';
import { GpuStatusItem, statusRendererFactory } from './status/widget';
import { PLUGIN_ID, REPORT_RENDERER_RANK, STATUS_RENDERER_RANK } from './tokens';

/**
 * Every editor gets: C++ (CUDA) highlighting while its first line is `%%cuda`, the diagnostics gutter, and stable
 * `tok-*` token classes (CodeMirror's classHighlighter) next to the theme's own.
 */
const cells: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID.cells,
  description: 'C++ (CUDA) highlighting and bracket matching for %%cuda cells; compile diagnostics in the gutter.',
  autoStart: true,
  requires: [IEditorExtensionRegistry, IEditorLanguageRegistry],
  activate: async (
    _app: JupyterFrontEnd,
    extensions: IEditorExtensionRegistry,
    languages: IEditorLanguageRegistry
  ): Promise<void> => {
    const cpp = await languages.getLanguage('text/x-c++src');
    const cppLanguage: Language | undefined = cpp?.support?.language;
    extensions.addExtension({
      name: 'kernellab:cells',
      factory: () =>
        EditorExtensionRegistry.createImmutableExtension([
          cppLanguage ? cudaCells(cppLanguage) : [],
          cellDiagnostics(),
          syntaxHighlighting(classHighlighter)
        ])
    });
  }
};

/** The report panel (with diagnostics linked to their cell) and the invisible status output. */
const renderers: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID.report,
  description: 'Renders kernellab reports (compile, occupancy, check, bench) as panels.',
  autoStart: true,
  requires: [IRenderMimeRegistry],
  optional: [INotebookTracker],
  activate: (_app: JupyterFrontEnd, rendermime: IRenderMimeRegistry, tracker: INotebookTracker | null): void => {
    const host = tracker ? new NotebookDiagnosticsHost(tracker) : undefined;
    rendermime.addFactory(reportRendererFactory(host), REPORT_RENDERER_RANK);
    rendermime.addFactory(statusRendererFactory, STATUS_RENDERER_RANK);
  }
};

/** The status-bar item: the current notebook kernel's GPU, as kernellab reports it. */
const status: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID.status,
  description: "Shows the kernel's GPU (name, memory in use) or that there is none, in the status bar.",
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar],
  activate: (_app: JupyterFrontEnd, tracker: INotebookTracker, statusBar: IStatusBar | null): void => {
    if (!statusBar) {
      return;
    }
    const model = new GpuStatusModel();
    watchNotebooks(tracker, model);
    statusBar.registerStatusItem(PLUGIN_ID.status, {
      item: new GpuStatusItem(model),
      align: 'left',
      rank: 50,
      isActive: () => model.current !== null,
      activeStateChanged: model.changed
    });
  }
};

/** An untouched notebook stays unmodified when its kernel connects (see notebook/clean.ts). */
const clean: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID.clean,
  description: "Keeps an unmodified notebook unmodified when its kernel's spec and language info are written.",
  autoStart: true,
  requires: [INotebookTracker],
  activate: (_app: JupyterFrontEnd, tracker: INotebookTracker): void => {
    const watch = (panel: NotebookPanel) => {
      if (panel.model) {
        keepCleanOnKernelMetadata(panel.model);
      } else {
        void panel.context.ready.then(() => panel.model && keepCleanOnKernelMetadata(panel.model));
      }
    };
    tracker.forEach(watch);
    tracker.widgetAdded.connect((_, panel) => watch(panel));
  }
};

export default [cells, renderers, status, clean];
