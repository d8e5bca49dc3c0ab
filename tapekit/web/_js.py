"""The JavaScript the browser environment runs in its pages (tapekit's own; no BrowserGym code).

- :data:`TIMER_TRACKER` (an init script, run before the page's own scripts) keeps the page's
  pending short ``setTimeout`` callbacks and when each is due, so the environment can wait
  until a page has settled instead of sleeping a fixed time after every action.
- :data:`SETTLE_AND_MARK` waits for that (bounded), then gives every element of a standard HTML
  tag a ``bid`` attribute, numbering them in document order (the elements of an open shadow root
  right after its host; frames get letters, ``a``, ``b``, ...) with a per-page counter, so bids
  stay stable across steps and equal BrowserGym's for the same page (its marking script, run on
  the same pages, gives the same bids: tests/web/test_browsergym_equivalence.py).
- :data:`ELEMENT_INFO` describes an action's element for the task's ``effect`` (read only for
  tasks that declare effects).
"""

from __future__ import annotations

# The standard HTML elements (https://html.spec.whatwg.org/ plus legacy ones): only these get a
# bid, which keeps SVG internals and custom elements out, as BrowserGym's "standard_html" does.
HTML_TAGS = (
    "a abbr acronym address applet area article aside audio b base basefont bdi bdo big blockquote "
    "body br button canvas caption center cite code col colgroup data datalist dd del details dfn "
    "dialog dir div dl dt em embed fieldset figcaption figure font footer form frame frameset h1 h2 "
    "h3 h4 h5 h6 head header hgroup hr html i iframe img input ins kbd label legend li link main map "
    "mark menu meta meter nav noframes noscript object ol optgroup option output p param picture pre "
    "progress q rp rt ruby s samp script search section select small source span strike strong style "
    "sub summary sup svg table tbody td template textarea tfoot th thead time title tr track tt u ul "
    "var video wbr"
)

# Short timeouts (<= 1 s) are what a page uses to update itself after an event (an autocomplete's
# search delay, a menu's fade); longer ones are task clocks, and intervals are never "pending".
TIMER_TRACKER = r"""
(() => {
  if (window.__tk_timers) return;
  const pending = new Map();  // timer id -> when it is due (performance.now() ms)
  const setT = window.setTimeout.bind(window);
  const clearT = window.clearTimeout.bind(window);
  Object.defineProperty(window, '__tk_timers', {value: pending});
  Object.defineProperty(window, '__tk_setTimeout', {value: setT});
  window.setTimeout = function (fn, delay, ...args) {
    const ms = Number(delay) || 0;
    if (typeof fn !== 'function' || ms > 1000) return setT(fn, delay, ...args);
    const id = setT(function () { pending.delete(id); return fn.apply(this, arguments); }, delay, ...args);
    pending.set(id, performance.now() + ms);
    return id;
  };
  window.clearTimeout = function (id) { pending.delete(id); return clearT(id); };
})();
"""

SETTLE_AND_MARK = r"""
async ([maxMs, tagList]) => {
  const t0 = performance.now();
  const sleep = (ms) => new Promise((r) => (window.__tk_setTimeout || setTimeout)(r, ms));
  const frame = () => new Promise((r) => requestAnimationFrame(() => r()));
  // busy: a short timer due within maxMs of now is still pending (it may fire late on a loaded
  // machine: it is waited for all the same, up to 4 x maxMs), or an animation runs (up to maxMs)
  const busy = () => {
    const now = performance.now();
    if (window.__tk_timers) {
      for (const due of window.__tk_timers.values()) if (due <= t0 + maxMs) return true;
    }
    if (now - t0 >= maxMs) return false;
    if (window.jQuery && window.jQuery.timers && window.jQuery.timers.length > 0) return true;
    const running = (a) => a.playState === 'running';
    if (document.getAnimations && document.getAnimations().some(running)) return true;
    return false;
  };
  await Promise.race([frame(), sleep(50)]);
  while (busy() && performance.now() - t0 < 4 * maxMs) {
    await sleep(10);
  }
  const settled = !busy();
  const waited = performance.now() - t0;
  if (!window.__tk_tags) window.__tk_tags = new Set(tagList.split(' '));
  if (window.__tk_next_bid === undefined) window.__tk_next_bid = 0;
  if (window.__tk_next_frame === undefined) window.__tk_next_frame = [0];
  // BrowserGym's frame ids: a, b, ..., z, aA, aB, ... (the first letter lower case)
  const frameId = () => {
    const digits = window.__tk_next_frame;
    const chars = 'abcdefghijklmnopqrstuvwxyz';
    const id = digits.map((d, i) => (i < digits.length - 1 ? chars[d].toUpperCase() : chars[d]));
    for (let i = 0; i <= digits.length; i++) {
      if (i === digits.length) { digits.push(0); break; }
      if (++digits[i] < chars.length) break;
      digits[i] = 0;
    }
    return id.reverse().join('');
  };
  const seen = new Set();
  // document order, each open shadow root's elements right after its host (as BrowserGym)
  const elements = Array.from(document.querySelectorAll('*'));
  for (let i = 0; i < elements.length; i++) {
    const el = elements[i];
    if (el.shadowRoot) elements.splice(i + 1, 0, ...el.shadowRoot.querySelectorAll('*'));
    const tag = el.tagName ? el.tagName.toLowerCase() : '';
    if (!window.__tk_tags.has(tag)) continue;
    let bid = el.getAttribute('bid');
    if (bid === null || seen.has(bid)) {  // new, or a copy of a marked element
      // frames take letters and leave the counter alone, as in BrowserGym
      bid = (tag === 'iframe' || tag === 'frame') ? frameId() : String(window.__tk_next_bid++);
      el.setAttribute('bid', bid);
    }
    seen.add(bid);
  }
  return {url: location.href, title: document.title, settled: settled, waited_ms: waited};
}
"""

# What WebTask.effect sees of an action's element (tapekit.web.task.WebElement), read just before
# the action: its tag and type, id, name, text (or value, or label) and its form's action and method.
ELEMENT_INFO = r"""el => {
  const tag = el.tagName.toLowerCase();
  const typed = ['input', 'button', 'select', 'textarea'].includes(tag);
  const form = el.form || el.closest('form');
  const text = (el.innerText || el.value || el.getAttribute('aria-label') || '').trim();
  return {
    tag,
    type: typed ? String(el.type || '').toLowerCase() : '',
    id: el.id || '',
    name: el.getAttribute('name') || '',
    text: text.slice(0, 200),
    form_action: form ? String(form.action || '') : null,
    form_method: form ? String(form.method || 'get').toLowerCase() : null,
  };
}"""
