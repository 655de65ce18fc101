/**
 * Lexical scan of a `%%cuda` cell: where the magic line is, which CUDA-only words the C++ parser must not see,
 * and which CUDA built-ins to colour. Pure string code, shared by the parser wrapper and the decorations.
 */

import { CUDA_CELL_MAGICS } from '../tokens';

/** A half-open character range [from, to) in the cell text. */
export interface IRange {
  from: number;
  to: number;
}

/** The result of scanning one cell. */
export interface ICudaScan {
  /** The `%%cuda ...` line, or null when the cell is not a CUDA cell (then every other field is empty). */
  magic: IRange | null;
  /** CUDA qualifiers (`__global__`, `__shared__`, `__launch_bounds__(...)`, ...): hidden from the C++ parser. */
  qualifiers: IRange[];
  /** CUDA built-in variables and intrinsics (`threadIdx`, `__syncthreads`, ...): parsed as C++ identifiers, coloured. */
  builtins: IRange[];
  /** The ranges handed to the C++ parser: everything after the magic line, minus the qualifiers. */
  parseRanges: IRange[];
}

/** Declaration qualifiers that standard C++ does not have; lezer's C++ grammar would mis-parse a declaration around them. */
export const CUDA_QUALIFIERS: ReadonlyArray<string> = [
  '__global__',
  '__device__',
  '__host__',
  '__shared__',
  '__constant__',
  '__managed__',
  '__forceinline__',
  '__noinline__',
  '__restrict__',
  '__grid_constant__'
];

/** Built-in variables and common intrinsics, in CUDA's own words. */
export const CUDA_BUILTINS: ReadonlyArray<string> = [
  'threadIdx',
  'blockIdx',
  'blockDim',
  'gridDim',
  'warpSize',
  '__syncthreads',
  '__syncthreads_count',
  '__syncthreads_and',
  '__syncthreads_or',
  '__syncwarp',
  '__threadfence',
  '__threadfence_block',
  '__shfl_sync',
  '__shfl_up_sync',
  '__shfl_down_sync',
  '__shfl_xor_sync',
  '__ballot_sync',
  '__all_sync',
  '__any_sync',
  '__activemask',
  '__ldg',
  'atomicAdd',
  'atomicSub',
  'atomicMax',
  'atomicMin',
  'atomicCAS',
  'atomicExch'
];

const EMPTY: ICudaScan = { magic: null, qualifiers: [], builtins: [], parseRanges: [] };

/**
 * Return the name of the cell magic on the first non-blank line (`%%cuda -a sm_90` gives `cuda`), or null.
 * IPython drops leading blank lines before it looks for a cell magic, so this does too.
 */
export function cellMagic(text: string): string | null {
  const match = /^(?:[ \t]*\r?\n)*%%([A-Za-z_][\w]*)/.exec(text);
  return match ? match[1] : null;
}

/** Whether the cell's magic makes its body CUDA C++. */
export function isCudaCell(text: string): boolean {
  const magic = cellMagic(text);
  return magic !== null && CUDA_CELL_MAGICS.includes(magic);
}

// One alternation, tried left to right at each position: comments and literals first (so that words inside them are
// skipped), then `__launch_bounds__(...)`, then the qualifier and built-in words.
const TOKEN = new RegExp(
  [
    '(\\/\\/[^\\n]*|\\/\\*[\\s\\S]*?(?:\\*\\/|$)|"(?:\\\\.|[^"\\\\\\n])*"?|\'(?:\\\\.|[^\'\\\\\\n])*\'?)',
    '(\\b__launch_bounds__\\s*\\([^()]*\\))',
    `\\b(${CUDA_QUALIFIERS.join('|')})\\b`,
    `\\b(${CUDA_BUILTINS.join('|')})\\b`
  ].join('|'),
  'g'
);

/** Scan a cell. Returns empty ranges (and `magic: null`) unless the first line is a CUDA cell magic. */
export function scanCudaCell(text: string): ICudaScan {
  if (!isCudaCell(text)) {
    return EMPTY;
  }
  const magicStart = text.indexOf('%%');
  const newline = text.indexOf('\n', magicStart);
  const magicEnd = newline < 0 ? text.length : newline;
  const magic = { from: magicStart, to: magicEnd };

  const qualifiers: IRange[] = [];
  const builtins: IRange[] = [];
  TOKEN.lastIndex = magicEnd;
  for (let m = TOKEN.exec(text); m !== null; m = TOKEN.exec(text)) {
    const range = { from: m.index, to: m.index + m[0].length };
    if (m[2] !== undefined || m[3] !== undefined) {
      qualifiers.push(range);
    } else if (m[4] !== undefined) {
      builtins.push(range);
    }
    if (m[0].length === 0) {
      TOKEN.lastIndex++;
    }
  }

  const parseRanges: IRange[] = [];
  let from = newline < 0 ? text.length : newline + 1;
  for (const q of qualifiers) {
    if (q.from > from) {
      parseRanges.push({ from, to: q.from });
    }
    from = q.to;
  }
  if (text.length > from) {
    parseRanges.push({ from, to: text.length });
  }
  return { magic, qualifiers, builtins, parseRanges };
}
