/**
 * CodeMirror 6 support for `%%cuda` cells: while a cell's first line is `%%cuda`, its editor uses a C++ language that
 * skips the magic line and CUDA qualifiers, and CUDA words get their own marks; any other cell keeps its language.
 */

import { Language, languageDataProp } from '@codemirror/language';
import {
  Compartment,
  EditorState,
  Extension,
  Prec,
  RangeSetBuilder,
  StateEffect,
  StateField,
  Text
} from '@codemirror/state';
import { Decoration, DecorationSet, EditorView, ViewPlugin } from '@codemirror/view';
import {
  Input,
  NodeType,
  Parser,
  PartialParse,
  Tree,
  TreeFragment
} from '@lezer/common';

import { CUDA_LANGUAGE_NAME } from '../tokens';
import { ICudaScan, isCudaCell, scanCudaCell } from './scan';

/** Class names of the CUDA marks (styled in style/base.css with the editor's theme colours). */
export const CUDA_CLASS = {
  magic: 'kl-cm-cellMagic',
  qualifier: 'kl-cm-cudaQualifier',
  builtin: 'kl-cm-cudaBuiltin'
} as const;

/**
 * A parser for a whole cell: hands the C++ parser only `scan.parseRanges` and wraps its tree in a top node that spans
 * the cell, so positions stay cell positions. Cells are short, so every parse is a full parse (fragments are dropped).
 */
class CudaCellParser extends Parser {
  constructor(
    private readonly _cpp: Parser,
    private readonly _top: NodeType
  ) {
    super();
  }

  createParse(
    input: Input,
    _fragments: readonly TreeFragment[],
    _ranges: readonly { from: number; to: number }[]
  ): PartialParse {
    const length = input.length;
    const ranges = scanCudaCell(input.read(0, length)).parseRanges;
    const top = this._top;
    if (ranges.length === 0) {
      const empty = new Tree(top, [], [], length);
      return { advance: () => empty, parsedPos: length, stopAt: () => undefined, stoppedAt: null };
    }
    const inner = this._cpp.startParse(input, [], ranges);
    const offset = ranges[0].from;
    return {
      advance(): Tree | null {
        const tree = inner.advance();
        if (!tree) {
          return null;
        }
        const end = inner.stoppedAt ?? length;
        return new Tree(top, [tree], [offset], Math.max(end, offset + tree.length));
      },
      get parsedPos(): number {
        return inner.parsedPos;
      },
      stopAt(pos: number): void {
        inner.stopAt(pos);
      },
      get stoppedAt(): number | null {
        return inner.stoppedAt;
      }
    };
  }
}

/**
 * Build the CUDA cell language from a C++ language (JupyterLab's, from its language registry, or
 * `@codemirror/lang-cpp`'s `cppLanguage` in tests). It shares C++'s language data: comment tokens, brackets, indentation.
 */
export function cudaLanguage(cpp: Language): Language {
  const top = NodeType.define({
    id: 0,
    name: 'CudaCell',
    top: true,
    props: [[languageDataProp, cpp.data]]
  });
  return new Language(cpp.data, new CudaCellParser(cpp.parser, top), [], CUDA_LANGUAGE_NAME);
}

/** Whether a document's first non-blank line is a CUDA cell magic (reads only the start of the document). */
function wantsCuda(doc: Text): boolean {
  return isCudaCell(doc.sliceString(0, Math.min(doc.length, 2000)));
}

const NO_SCAN = scanCudaCell('');

/** The scan of a document: a rescan per change for CUDA cells (they are short); other documents are not read. */
function scanDoc(doc: Text): ICudaScan {
  return wantsCuda(doc) ? scanCudaCell(doc.toString()) : NO_SCAN;
}

/** The scan of the editor's current text, kept up to date on every change. */
export const cudaScanField = StateField.define<ICudaScan>({
  create: state => scanDoc(state.doc),
  update: (scan, tr) => (tr.docChanged ? scanDoc(tr.state.doc) : scan)
});

/** Whether the editor holds a `%%cuda` cell. */
export function isCudaState(state: EditorState): boolean {
  return state.field(cudaScanField, false)?.magic != null;
}

const MARK = {
  magic: Decoration.mark({ class: CUDA_CLASS.magic }),
  qualifier: Decoration.mark({ class: `${CUDA_CLASS.qualifier} tok-keyword` }),
  builtin: Decoration.mark({ class: CUDA_CLASS.builtin })
};

function cudaMarks(scan: ICudaScan): DecorationSet {
  if (!scan.magic) {
    return Decoration.none;
  }
  const marks = [
    ...scan.qualifiers.map(r => MARK.qualifier.range(r.from, r.to)),
    ...scan.builtins.map(r => MARK.builtin.range(r.from, r.to))
  ].sort((a, b) => a.from - b.from);
  const builder = new RangeSetBuilder<Decoration>();
  if (scan.magic.to > scan.magic.from) {
    builder.add(scan.magic.from, scan.magic.to, MARK.magic);
  }
  for (const m of marks) {
    builder.add(m.from, m.to, m.value);
  }
  return builder.finish();
}

/**
 * The editor extension for every JupyterLab editor: inert until the text starts with `%%cuda`, then the CUDA language
 * takes precedence over the editor's own (Python) language, in the same transaction as the edit, and is dropped again
 * when the magic changes.
 *
 * The language sits in a compartment that is empty for other cells: providing CodeMirror's `language` facet with no
 * value would break editors that have no language yet (JupyterLab loads languages asynchronously).
 */
export function cudaCells(cpp: Language): Extension {
  const active: Extension = Prec.highest(cudaLanguage(cpp).extension);
  const slot = new Compartment();
  const sync = (state: EditorState, doc: Text): StateEffect<unknown> | null => {
    const want = wantsCuda(doc);
    return want === (slot.get(state) === active) ? null : slot.reconfigure(want ? active : []);
  };
  return [
    slot.of([]),
    cudaScanField,
    EditorView.decorations.compute([cudaScanField], state => cudaMarks(state.field(cudaScanField))),
    EditorState.transactionExtender.of(tr => {
      const effect = sync(tr.startState, tr.newDoc);
      return effect ? { effects: effect } : null;
    }),
    // An editor created with a %%cuda cell in it switches right after creation (no dispatch during construction).
    ViewPlugin.define(view => {
      const plugin = { live: true, destroy: () => (plugin.live = false) };
      queueMicrotask(() => {
        const effect = plugin.live ? sync(view.state, view.state.doc) : null;
        if (effect) {
          view.dispatch({ effects: effect });
        }
      });
      return plugin;
    })
  ];
}
