import { Widget } from '@lumino/widgets';

import { ICellDiagnostic } from '../src/diagnostics/gutter';
import { IReport } from '../src/report/render';
import { IDiagnosticsHost, ReportRenderer, reportRendererFactory } from '../src/report/widget';
import { REPORT_MIME } from '../src/tokens';

import fixtures from './fixtures/reports.json';

const FIXTURES = fixtures as unknown as Record<string, IReport>;

/** A host that records what the renderer asks of the notebook. */
class FakeHost implements IDiagnosticsHost {
  shown = new Map<string, ICellDiagnostic[]>();
  revealed: number[] = [];

  show(_node: HTMLElement, owner: string, diagnostics: ICellDiagnostic[]): () => void {
    this.shown.set(owner, diagnostics);
    return () => this.shown.delete(owner);
  }

  reveal(_node: HTMLElement, diagnostic: ICellDiagnostic): void {
    this.revealed.push(diagnostic.line);
  }
}

function model(data: unknown) {
  return { data: { [REPORT_MIME]: data }, metadata: {}, trusted: false } as any;
}

function renderer(host?: IDiagnosticsHost): ReportRenderer {
  return reportRendererFactory(host).createRenderer({ mimeType: REPORT_MIME } as any) as ReportRenderer;
}

describe('ReportRenderer', () => {
  it('is a safe renderer for the report MIME type', () => {
    const factory = reportRendererFactory();
    expect(factory.safe).toBe(true);
    expect(factory.mimeTypes).toEqual(['application/vnd.kernellab.report+json']);
  });

  it('puts diagnostics in the editor while attached, and takes them away when disposed', async () => {
    const host = new FakeHost();
    const widget = renderer(host);
    await widget.renderModel(model(FIXTURES.compile_failed));
    expect(host.shown.size).toBe(0);                  // not in the page yet
    Widget.attach(widget, document.body);
    expect([...host.shown.values()][0].map(d => d.line)).toEqual([4, 5]);
    widget.node.querySelector<HTMLButtonElement>('button.kl-Diag')!.click();
    expect(host.revealed).toEqual([4]);
    widget.dispose();
    expect(host.shown.size).toBe(0);
  });

  it('replaces its diagnostics when re-rendered', async () => {
    const host = new FakeHost();
    const widget = renderer(host);
    Widget.attach(widget, document.body);
    await widget.renderModel(model(FIXTURES.compile_failed));
    expect(host.shown.size).toBe(1);
    await widget.renderModel(model(FIXTURES.compile));
    expect(host.shown.size).toBe(0);
    expect(widget.node.querySelector('.kl-Kernel')).not.toBeNull();
    widget.dispose();
  });

  it('says so when the data is not a report', async () => {
    const widget = renderer();
    await widget.renderModel(model('not json'));
    expect(widget.node.textContent).toContain('not a kernellab report');
  });
});
