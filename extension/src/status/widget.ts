/** The status-bar item that shows the kernel's GPU, and the invisible renderer for status outputs. */

import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';

import { STATUS_MIME } from '../tokens';
import { GpuStatusModel, describeStatus } from './model';

/** `GPU: NVIDIA H200 · 1.2 GiB / 140 GiB` or `no GPU: compile-only`, with an explanation on hover. */
export class GpuStatusItem extends Widget {
  constructor(private readonly _model: GpuStatusModel) {
    super();
    this.addClass('kl-GpuStatus');
    this._model.changed.connect(this._render, this);
    this._render();
  }

  private _render(): void {
    const status = this._model.current;
    if (!status) {
      this.node.replaceChildren();
      this.node.title = '';
      this.node.dataset.tone = '';
      return;
    }
    const view = describeStatus(status);
    const dot = document.createElement('span');
    dot.className = 'kl-GpuStatus-dot';
    const text = document.createElement('span');
    text.className = 'kl-GpuStatus-text';
    text.textContent = view.text;
    this.node.replaceChildren(dot, text);
    this.node.title = view.title;
    this.node.dataset.tone = view.tone;
  }
}

/**
 * Status outputs carry data for the status bar, not for the notebook: render nothing (style/base.css hides the
 * output row). Front ends without this extension show the text/plain line instead.
 */
export class StatusOutput extends Widget implements IRenderMime.IRenderer {
  constructor() {
    super();
    this.addClass('kl-StatusOutput');
  }

  renderModel(): Promise<void> {
    return Promise.resolve();
  }
}

export const statusRendererFactory: IRenderMime.IRendererFactory = {
  safe: true,
  mimeTypes: [STATUS_MIME],
  createRenderer: () => new StatusOutput()
};
