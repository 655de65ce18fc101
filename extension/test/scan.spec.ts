import { cellMagic, isCudaCell, scanCudaCell } from '../src/cuda/scan';

const slice = (text: string, r: { from: number; to: number }) => text.slice(r.from, r.to);

describe('cellMagic', () => {
  it('reads the magic of the first non-blank line, as IPython does', () => {
    expect(cellMagic('%%cuda --arch sm_80\n__global__ void k() {}')).toBe('cuda');
    expect(cellMagic('\n  \n%%numba\n')).toBe('numba');
    expect(cellMagic('x = 1\n%%cuda')).toBeNull();
    expect(cellMagic('%cuda')).toBeNull();
  });

  it('makes only %%cuda cells CUDA cells', () => {
    expect(isCudaCell('%%cuda')).toBe(true);
    expect(isCudaCell('%%numba\n@cuda.jit\ndef k(x): pass')).toBe(false);
    expect(isCudaCell('%%cudax')).toBe(false);
    expect(isCudaCell('')).toBe(false);
  });
});

describe('scanCudaCell', () => {
  const cell = [
    '%%cuda -O=--use_fast_math',
    '__global__ void __launch_bounds__(256, 2) k(float* __restrict__ x) {',
    '  __shared__ float tile[32];',
    '  // __device__ in a comment stays a comment',
    '  const char* s = "__global__";',
    '  tile[threadIdx.x] = x[blockIdx.x];',
    '  __syncthreads();',
    '}'
  ].join('\n');

  it('finds the magic line', () => {
    const scan = scanCudaCell(cell);
    expect(slice(cell, scan.magic!)).toBe('%%cuda -O=--use_fast_math');
  });

  it('hides CUDA qualifiers from the C++ parser, but not words in comments or strings', () => {
    const scan = scanCudaCell(cell);
    expect(scan.qualifiers.map(r => slice(cell, r))).toEqual([
      '__global__',
      '__launch_bounds__(256, 2)',
      '__restrict__',
      '__shared__'
    ]);
    const parsed = scan.parseRanges.map(r => slice(cell, r)).join('');
    expect(parsed).not.toContain('%%cuda');
    expect(parsed).not.toContain('__launch_bounds__');
    expect(parsed).toContain('// __device__ in a comment');
    expect(parsed).toContain('"__global__"');
  });

  it('marks built-ins', () => {
    const scan = scanCudaCell(cell);
    expect(scan.builtins.map(r => slice(cell, r))).toEqual(['threadIdx', 'blockIdx', '__syncthreads']);
  });

  it('gives nothing for other cells', () => {
    expect(scanCudaCell('__global__ void k() {}')).toEqual({ magic: null, qualifiers: [], builtins: [], parseRanges: [] });
  });

  it('copes with a lone magic line and an unterminated comment', () => {
    expect(scanCudaCell('%%cuda').parseRanges).toEqual([]);
    const text = '%%cuda\n/* open comment __global__';
    expect(scanCudaCell(text).qualifiers).toEqual([]);
  });
});
