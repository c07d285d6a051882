// Starts `dsa serve` on a fresh tiny random model (synthetic tokenizer) on a free port of
// 127.0.0.1, for the JavaScript clients' tests; stop() sends SIGTERM and returns the exit code.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export async function startServer(dsa, extra = []) {
  const dir = mkdtempSync(join(tmpdir(), 'dsa-js-serve-'));
  const model = join(dir, 'tiny');
  execFileSync(dsa, ['make-model', '--preset', 'tiny', '--out', model], { stdio: 'ignore' });
  const proc = spawn(dsa, ['serve', '--model', model, '--port', '0', '--ctx', '2048', ...extra], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error('dsa serve did not start:\n' + log)), 60000);
    proc.stderr.on('data', (d) => {
      log += d;
      const m = /http:\/\/127\.0\.0\.1:(\d+)/.exec(log);
      if (m) { clearTimeout(t); resolve(Number(m[1])); }
    });
    proc.on('exit', (c) => reject(new Error('dsa serve exited with ' + c + ':\n' + log)));
  });
  const stop = () => new Promise((resolve) => {
    proc.removeAllListeners('exit');
    proc.on('exit', (code) => { rmSync(dir, { recursive: true, force: true }); resolve(code); });
    proc.kill('SIGTERM');
  });
  return { port, model, stop, url: `http://127.0.0.1:${port}` };
}

export function dsaArg() {
  const i = process.argv.indexOf('--dsa');
  if (i < 0 || !process.argv[i + 1]) throw new Error('usage: node <script> --dsa path/to/dsa');
  return process.argv[i + 1];
}
