/**
 * Compile diagnostics in a cell's editor: a gutter marker (red for an error, amber for a warning) and a tinted line
 * per diagnostic. Each output that shows diagnostics owns its set, so clearing one output leaves the others.
 */

import {
  Compartment,
  EditorState,
  Extension,
  RangeSet,
  RangeSetBuilder,
  StateEffect,
  StateField
} from '@codemirror/state';
import { Decoration, EditorView, GutterMarker, gutter } from '@codemirror/view';

/** One compiler message, positioned in cell lines (the `%%cuda` line is line 1). */
export interface ICellDiagnostic {
  line: number;
  column?: number;
  severity: 'error' | 'warning';
  message: string;
}

/** A diagnostic pinned to a document position, which follows edits. */
interface IPlaced {
  owner: string;
  pos: number;
  diagnostic: ICellDiagnostic;
}

/** Class names used by the gutter (styled in style/base.css). */
export const DIAGNOSTIC_CLASS = {
  gutter: 'kl-cm-diagnosticGutter',
  marker: 'kl-cm-diagnosticMarker',
  line: 'kl-cm-diagnosticLine'
} as const;

const setDiagnostics = StateEffect.define<{ owner: string; diagnostics: ICellDiagnostic[] }>();

/** The document position of the start of a 1-based line, clamped to the document. */
function lineStart(state: EditorState, line: number): number {
  const n = Math.min(Math.max(1, Math.floor(line) || 1), state.doc.lines);
  return state.doc.line(n).from;
}

/** All diagnostics shown in this editor, by owner, mapped through every edit. */
export const diagnosticsField = StateField.define<IPlaced[]>({
  create: () => [],
  update(placed, tr) {
    let next = tr.docChanged
      ? placed.map(p => ({ ...p, pos: tr.changes.mapPos(p.pos, -1) }))
      : placed;
    for (const effect of tr.effects) {
      if (effect.is(setDiagnostics)) {
        const { owner, diagnostics } = effect.value;
        next = next
          .filter(p => p.owner !== owner)
          .concat(
            diagnostics.map(diagnostic => ({
              owner,
              diagnostic,
              pos: lineStart(tr.state, diagnostic.line)
            }))
          );
      }
    }
    return next;
  }
});

/** The gutter marker of one line: the worst severity on it, every message in its tooltip. */
class DiagnosticMarker extends GutterMarker {
  constructor(
    readonly severity: 'error' | 'warning',
    readonly messages: string
  ) {
    super();
  }

  eq(other: GutterMarker): boolean {
    return (
      other instanceof DiagnosticMarker &&
      other.severity === this.severity &&
      other.messages === this.messages
    );
  }

  toDOM(): Node {
    const node = document.createElement('span');
    node.className = `${DIAGNOSTIC_CLASS.marker} ${DIAGNOSTIC_CLASS.marker}--${this.severity}`;
    node.title = this.messages;
    node.setAttribute('aria-label', `${this.severity}: ${this.messages}`);
    node.textContent = this.severity === 'error' ? '●' : '▲';
    return node;
  }
}

/** Group the placed diagnostics by line start: [pos, worst severity, messages], sorted by position. */
function byLine(state: EditorState): [number, 'error' | 'warning', string][] {
  const lines = new Map<number, { severity: 'error' | 'warning'; messages: string[] }>();
  for (const p of state.field(diagnosticsField)) {
    const pos = state.doc.lineAt(p.pos).from;
    const entry = lines.get(pos) ?? { severity: 'warning', messages: [] };
    if (p.diagnostic.severity === 'error') {
      entry.severity = 'error';
    }
    const where = p.diagnostic.column ? `${p.diagnostic.line}:${p.diagnostic.column}` : `${p.diagnostic.line}`;
    entry.messages.push(`${where} ${p.diagnostic.severity}: ${p.diagnostic.message}`);
    lines.set(pos, entry);
  }
  return [...lines.entries()]
    .sort((a, b) => a[0] - b[0])
    .map(([pos, e]) => [pos, e.severity, e.messages.join('\n')]);
}

const markersOf = (state: EditorState): RangeSet<GutterMarker> => {
  const builder = new RangeSetBuilder<GutterMarker>();
  for (const [pos, severity, messages] of byLine(state)) {
    builder.add(pos, pos, new DiagnosticMarker(severity, messages));
  }
  return builder.finish();
};

const lineTints = EditorView.decorations.compute([diagnosticsField], state => {
  const builder = new RangeSetBuilder<Decoration>();
  for (const [pos, severity] of byLine(state)) {
    builder.add(pos, pos, Decoration.line({ class: `${DIAGNOSTIC_CLASS.line} ${DIAGNOSTIC_CLASS.line}--${severity}` }));
  }
  return builder.finish();
});

// The gutter itself lives in a compartment that is only filled while there are diagnostics, so that ordinary cells
// do not grow an empty gutter column.
const gutterSlot = new Compartment();
const diagnosticGutter = gutter({ class: DIAGNOSTIC_CLASS.gutter, markers: view => markersOf(view.state) });

/** The editor extension: include it once in every editor (it is inert until diagnostics are set). */
export function cellDiagnostics(): Extension {
  return [diagnosticsField, lineTints, gutterSlot.of([])];
}

/** Show `diagnostics` (replacing this owner's previous ones; an empty list clears them) in an editor. */
export function setCellDiagnostics(view: EditorView, owner: string, diagnostics: ICellDiagnostic[]): void {
  if (view.state.field(diagnosticsField, false) === undefined) {
    return;
  }
  const others = view.state.field(diagnosticsField).filter(p => p.owner !== owner).length;
  const show = others + diagnostics.length > 0;
  view.dispatch({
    effects: [setDiagnostics.of({ owner, diagnostics }), gutterSlot.reconfigure(show ? diagnosticGutter : [])]
  });
}

/** The diagnostics an editor currently shows, as [1-based line, severity] pairs (for tests and the reveal command). */
export function shownDiagnostics(state: EditorState): [number, 'error' | 'warning'][] {
  return byLine(state).map(([pos, severity]) => [state.doc.lineAt(pos).number, severity]);
}
