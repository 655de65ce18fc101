/** The notebook side of diagnostics: find the cell an output belongs to, mark its editor, move its cursor. */

import type { CodeMirrorEditor } from '@jupyterlab/codemirror';
import type { Cell } from '@jupyterlab/cells';
import type { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';

import type { IDiagnosticsHost } from '../report/widget';
import { ICellDiagnostic, setCellDiagnostics } from './gutter';

interface ILocated {
  panel: NotebookPanel;
  index: number;
  cell: Cell;
}

/** Diagnostics host for notebooks: outputs are matched to cells by DOM containment. */
export class NotebookDiagnosticsHost implements IDiagnosticsHost {
  constructor(private readonly _tracker: INotebookTracker) {}

  show(node: HTMLElement, owner: string, diagnostics: ICellDiagnostic[]): (() => void) | null {
    const found = this._locate(node);
    if (!found) {
      return null;
    }
    const { cell } = found;
    let cleared = false;
    let view: CodeMirrorEditor['editor'] | null = null;
    // A cell outside the viewport may not have its editor yet: mark it once the cell is ready.
    void cell.ready.then(() => {
      const editor = cell.editor as CodeMirrorEditor | null;
      if (!cleared && editor?.editor && !cell.isDisposed) {
        view = editor.editor;
        setCellDiagnostics(view, owner, diagnostics);
      }
    });
    return () => {
      cleared = true;
      if (view && !cell.isDisposed) {
        setCellDiagnostics(view, owner, []);
      }
    };
  }

  reveal(node: HTMLElement, diagnostic: ICellDiagnostic): void {
    const found = this._locate(node);
    if (!found) {
      return;
    }
    const { panel, index, cell } = found;
    panel.content.activeCellIndex = index;
    panel.content.mode = 'edit';
    const editor = cell.editor;
    if (!editor) {
      return;
    }
    const position = { line: Math.max(0, diagnostic.line - 1), column: Math.max(0, (diagnostic.column ?? 1) - 1) };
    editor.setCursorPosition(position);
    editor.revealPosition(position);
    editor.focus();
  }

  private _locate(node: HTMLElement): ILocated | null {
    let found: ILocated | null = null;
    this._tracker.forEach(panel => {
      if (found || !panel.node.contains(node)) {
        return;
      }
      panel.content.widgets.forEach((cell, index) => {
        if (!found && cell.node.contains(node)) {
          found = { panel, index, cell };
        }
      });
    });
    return found;
  }
}
