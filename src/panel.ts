/**
 * The Budgets panel of the left sidebar: every job and notebook run of the store (this kernel's,
 * other kernels', `nbbudget run`'s), read from the server extension while the panel is shown,
 * with Cancel on each running one and Open output on a run's saved notebook; and, on top, the
 * figures of the cell running now in the active notebook's kernel, from its status comm.
 */
import { Widget } from '@lumino/widgets';
import { Message } from '@lumino/messaging';

import { cancelJob, IRow, listJobs, RequestError } from './api';
import { KernelStatus } from './status';

/** The panel's id in the shell (a click on the status item activates it). */
export const PANEL_ID = 'nbbudget-budgets';

export class BudgetsPanel extends Widget {
  constructor(
    private _status: KernelStatus,
    private _open: (path: string) => void
  ) {
    super();
    this.id = PANEL_ID;
    this.addClass('nbb-Panel');
    this.title.caption = 'Budgets: jobs and notebook runs of nbbudget';
    this.node.innerHTML = `
      <header class="nbb-Panel-header"><h2>Budgets</h2>
        <button class="jp-Button nbb-Panel-refresh" title="Read the store again">Refresh</button>
      </header>
      <div class="nbb-Panel-live" hidden></div>
      <div class="nbb-Panel-message" role="status"></div>
      <div class="nbb-Panel-list" role="list"></div>
      <p class="nbb-Panel-empty" hidden>No jobs or notebook runs in the store.</p>`;
    this.node
      .querySelector('.nbb-Panel-refresh')!
      .addEventListener('click', () => void this.refresh());
    this._status.changed.connect(this._onStatus, this);
  }

  /** How often the store is read while the panel is shown. */
  set refreshIntervalMs(value: number) {
    this._intervalMs = value;
    if (this._timer !== null) {
      this._stopTimer();
      this._startTimer();
    }
  }

  /** Read the store's jobs and runs from the server and show them. */
  async refresh(): Promise<void> {
    if (this._loading) {
      return;
    }
    this._loading = true;
    try {
      this._rows = await listJobs();
      this._error = null;
    } catch (error) {
      this._error =
        error instanceof RequestError ? error.message : String(error);
    } finally {
      this._loading = false;
    }
    this._render();
  }

  protected onAfterShow(msg: Message): void {
    void this.refresh();
    this._startTimer();
  }

  protected onAfterHide(msg: Message): void {
    this._stopTimer();
  }

  dispose(): void {
    this._stopTimer();
    this._status.changed.disconnect(this._onStatus, this);
    super.dispose();
  }

  private _startTimer(): void {
    if (this._timer === null) {
      this._timer = window.setInterval(() => void this.refresh(), this._intervalMs);
    }
  }

  private _stopTimer(): void {
    if (this._timer !== null) {
      window.clearInterval(this._timer);
      this._timer = null;
    }
  }

  private _onStatus(): void {
    const status = this._status.status;
    const live = this.node.querySelector('.nbb-Panel-live') as HTMLElement;
    if (status && status.running) {
      live.hidden = false;
      live.textContent = `Running in this notebook: ${status.name ?? 'a budgeted cell'}, ${status.label}`;
    } else {
      live.hidden = true;
      live.textContent = '';
    }
    const jobs = status ? status.jobs : null;
    if (jobs !== this._jobs) {
      this._jobs = jobs;
      if (this.isVisible) {
        void this.refresh(); // a job of this kernel started or ended
      }
    }
  }

  private _render(): void {
    const message = this.node.querySelector('.nbb-Panel-message') as HTMLElement;
    if (this._error !== null) {
      message.textContent = this._error;
      message.dataset.kind = 'error';
    } else if (message.dataset.kind === 'error') {
      message.textContent = '';
      delete message.dataset.kind;
    }
    const body = this.node.querySelector('.nbb-Panel-list')!;
    body.replaceChildren(...this._rows.map(row => this._row(row)));
    (this.node.querySelector('.nbb-Panel-empty') as HTMLElement).hidden =
      this._rows.length > 0 || this._error !== null;
  }

