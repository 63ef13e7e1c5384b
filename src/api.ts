/**
 * The server extension's REST endpoints (nbbudget.jupyter.server, docs/lab.md): the store's
 * jobs and notebook runs, and a cancel. Requests go through the server connection, which adds
 * the server's token and XSRF header as for any JupyterLab request.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** A job or a notebook run of the store, as GET /nbbudget/jobs gives it. */
export interface IRow {
  id: string;
  kind: 'job' | 'run';
  state: string;
  name: string;
  started: string | null;
  ended: string | null;
  elapsed_s: number | null;
  heartbeat: string | null;
  pid: number | null;
  kernel: string | null;
  error: string | null;
  output: string | null;
  output_path: string | null;
  cancellable: boolean;
  mode?: string;
  cell?: number | null;
  executed?: number | null;
  cells?: number | null;
}

/** What POST /nbbudget/jobs/ID/cancel answers. */
export interface ICancelled {
  id: string;
  kind: 'job' | 'run';
  outcome: 'ended' | 'stopped' | 'finished' | 'requested';
  state: string;
  message: string;
}

/** A refusal of the server: its message and code (store_busy, unknown_id, ...). */
export class RequestError extends Error {
  constructor(
    message: string,
    readonly code: string,
    readonly status: number
  ) {
    super(message);
  }
}

async function request<T>(path: string[], init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'nbbudget', ...path);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new RequestError(
      `the Jupyter server could not be reached: ${error}`,
      'unreachable',
      0
    );
  }
  const text = await response.text();
  let body: any = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!response.ok) {
    if (response.status === 404 && !(body && body.code)) {
      throw new RequestError(
        "the Jupyter server has no nbbudget extension: pip install 'nbbudget[lab]' " +
          'in its environment, then restart it',
        'no_extension',
        404
      );
    }
    throw new RequestError(
      (body && body.message) || `${response.status} ${response.statusText}`,
      (body && body.code) || 'http_error',
      response.status
    );
  }
  return body as T;
}

/** Every job and notebook run of the store, newest first. */
export function listJobs(): Promise<IRow[]> {
  return request<IRow[]>(['jobs']);
}

/** Cancel a job or a run, and hear what happened. */
export function cancelJob(id: string): Promise<ICancelled> {
  return request<ICancelled>(['jobs', encodeURIComponent(id), 'cancel'], {
    method: 'POST'
  });
}
