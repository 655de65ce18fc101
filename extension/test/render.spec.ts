import { IReport, reportDiagnostics, renderReport } from '../src/report/render';
import { formatBytes, formatExactBytes, formatMs, formatNumber, formatPercent } from '../src/report/format';

// Reports made by the real Python side: `python tests/browser/report_fixtures.py --write` regenerates them.
import fixtures from './fixtures/reports.json';

const FIXTURES = fixtures as unknown as Record<string, IReport>;

const copy = (r: IReport): IReport => JSON.parse(JSON.stringify(r));
const text = (node: Element | null) => node?.textContent ?? '';
const all = (root: Element, selector: string) => [...root.querySelectorAll(selector)].map(n => n.textContent);

describe('formatting', () => {
  it('writes units and a dash for missing values', () => {
    expect(formatBytes(0)).toBe('0 B');
    expect(formatBytes(4224)).toBe('4.13 KiB');
    expect(formatExactBytes(1032)).toBe('1,032 B');       // a block's shared memory: every byte counts
    expect(formatBytes(80 * 2 ** 30)).toBe('80 GiB');
    expect(formatMs(0.0123456)).toBe('0.0123 ms');
    expect(formatMs(null)).toBe('—');
    expect(formatPercent(0.375)).toBe('37.5%');
    expect(formatNumber(1234567)).toBe('1.23e+6');
    expect(formatNumber(2048)).toBe('2,048');
  });
});

describe('compile report', () => {
  it('shows a resource card per kernel, with occupancy and its limiter', () => {
    const node = renderReport(FIXTURES.compile);
    expect(node.classList).toContain('kl-Report--compile');
    expect(all(node, '.kl-Kernel-name')).toEqual(['vadd', 'tile_sum']);
    const vadd = node.querySelector('.kl-Kernel')!;
    expect(text(vadd.querySelector('.kl-Stat'))).toBe('Registers12');
    expect(text(vadd.querySelector('.kl-Occupancy-value'))).toBe('100%');
    expect(text(vadd.querySelector('.kl-Limiter'))).toBe('warps per SM');
    expect(all(vadd, '.kl-BestBlocks .kl-Chip')).toEqual(['1,024', '512', '256']);
    expect(all(node, '.kl-Report-chips .kl-Chip')).toContain('sm_90');
  });

  it('shows occupancy at the block size that matters, and says which', () => {
    const node = renderReport(FIXTURES.compile);
    const [vadd, tileSum] = [...node.querySelectorAll('.kl-Kernel')];
    expect(text(vadd.querySelector('.kl-Occupancy-at'))).toBe('at 1,024 threads/block (its best block size)');
    expect(text(tileSum.querySelector('.kl-Occupancy-at'))).toBe('at 256 threads/block (its __launch_bounds__)');
    // tile_sum has __launch_bounds__(256): no best block size above it.
    expect(all(tileSum, '.kl-BestBlocks .kl-Chip')).toEqual(['256', '128', '64']);
  });

  it("shows a cache hit's own time, and the compile time of a miss", () => {
    const hit = copy(FIXTURES.compile);
    Object.assign(hit, { cache: 'hit', cache_source: 'memory', compile_ms: 104, wall_ms: 0.23 });
    const hitChips = all(renderReport(hit), '.kl-Report-chips .kl-Chip');
    expect(hitChips).toContain('cache hit · 0.23 ms');
    expect(hitChips.join(' ')).not.toContain('104');
    const missChips = all(renderReport(Object.assign(copy(FIXTURES.compile), { cache: 'miss', compile_ms: 49.8 })),
      '.kl-Report-chips .kl-Chip');
    expect(missChips).toEqual(expect.arrayContaining(['cache miss', formatMs(49.8)]));
  });

  it('flags spills and local memory', () => {
    const report = copy(FIXTURES.compile);
    Object.assign((report.kernels as Record<string, unknown>[])[0], { spill_store_bytes: 64, spill_load_bytes: 32, local_bytes: 96 });
    const node = renderReport(report);
    expect(node.querySelector('.kl-Stat--bad')?.textContent).toBe('Spills64 B st / 32 B ld');
    expect(node.querySelector('.kl-Stat--warn')?.textContent).toBe('Local96 B');
  });

  it('summarises the SASS by kind, marking tensor cores and local memory', () => {
    const vadd = renderReport(FIXTURES.compile).querySelector('.kl-Kernel')!;
    expect(text(vadd.querySelector('.kl-Instructions summary'))).toBe('SASS no tensor cores, fp32: 1 FADD; local memory: none');
    expect(all(vadd, '.kl-Instr-group')).toEqual(['global memory', 'local memory', 'fp32']);
    const report = copy(FIXTURES.compile);
    const kernel = (report.kernels as Record<string, unknown>[])[0];
    kernel.instructions = {
      total: 9,
      headline: 'tensor cores: 4 HMMA.16816.F32.BF16; local memory: 2 LDL.32',
      lines: [['tensor cores', '4 HMMA.16816.F32.BF16'], ['local memory', '2 LDL.32']]
    };
    const marked = renderReport(report).querySelector('.kl-Kernel')!;
    expect(marked.querySelector('.kl-Instr--good')?.textContent).toBe('tensor cores');
    expect(marked.querySelector('.kl-Instr--warn')?.textContent).toBe('local memory');
    delete kernel.instructions;
    expect(renderReport(report).querySelector('.kl-Kernel')!.querySelector('.kl-Instructions')).toBeNull();
  });

  it('lists diagnostics and reveals their cell line on click', () => {
    const revealed: number[] = [];
    const node = renderReport(FIXTURES.compile_failed, { revealDiagnostic: d => revealed.push(d.line) });
    expect(text(node.querySelector('.kl-Chip--bad'))).toBe('failed');
    // The header says what failed once: the title counts the errors, the chip says failed (not "compile failed · failed").
    expect(text(node.querySelector('.kl-Report-title'))).toBe('cell.cu: 1 error, 1 warning');
    expect(node.dataset.failed).toBe('true');
    const rows = node.querySelectorAll<HTMLButtonElement>('button.kl-Diag');
    expect(rows).toHaveLength(2);
    expect(rows[0].classList).toContain('kl-Diag--error');
    expect(text(rows[0].querySelector('.kl-Diag-where'))).toBe('line 4:30');
    expect(rows[1].classList).toContain('kl-Diag--warning');
    rows[1].click();
    rows[0].click();
    expect(revealed).toEqual([5, 4]);
    expect(node.querySelector('.kl-Log pre')?.textContent).toContain('error: identifier "factor" is undefined');
    expect(reportDiagnostics(FIXTURES.compile_failed).map(d => [d.line, d.severity])).toEqual([
      [4, 'error'],
      [5, 'warning']
    ]);
  });

  it('shows diagnostics without links where there is no cell to go to', () => {
    const node = renderReport(FIXTURES.compile_failed);
    expect(node.querySelectorAll('button')).toHaveLength(0);
    expect(node.querySelectorAll('.kl-Diag')).toHaveLength(2);
  });

  it('never interprets kernel text as HTML', () => {
    const report = copy(FIXTURES.compile_failed);
    (report.diagnostics as Record<string, unknown>[])[0].message = '<img src=x onerror="alert(1)">';
    report.title = '<b>bold</b>';
    const node = renderReport(report);
    expect(node.querySelector('img')).toBeNull();
    expect(node.querySelector('b')).toBeNull();
    expect(text(node.querySelector('.kl-Diag-message'))).toBe('<img src=x onerror="alert(1)">');
  });
});

