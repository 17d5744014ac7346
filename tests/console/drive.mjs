// Drives Inlet's web console in real headless Chromium (tests/console.rs starts Inlet
// and the target, then runs this). Every check throws on failure; the process exits
// non-zero and leaves a screenshot of the page it failed on.
//
// Environment (all required): INLET_CONSOLE_NODE_MODULES (where playwright-core is),
// BASE (http://127.0.0.1:PORT), OPS_TOKEN, VIEWER_TOKEN, ROUTE, GROUP_TEXT (text of the
// failure group to requeue), EXPECT_GROUP (its size), OTHER_GROUP_TEXT, EXPECT_PARKED
// (parked entries of the route before the repair), EXPECT_DONE (DONE entries after it),
// RATE (entries per second for the job), ARTIFACTS (folder for the screenshots).

import { createRequire } from 'node:module';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

function env(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set (tests/console.rs sets it)`);
  return v;
}

const require = createRequire(import.meta.url);
const { chromium } = require(join(env('INLET_CONSOLE_NODE_MODULES'), 'playwright-core'));

const BASE = env('BASE');
const ROUTE = env('ROUTE');
const ARTIFACTS = env('ARTIFACTS');
const WAIT_MS = 90_000;

function check(ok, what) {
  if (!ok) throw new Error(`check failed: ${what}`);
  console.log(`ok: ${what}`);
}

async function text(page, selector) {
  return (await page.locator(selector).first().innerText()).trim();
}

// Reloads `url` until `ready(page)` holds, at most WAIT_MS.
async function pollPage(page, url, what, ready) {
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    await page.goto(url);
    if (await ready(page)) return;
    if (Date.now() > deadline) throw new Error(`timed out after ${WAIT_MS} ms waiting for ${what}`);
    await page.waitForTimeout(300);
  }
}

async function signIn(page, token) {
  await page.goto(`${BASE}/console`);
  check(new URL(page.url()).pathname === '/console/login', 'an anonymous visit is sent to the sign-in page');
  await page.fill('input[name=token]', token);
  await Promise.all([page.waitForURL(`${BASE}/console`), page.click('#sign-in')]);
}

async function shot(page, name) {
  const path = join(ARTIFACTS, `console-${name}.png`);
  await page.screenshot({ path, fullPage: true });
  console.log(`screenshot: ${path}`);
}

// Forms and buttons that change something (every write form has class "write"; the
// only other POST form is signing out).
async function writeControls(page) {
  return page.evaluate(() => {
    const writes = document.querySelectorAll('form.write, button.write').length;
    const posts = [...document.querySelectorAll('form')]
      .filter((f) => f.method.toLowerCase() === 'post' && new URL(f.action).pathname !== '/console/logout').length;
    return writes + posts;
  });
}

const userDataDir = mkdtempSync(join(tmpdir(), 'inlet-console-chromium-'));
const context = await chromium.launchPersistentContext(userDataDir, {
  executablePath: process.env.INLET_CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: [
    '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
  ],
  viewport: { width: 1440, height: 900 },
});
context.setDefaultTimeout(30_000);
const page = context.pages()[0] ?? (await context.newPage());
let failed = false;
try {
  // --- an operator --------------------------------------------------------------
  await signIn(page, env('OPS_TOKEN'));
  const row = page.locator(`tr[data-route="${ROUTE}"]`);
  check((await row.count()) === 1, `the overview lists route ${ROUTE}`);
  check((await row.locator('td.parked-count').innerText()).trim() === env('EXPECT_PARKED'),
    `the overview shows ${env('EXPECT_PARKED')} parked entries`);
  check((await row.locator('svg.spark').count()) === 1, 'the overview draws a throughput sparkline');
  check((await row.locator('button.write', { hasText: 'Pause' }).count()) === 1, 'an operator sees the pause button');

  await page.click('nav >> text=Failures');
  const groups = page.locator('tr.group');
  check((await groups.count()) === 2, 'two failure groups are listed');
  const group = groups.filter({ hasText: env('GROUP_TEXT') });
  check((await group.count()) === 1, `one group matches "${env('GROUP_TEXT')}"`);
  check((await group.locator('td.num').first().innerText()).trim() === env('EXPECT_GROUP'),
    `the group counts ${env('EXPECT_GROUP')} parked entries`);
  await shot(page, 'failures');
  await Promise.all([page.waitForURL(/\/console\/entries\?/), group.locator('a.group-link').click()]);
  check(await text(page, '#match-total') === env('EXPECT_GROUP'), 'the group opens on its entries');

  await page.selectOption('#bulk-action', 'requeue');
  await page.fill('form.bulk input[name=rate]', env('RATE'));
  await Promise.all([page.waitForURL(`${BASE}/console/repairs`), page.click('#preview')]);
  check(await text(page, '#dry-run-count') === env('EXPECT_GROUP'), `the dry run shows ${env('EXPECT_GROUP')} entries`);
  check((await text(page, 'p.preview')).includes('nothing has moved'), 'the dry run says nothing moved');
  await shot(page, 'preview');

  await page.click('#confirm');
  await page.locator('p.notice').waitFor();
  check((await text(page, 'p.notice')).includes('started'), 'the job is reported started');
  check((await page.locator('tr.job').count()) >= 1, 'the job is listed');

  await pollPage(page, `${BASE}/console/failures`, 'the requeued group to be gone', async (p) =>
    (await p.locator('tr.group').filter({ hasText: env('GROUP_TEXT') }).count()) === 0);
  check((await page.locator('tr.group').filter({ hasText: env('OTHER_GROUP_TEXT') }).count()) === 1,
    'the other group is untouched');
  await pollPage(page, `${BASE}/console/entries?route=${encodeURIComponent(ROUTE)}&status=done`, 'the entries delivered',
    async (p) => (await text(p, '#match-total')) === env('EXPECT_DONE'));
  console.log(`ok: ${env('EXPECT_DONE')} entries DONE`);
  await pollPage(page, `${BASE}/console/repairs`, 'the job to finish', async (p) =>
    (await p.locator('tr.job[data-state="done"]').count()) === 1);
  await page.goto(`${BASE}/console`);
  await shot(page, 'overview');
  const firstDone = page.locator('tr.entry a').first();
  await page.goto(`${BASE}/console/entries?route=${encodeURIComponent(ROUTE)}&status=done`);
  await firstDone.click();
  check((await page.locator('tr.attempt').count()) >= 1, 'an entry shows its attempt history');
  check((await page.locator('section.payload-views').count()) >= 1, 'an entry shows its payload views');
  check((await page.locator('script').count()) === 0, 'markup from the message runs nowhere: the page has no script');
  check((await page.locator('table.facts code', { hasText: '<script>alert(1)</script>' }).count()) === 1,
    'the attribute with markup is shown as text');
  await shot(page, 'entry');

  await Promise.all([page.waitForURL(`${BASE}/console/login`), page.click('text=Sign out')]);
  await page.goto(`${BASE}/console`);
  check(new URL(page.url()).pathname === '/console/login', 'signing out ends the session');

  // --- a viewer -------------------------------------------------------------------
  await signIn(page, env('VIEWER_TOKEN'));
  const other = `${BASE}/console/entries?route=${encodeURIComponent(ROUTE)}&status=parked`;
  for (const url of [`${BASE}/console`, `${BASE}/console/failures`, other, `${BASE}/console/repairs`]) {
    await page.goto(url);
    check((await writeControls(page)) === 0, `a viewer sees no write buttons on ${new URL(url).pathname}`);
  }
  await page.goto(other);
  await page.locator('tr.entry a').first().click();
  check((await writeControls(page)) === 0, 'a viewer sees no write buttons on an entry');
  await page.goto(`${BASE}/console`);
  const csrf = await page.locator('form[action="/console/logout"] input[name=csrf]').inputValue();
  check(csrf.length === 64, 'the viewer has a CSRF token');
  const forged = await page.evaluate(async ({ csrf, route }) => {
    const post = async (path, fields) => {
      const r = await fetch(path, {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams(fields),
      });
      return { status: r.status, body: await r.text() };
    };
    return {
      pause: await post(`/console/routes/${encodeURIComponent(route)}/pause`, { csrf, reason: 'forged' }),
      repair: await post('/console/repairs', { csrf, step: 'start', action: 'ignore', route, reason: 'forged' }),
      noCsrf: await post(`/console/routes/${encodeURIComponent(route)}/pause`, { reason: 'forged' }),
    };
  }, { csrf, route: ROUTE });
  check(forged.pause.status === 403, `a viewer's forged pause with a valid CSRF token is refused (${forged.pause.status})`);
  check(forged.pause.body.includes('needs the operator role'), 'the refusal says why');
  check(forged.repair.status === 403, `a viewer's forged repair with a valid CSRF token is refused (${forged.repair.status})`);
  check(forged.noCsrf.status === 403, `a POST without the CSRF token is refused (${forged.noCsrf.status})`);
  await shot(page, 'viewer');
} catch (e) {
  failed = true;
  console.error(`FAILED at ${page.url()}: ${e.stack || e}`);
  try { await shot(page, 'failure'); } catch (_) { /* the page may be gone */ }
} finally {
  await context.close();
  rmSync(userDataDir, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
