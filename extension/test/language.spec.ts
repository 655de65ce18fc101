import { cppLanguage } from '@codemirror/lang-cpp';
import { pythonLanguage } from '@codemirror/lang-python';
import { bracketMatching, ensureSyntaxTree, language } from '@codemirror/language';
import { EditorState } from '@codemirror/state';
import { EditorView } from '@codemirror/view';

import { CUDA_CLASS, cudaCells, cudaLanguage } from '../src/cuda/language';

/** An editor state like a notebook cell's: Python, plus kernellab's extension; one empty update settles it. */
function cellState(doc: string): EditorState {
  const state = EditorState.create({ doc, extensions: [pythonLanguage, cudaCells(cppLanguage), bracketMatching()] });
  return state.update({}).state;
}

function nodeAt(state: EditorState, text: string, offset = 0): string {
  const tree = ensureSyntaxTree(state, state.doc.length, 5000)!;
  const pos = state.doc.toString().indexOf(text) + offset;
  return tree.resolveInner(pos, 1).name;
}

const KERNEL = '%%cuda\n__global__ void vadd(const float* a, float* c, int n) {\n  // sum\n  int i = threadIdx.x;\n  if (i < n) c[i] = a[i];\n}';

describe('cudaCells', () => {
  it('parses a %%cuda cell as C++, with the magic line and qualifiers outside the tree', () => {
    const state = cellState(KERNEL);
    expect(state.facet(language)!.name).toBe('cuda');
    expect(nodeAt(state, 'void')).toBe('PrimitiveType');
    expect(nodeAt(state, 'vadd')).toBe('Identifier');
    expect(nodeAt(state, '// sum')).toBe('LineComment');
    expect(nodeAt(state, 'if')).toBe('if');
    // `void vadd(...) {...}` is one function definition: the qualifier did not derail the parse.
    const tree = ensureSyntaxTree(state, state.doc.length, 5000)!;
    const fn = tree.resolveInner(KERNEL.indexOf('vadd'), 1).parent!.parent!;
    expect(fn.name).toBe('FunctionDefinition');
    expect(KERNEL.slice(fn.from, fn.to).endsWith('}')).toBe(true);
    let errors = 0;
    tree.iterate({ enter: n => void (n.type.isError && errors++) });
    expect(errors).toBe(0);
  });

  it('leaves other cells in their own language', () => {
    const state = cellState('%%numba\nx = 1  # comment');
    expect(state.facet(language)).toBe(pythonLanguage);
    expect(nodeAt(state, '# comment')).toBe('Comment');
  });

  it('switches language in the same transaction that edits the magic, both ways', () => {
    let state = cellState('%%numb\n// c++?');
    expect(state.facet(language)).toBe(pythonLanguage);
    // "%%numb" -> "%%cuda"
    state = state.update({ changes: { from: 2, to: 6, insert: 'cuda' } }).state;
    expect(state.facet(language)!.name).toBe('cuda');
    expect(nodeAt(state, '// c++?')).toBe('LineComment');
    state = state.update({ changes: { from: 0, to: 1 } }).state;   // "%cuda": a line magic, not a cell magic
    expect(state.facet(language)).toBe(pythonLanguage);
  });

  it('uses C++ language data: // comments and C++ bracket matching', () => {
    const state = cellState(KERNEL);
    const data = state.languageDataAt<{ line: string }>('commentTokens', KERNEL.indexOf('int i'));
    expect(data[0].line).toBe('//');
    const tree = ensureSyntaxTree(state, state.doc.length, 5000)!;
    const open = KERNEL.indexOf('{');
    expect(tree.resolveInner(open, 1).name).toBe('{');
    expect(tree.resolveInner(open, 1).parent!.name).toBe('CompoundStatement');
  });

  it('marks the magic line, qualifiers and built-ins', () => {
    const state = cellState(KERNEL);
    const marks: string[] = [];
    for (const source of state.facet(EditorView.decorations)) {
      const set = typeof source === 'function' ? null : source;
      set?.between(0, state.doc.length, (from, to, value) => {
        marks.push(`${value.spec.class}:${KERNEL.slice(from, to)}`);
      });
    }
    expect(marks).toEqual([
      `${CUDA_CLASS.magic}:%%cuda`,
      `${CUDA_CLASS.qualifier} tok-keyword:__global__`,
      `${CUDA_CLASS.builtin}:threadIdx`
    ]);
  });

  it('does not touch editors without a language', () => {
    const state = EditorState.create({ doc: 'plain text', extensions: [cudaCells(cppLanguage)] });
    expect(state.update({ changes: { from: 0, insert: 'more ' } }).state.facet(language)).toBeNull();
  });

  it('keeps cudaLanguage usable on its own', () => {
    const state = EditorState.create({ doc: '%%cuda\nint x;', extensions: [cudaLanguage(cppLanguage)] });
    expect(nodeAt(state, 'int')).toBe('PrimitiveType');
  });
});