describe('occupancy report', () => {
  it('shows each resource limit with its arithmetic, the limiter highlighted', () => {
    const node = renderReport(FIXTURES.occupancy);
    expect(text(node.querySelector('.kl-Occupancy-value'))).toBe('37.5%');
    const limiter = node.querySelector('tr.kl-is-limiter')!;
    expect(text(limiter.querySelector('.kl-Limit-name'))).toBe('registerslimiter');
    expect(text(limiter.querySelector('.kl-Limit-reason'))).toContain('72 regs/thread');
    expect(all(node, '.kl-Limits tbody td:last-child')).toEqual(['8', '3', '17', '32']);
  });

  it('accepts blocks_limit_* fields too', () => {
    const node = renderReport({
      kind: 'occupancy', version: 1, title: 't', ratio: 0.5, limiter: 'shared', block_size: 128,
      blocks_limit_warps: 16, blocks_limit_registers: 8, blocks_limit_shared: 4, blocks_limit_blocks: 32
    });
    expect(all(node, '.kl-Limits tbody td:last-child')).toEqual(['16', '8', '4', '32']);
    expect(text(node.querySelector('tr.kl-is-limiter .kl-Limit-name'))).toBe('shared memorylimiter');
  });
});

describe('check report', () => {
  it('says passed and shows the largest differences', () => {
    const node = renderReport(FIXTURES.check_passed);
    expect(node.querySelector('.kl-Verdict--pass')).not.toBeNull();
    expect(text(node.querySelector('.kl-Stat--good'))).toBe('Mismatches0');
  });

  it('says failed and lists only the elements out of tolerance', () => {
    const node = renderReport(FIXTURES.check_failed);
    expect(node.querySelector('.kl-Verdict--fail')).not.toBeNull();
    expect(text(node.querySelector('.kl-Verdict-text'))).toContain('out of tolerance');
    expect(all(node, '.kl-Worst tbody td:first-child')).toEqual(['[17]', '[400]']);
    expect(text(node.querySelector('.kl-Worst .kl-Bad'))).toMatch(/×$/);
    expect(text(node.querySelector('.kl-Report-footer'))).toContain('reproduce: args = inputs(');
  });

  it('says why the reference is not in float64, and says nothing when it is', () => {
    expect(renderReport(FIXTURES.check_passed).querySelector('.kl-Note--warn')).toBeNull();
    const report = copy(FIXTURES.check_passed);
    report.reference_note = 'the reference could not run in float64 (it raised OutOfMemoryError: CUDA out of memory)';
    expect(text(renderReport(report).querySelector('.kl-Note--warn'))).toBe(`note: ${report.reference_note}`);
  });

  it('accepts worst elements given as objects, and non-finite numbers as strings', () => {
    const node = renderReport({
      kind: 'check', version: 1, title: 't', passed: false, max_abs_error: 'inf', mismatches: 1,
      worst: [{ index: [0, 3], actual: 'nan', expected: 1.5 }]
    });
    expect(all(node, '.kl-Worst tbody td')).toEqual(['[0, 3]', 'nan', '1.5', '—']);
    expect(text(node.querySelectorAll('.kl-Stat')[1])).toBe('Max abs errorinf');
  });
});

