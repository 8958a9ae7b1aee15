// fence's dashboard: sign-in, navigation (hash routes) and the pages.
import * as api from './api.js';
import { el, set } from './dom.js';
import { pages } from './pages.js';
import { sandboxPage } from './sandbox.js';

const $ = (id) => document.getElementById(id);
let current = null; // AbortController of the page shown

function signedOut(msg) {
  if (current) current.abort();
  current = null;
  api.setSession(null);
  $('nav').hidden = true;
  $('logout').hidden = true;
  set($('who'));
  set($('page'));
  $('login').hidden = false;
  set($('login-error'), msg || '');
  $('apikey').focus();
}

function signedIn(s) {
  api.setSession(s, () => signedOut('Your session ended: sign in again.'));
  $('login').hidden = true;
  $('nav').hidden = false;
  $('logout').hidden = false;
  set($('who'), `team ${s.team}${s.admin ? ' (admin)' : ''} · key ${s.keyID}`);
  if (!location.hash || location.hash === '#/') location.hash = '#/sandboxes';
  else route();
}

async function route() {
  if ($('nav').hidden) return;
  if (current) current.abort();
  current = new AbortController();
  const hash = location.hash.replace(/^#\/?/, '') || 'sandboxes';
  const [name, ...rest] = hash.split('/');
  for (const a of document.querySelectorAll('#nav a')) {
    if (a.getAttribute('href') === '#/' + name) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  const page = $('page');
  set(page);
  const render = name === 'sandbox' ? sandboxPage : pages[name];
  if (!render) {
    set(page, el('h1', {}, 'Not found'));
    return;
  }
  try {
    await render(page, current.signal, rest.map(decodeURIComponent));
  } catch (e) {
    if (!current.signal.aborted) page.append(el('p', { className: 'error', role: 'alert' }, e.message));
  }
}

window.addEventListener('hashchange', route);

document.addEventListener('DOMContentLoaded', async () => {
  $('login-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    try {
      const s = await api.login($('apikey').value);
      $('apikey').value = '';
      signedIn(s);
    } catch (e) {
      set($('login-error'), e.message);
    }
  });
  $('logout').addEventListener('click', async () => {
    try { await api.logout(); } catch { /* signed out either way */ }
    signedOut('Signed out.');
  });
  try {
    signedIn(await api.session());
  } catch {
    signedOut('');
  }
});
