/**
 * nbbudget in JupyterLab: a status-bar item that shows, for the active notebook's kernel, the
 * running %%budget cell's time left and most used limit and the kernel's background jobs; and
 * a Budgets panel in the left sidebar with every job and notebook run of the store.
 */
import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';
import { Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { BudgetsPanel, PANEL_ID } from './panel';
import { IStatus, KernelStatus } from './status';

const PLUGIN_ID = 'nbbudget:plugin';

const budgetsIcon = new LabIcon({
  name: 'nbbudget:budgets',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24">' +
    '<g class="jp-icon3" fill="#616161">' +
    '<path d="M12 3a9 9 0 1 0 9 9h-2a7 7 0 1 1-7-7V3z"/>' +
    '<path d="M12 7a1 1 0 0 1 1 1v3.6l3.2 1.9-1 1.7L11 12.8V8a1 1 0 0 1 1-1z"/>' +
    '<path d="M14 3.3A9 9 0 0 1 20.7 10h-2.1A7 7 0 0 0 14 5.4z"/></g></svg>'
});

/** What the status bar shows for a state: the running cell's label, the background jobs. */
function statusText(status: IStatus | null): string {
  if (!status) {
    return '';
  }
  const parts: string[] = [];
  if (status.running && status.label) {
    parts.push(status.label);
  }
  if (status.jobs > 0) {
    parts.push(`${status.jobs} background job${status.jobs === 1 ? '' : 's'}`);
  }
  return parts.join(' · ');
}

class StatusItem extends Widget {
  constructor(
    private _status: KernelStatus,
    onClick: () => void
  ) {
    super({ node: document.createElement('span') });
    this.addClass('jp-StatusBar-TextItem'); // the status bar's font and line, as its neighbours
    this.addClass('nbb-StatusItem');
    this.node.title = 'nbbudget: the running cell and the background jobs (click for Budgets)';
    this.node.addEventListener('click', onClick);
    this._status.changed.connect(this._update, this);
    this._update();
  }

  dispose(): void {
    this._status.changed.disconnect(this._update, this);
    super.dispose();
  }

  private _update(): void {
    const status = this._status.status;
    this.node.textContent = statusText(status);
    this.node.dataset.running = String(!!status?.running);
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'The running budgeted cell in the status bar, and the Budgets panel of jobs and runs.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar, ISettingRegistry, ILabShell],
  activate: (
    app: JupyterFrontEnd,
    notebooks: INotebookTracker,
    statusBar: IStatusBar | null,
    settingRegistry: ISettingRegistry | null,
    labShell: ILabShell | null
  ) => {
    const status = new KernelStatus(500);
    let showStatus = true;
    // whether the status item is shown may change with the kernel's state, the active tab
    // and the settings
    const visibility = new Signal<object, void>(status);
    status.changed.connect(() => visibility.emit());
    labShell?.currentChanged.connect(() => visibility.emit());

    const panel = new BudgetsPanel(status, path => {
      void app.commands.execute('docmanager:open', { path });
    });
    panel.title.icon = budgetsIcon;
    app.shell.add(panel, 'left', { rank: 900 });

    // Only the active notebook is followed: one comm at a time, whatever is open.
    const follow = () => status.follow(notebooks.currentWidget);
    notebooks.currentChanged.connect(follow);
    follow();

    if (statusBar) {
      const item = new StatusItem(status, () => app.shell.activateById(PANEL_ID));
      statusBar.registerStatusItem(PLUGIN_ID, {
        item,
        align: 'left',
        rank: 4,
        isActive: () =>
          showStatus &&
          !!labShell?.currentWidget &&
          labShell.currentWidget === notebooks.currentWidget &&
          statusText(status.status) !== '',
        activeStateChanged: visibility
      });
    }

    if (settingRegistry) {
      void settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          const apply = () => {
            showStatus = settings.get('showStatusItem').composite as boolean;
            status.intervalMs = settings.get('statusIntervalMs').composite as number;
            panel.refreshIntervalMs = settings.get('refreshIntervalMs').composite as number;
            visibility.emit();
          };
          apply();
          settings.changed.connect(apply);
        })
        .catch(reason => {
          console.error('nbbudget: the settings could not be loaded', reason);
        });
    }
  }
};

export default plugin;