describe('bench report', () => {
  it('shows the function and its baselines with their spread, rates and speed-up', () => {
    const node = renderReport(FIXTURES.bench);
    expect(all(node, '.kl-Bench-name')).toEqual(['saxpy', 'torch']);
    expect(all(node, '.kl-Bench thead th')).toEqual(['', 'median', 'q25 – q75 ms', 'TFLOP/s', 'GB/s']);
    expect(node.querySelector('.kl-Bench-median.kl-is-fastest .kl-Bench-ms')?.textContent).toMatch(/^0\.2\d* ms$/);
    expect(text(node.querySelector('.kl-Speedups .kl-Chip--good'))).toMatch(/^1\.\d+× vs torch/);
    expect(text(node.querySelector('.kl-Report-footer'))).toContain('fake clock');
  });

  it('accepts rows with q20/q80 and per-row speed-ups', () => {
    const node = renderReport({
      kind: 'bench', version: 1, title: 't', device: 'NVIDIA H200', method: 'CUDA events',
      rows: [
        { name: 'mine', median_ms: 1, q20_ms: 0.9, q80_ms: 1.1, tflops: 10, gbps: null, speedup: 2 },
        { name: 'torch', median_ms: 2, q20_ms: 1.9, q80_ms: 2.1, tflops: 5, gbps: null, speedup: null }
      ]
    });
    expect(all(node, '.kl-Bench thead th')).toEqual(['', 'median', 'q20 – q80 ms', 'TFLOP/s', 'speed-up']);
    expect(all(node, '.kl-Bench tbody td:last-child')).toEqual(['2×', '']);
  });

  it('shows a sweep as one row per point', () => {
    const point = FIXTURES.bench;
    const node = renderReport({
      kind: 'bench', version: 1, title: 'sweep over n',
      sweep: { x_name: 'n', xs: [1024, 4096], points: [point, point] }
    });
    expect(all(node, '.kl-Sweep thead th')).toEqual(['n', 'saxpy', 'torch']);
    expect(all(node, '.kl-Sweep tbody td:first-child')).toEqual(['1024', '4096']);
  });
});

describe('other kinds', () => {
  it('fall back to their fields and tables', () => {
    const node = renderReport({ kind: 'banks', version: 1, title: 'bank conflicts', wavefronts: 32, ideal_wavefronts: 1,
      banks: [{ bank: 0, ways: 32 }] });
    expect(text(node.querySelector('.kl-Report-kind'))).toBe('Shared-memory banks');
    expect(all(node, '.kl-Fields dt')).toEqual(['wavefronts', 'ideal_wavefronts']);
    expect(all(node, '.kl-Generic thead th')).toEqual(['bank', 'ways']);
  });

  it('give every field a value, and integers in full (a grade without a GPU)', () => {
    // kernellab.grade's to_json for a Numba kernel graded completely in the simulator: needs_gpu is empty.
    const node = renderReport({ kind: 'grade', version: 1, title: '00-flip · Shared memory (flip): PASSED',
      exercise: '00-flip', kernel: 'flip', passed: true, complete: true, verdict: 'passed', needs_gpu: '',
      findings: [], checks: [{ check: 'racecheck', passed: true, detail: 'clean' }], speed: null,
      seed: 125000000, notes: [] });
    const labels = all(node, '.kl-Fields dt');
    const values = all(node, '.kl-Fields dd');
    expect(labels).toEqual(['exercise', 'kernel', 'passed', 'complete', 'verdict', 'needs_gpu', 'seed']);
    expect(values.length).toBe(labels.length);
    expect(values.every(v => v !== '')).toBe(true);
    expect(values[labels.indexOf('needs_gpu')]).toBe('—');
    expect(values[labels.indexOf('seed')]).toBe('125000000');
    expect(values[labels.indexOf('verdict')]).toBe('passed');
  });
});
