import { EditorView } from '@codemirror/view';

import { DIAGNOSTIC_CLASS, cellDiagnostics, setCellDiagnostics, shownDiagnostics } from '../src/diagnostics/gutter';

const CELL = '%%cuda\n__global__ void k(float* x) {\n  x[0] = factor;\n  int unused;\n}';

function editor(doc = CELL): EditorView {
  return new EditorView({ doc, extensions: [cellDiagnostics()], parent: document.body });
}

describe('cell diagnostics', () => {
  afterEach(() => document.body.replaceChildren());

  it('marks the cell lines the compiler names (the %%cuda line is line 1)', () => {
    const view = editor();
    setCellDiagnostics(view, 'out-1', [
      { line: 3, column: 10, severity: 'error', message: 'identifier "factor" is undefined' },
      { line: 4, severity: 'warning', message: 'unused variable' }
    ]);
    expect(shownDiagnostics(view.state)).toEqual([
      [3, 'error'],
      [4, 'warning']
    ]);
    const markers = view.dom.querySelectorAll(`.${DIAGNOSTIC_CLASS.marker}`);
    expect([...markers].map(m => m.className)).toEqual([
      `${DIAGNOSTIC_CLASS.marker} ${DIAGNOSTIC_CLASS.marker}--error`,
      `${DIAGNOSTIC_CLASS.marker} ${DIAGNOSTIC_CLASS.marker}--warning`
    ]);
    expect((markers[0] as HTMLElement).title).toContain('3:10 error: identifier "factor" is undefined');
    const tinted = view.dom.querySelector(`.${DIAGNOSTIC_CLASS.line}--error`);
    expect(tinted?.textContent).toBe('  x[0] = factor;');
  });

  it('shows the worst severity when a line has several messages', () => {
    const view = editor();
    setCellDiagnostics(view, 'a', [
      { line: 3, severity: 'warning', message: 'w' },
      { line: 3, severity: 'error', message: 'e' }
    ]);
    expect(shownDiagnostics(view.state)).toEqual([[3, 'error']]);
  });

  it('follows the marked line through edits', () => {
    const view = editor();
    setCellDiagnostics(view, 'a', [{ line: 3, severity: 'error', message: 'e' }]);
    view.dispatch({ changes: { from: CELL.indexOf('__global__'), insert: '// a comment\n' } });
    expect(shownDiagnostics(view.state)).toEqual([[4, 'error']]);
  });

  it('clears one output without touching another, and drops the gutter when none are left', () => {
    const view = editor();
    setCellDiagnostics(view, 'a', [{ line: 3, severity: 'error', message: 'e' }]);
    setCellDiagnostics(view, 'b', [{ line: 4, severity: 'warning', message: 'w' }]);
    setCellDiagnostics(view, 'a', []);
    expect(shownDiagnostics(view.state)).toEqual([[4, 'warning']]);
    expect(view.dom.querySelector(`.${DIAGNOSTIC_CLASS.gutter}`)).not.toBeNull();
    setCellDiagnostics(view, 'b', []);
    expect(shownDiagnostics(view.state)).toEqual([]);
    expect(view.dom.querySelector(`.${DIAGNOSTIC_CLASS.gutter}`)).toBeNull();
  });

  it('clamps lines outside the cell and ignores editors without the extension', () => {
    const view = editor('one line');
    setCellDiagnostics(view, 'a', [{ line: 99, severity: 'error', message: 'e' }]);
    expect(shownDiagnostics(view.state)).toEqual([[1, 'error']]);
    const bare = new EditorView({ doc: 'x', parent: document.body });
    expect(() => setCellDiagnostics(bare, 'a', [{ line: 1, severity: 'error', message: 'e' }])).not.toThrow();
  });
});