  /** One job or run: its state and name, where it runs and when, then what can be done. */
  private _row(row: IRow): HTMLElement {
    const item = document.createElement('div');
    item.className = 'nbb-Panel-row';
    item.setAttribute('role', 'listitem');
    item.dataset.id = row.id;
    item.dataset.kind = row.kind;
    item.dataset.state = row.state;
    const mine = row.kernel !== null && row.kernel === this._status.kernelId;
    // its id, as %budget jobs, nb.jobs[...] and `nbbudget cancel` name it
    const cells = row.cells ? `, ${row.executed ?? 0} of ${row.cells} cells run` : '';
    const where =
      row.kind === 'run'
        ? `notebook run ${row.id}${cells}`
        : mine
          ? `job ${row.id} of this kernel`
          : row.kernel
            ? `job ${row.id} of another kernel`
            : `job ${row.id} of process ${row.pid ?? '?'}`;
    const head = document.createElement('div');
    head.className = 'nbb-Panel-head';
    head.append(
      this._span(row.state, 'nbb-Panel-state'),
      this._span(basename(row.name), 'nbb-Panel-name', `${row.id}: ${row.name}`)
    );
    const actions = document.createElement('span');
    actions.className = 'nbb-Panel-actions';
    if (row.cancellable) {
      actions.append(this._button('Cancel', 'nbb-Panel-cancel', () => void this._cancel(row)));
    }
    if (row.output_path) {
      const path = row.output_path;
      actions.append(this._button('Open output', 'nbb-Panel-open', () => this._open(path)));
    }
    const facts = [where, `started ${clock(row.started)}`];
    if (row.elapsed_s !== null) {
      facts.push(seconds(row.elapsed_s));
    }
    if (row.heartbeat) {
      facts.push(`heartbeat ${clock(row.heartbeat)}`);
    }
    const detail = this._span(facts.join(' · '), 'nbb-Panel-detail');
    item.append(head, detail);
    if (row.error) {
      // a cancel (a person's, or the wall clock they set) says why it stopped: no error
      item.append(
        row.state === 'cancelled'
          ? this._span(row.error.replace(/^nbbudget\.Cancelled: /, ''), 'nbb-Panel-note')
          : this._span(row.error, 'nbb-Panel-error')
      );
    }
    if (actions.childElementCount) {
      item.append(actions);
    }
    return item;
  }

  private async _cancel(row: IRow): Promise<void> {
    const message = this.node.querySelector('.nbb-Panel-message') as HTMLElement;
    message.textContent = `cancelling ${row.id}...`;
    message.dataset.kind = 'info';
    try {
      const answer = await cancelJob(row.id);
      message.textContent = answer.message;
      message.dataset.outcome = answer.outcome;
      message.dataset.kind = 'info';
    } catch (error) {
      message.textContent = error instanceof RequestError ? error.message : String(error);
      message.dataset.kind = 'error';
    }
    await this.refresh();
  }

  private _span(text: string, className: string, title = ''): HTMLSpanElement {
    const span = document.createElement('span');
    span.className = className;
    span.textContent = text;
    if (title) {
      span.title = title;
    }
    return span;
  }

  private _button(label: string, className: string, onClick: () => void): HTMLButtonElement {
    const button = document.createElement('button');
    button.className = `jp-Button ${className}`;
    button.textContent = label;
    button.addEventListener('click', onClick);
    return button;
  }

  private _rows: IRow[] = [];
  private _error: string | null = null;
  private _loading = false;
  private _jobs: number | null = null;
  private _timer: number | null = null;
  private _intervalMs = 2000;
}

function basename(path: string): string {
  return path.split(/[\\/]/).pop() || path;
}

/** An ISO time of the server as the reader's local clock time. */
function clock(iso: string | null): string {
  if (!iso) {
    return '';
  }
  const when = new Date(iso);
  return isNaN(when.getTime()) ? iso : when.toLocaleTimeString();
}

function seconds(value: number): string {
  if (value < 60) {
    return `${value.toFixed(1)} s`;
  }
  const minutes = Math.floor(value / 60);
  return minutes < 60
    ? `${minutes} min ${Math.round(value % 60)} s`
    : `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}
