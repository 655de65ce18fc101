/** Feed the GPU status model from every notebook's kernel messages. */

import type { ISessionContext } from '@jupyterlab/apputils';
import type { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';

import { GpuStatusModel, IMessageLike, statusFromMessage } from './model';

/** Watch one session: record statuses from IOPub, forget them when the kernel restarts or changes. */
export function watchSession(sessionContext: ISessionContext, owner: object, model: GpuStatusModel): void {
  sessionContext.iopubMessage.connect((_, msg) => {
    const status = statusFromMessage(msg as unknown as IMessageLike);
    if (status) {
      model.set(owner, status);
    }
  });
  sessionContext.kernelChanged.connect(() => model.set(owner, null));
  sessionContext.statusChanged.connect((_, status) => {
    if (status === 'restarting' || status === 'dead') {
      model.set(owner, null);
    }
  });
}

/** Watch every notebook the tracker sees, and follow the current one. */
export function watchNotebooks(tracker: INotebookTracker, model: GpuStatusModel): void {
  const watch = (panel: NotebookPanel) => watchSession(panel.sessionContext, panel, model);
  tracker.forEach(watch);
  tracker.widgetAdded.connect((_, panel) => watch(panel));
  tracker.currentChanged.connect((_, panel) => model.setCurrent(panel));
  model.setCurrent(tracker.currentWidget);
}
