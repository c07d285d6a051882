// The chat page in a real browser: headless Chromium (Debian's) loads `/`, sends a message
// and the streamed reply appears. The screenshot is kept (--screenshot PATH).
import puppeteer from 'puppeteer-core';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { startServer, dsaArg } from './serve_fixture.mjs';

const i = process.argv.indexOf('--screenshot');
const shot = i >= 0 ? process.argv[i + 1] : 'chat_page.png';
const chrome = ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find(existsSync);
if (!chrome) { console.error('chromium not found: apt-get install chromium'); process.exit(1); }
const srv = await startServer(dsaArg());
let failed = false, browser;
try {
  browser = await puppeteer.launch({ executablePath: chrome, headless: true, args: ['--no-sandbox', '--disable-gpu'] });
  const page = await browser.newPage();
  await page.goto(srv.url + '/', { waitUntil: 'networkidle0' });
  assert.equal(await page.title(), 'dsa chat');
  await page.type('#input', 'Hello there');
  await page.click('#send');
  await page.waitForFunction(() => {
    const a = document.querySelector('.msg.assistant');
    return a && a.textContent.length > 10 && /tok\/s/.test(document.getElementById('speed').textContent);
  }, { timeout: 60000 });
  const reply = await page.$eval('.msg.assistant', (e) => e.textContent);
  assert.ok(!reply.startsWith('error'), reply);
  await page.screenshot({ path: shot });
  console.log('chat page: streamed reply shown (' + reply.length + ' chars), screenshot ' + shot);
} catch (e) {
  failed = true;
  console.error(e);
} finally {
  if (browser) await browser.close();
  const code = await srv.stop();
  if (code !== 0) failed = true;
}
process.exit(failed ? 1 : 0);
