/** The MIME renderer widget for kernellab reports, and the hook through which it reaches the cell's editor. */

import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';

import { ICellDiagnostic } from '../diagnostics/gutter';
import { REPORT_MIME } from '../tokens';
import { IReport, h, isReport, renderReport, reportDiagnostics } from './render';

/**
 * What the renderer needs from the page to tie diagnostics to the cell that produced them. The notebook plugin
 * provides one (diagnostics/host.ts); without it, reports still render, with unlinked diagnostics.
 */
export interface IDiagnosticsHost {
  /** Show diagnostics in the editor of the cell whose output holds `node`; returns how to remove them, or null. */
  show(node: HTMLElement, owner: string, diagnostics: ICellDiagnostic[]): (() => void) | null;
  /** Select the cell whose output holds `node` and put its cursor on the diagnostic. */
  reveal(node: HTMLElement, diagnostic: ICellDiagnostic): void;
}

let nextOwner = 0;

/** Renders one `application/vnd.kernellab.report+json` output as a panel. */
export class ReportRenderer extends Widget implements IRenderMime.IRenderer {
  constructor(options: IRenderMime.IRendererOptions, host?: IDiagnosticsHost) {
    super();
    this._mimeType = options.mimeType;
    this._host = host ?? null;
    this.addClass('kl-ReportOutput');
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const data = model.data[this._mimeType] as unknown;
    this._clearDiagnostics();
    if (!isReport(data)) {
      this._diagnostics = [];
      this.node.replaceChildren(h('div', 'kl-Report-invalid', 'kernellab: this output is not a kernellab report.'));
      return;
    }
    const report = data as IReport;
    const host = this._host;
    this._diagnostics = reportDiagnostics(report);
    this.node.replaceChildren(
      renderReport(report, {
        revealDiagnostic: host ? diagnostic => host.reveal(this.node, diagnostic) : undefined
      })
    );
    if (this.isAttached) {
      this._showDiagnostics();
    }
  }

  dispose(): void {
    this._clearDiagnostics();
    super.dispose();
  }

  protected onAfterAttach(): void {
    this._showDiagnostics();
  }

  protected onBeforeDetach(): void {
    this._clearDiagnostics();
  }

  private _showDiagnostics(): void {
    if (this._host && this._diagnostics.length && !this._clear) {
      this._clear = this._host.show(this.node, this._owner, this._diagnostics);
    }
  }

  private _clearDiagnostics(): void {
    const clear = this._clear;
    this._clear = null;
    clear?.();
  }

  private readonly _mimeType: string;
  private readonly _host: IDiagnosticsHost | null;
  private readonly _owner = `kernellab-report-${nextOwner++}`;
  private _diagnostics: ICellDiagnostic[] = [];
  private _clear: (() => void) | null = null;
}

/** The renderer factory; `host` links diagnostics to cells. Safe: it only ever sets text, never HTML. */
export function reportRendererFactory(host?: IDiagnosticsHost): IRenderMime.IRendererFactory {
  return {
    safe: true,
    mimeTypes: [REPORT_MIME],
    createRenderer: options => new ReportRenderer(options, host)
  };
}
