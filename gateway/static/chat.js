// The chat: history, live messages of every channel, the reply streaming in, the working
// indicator, sending with a visible error and a retry, draft cards to edit, send or discard, and
// the calendar's suggestion cards to accept or dismiss.
"use strict";
(() => {
  const log = document.getElementById("log");
  const box = document.getElementById("text");
  const limit = document.getElementById("limit");
  const working = document.getElementById("working");
  const status = document.getElementById("status");
  const MAX = Number(log.dataset.maxChars);
  const shown = new Set();
  const streams = new Map(); // turn_id -> the bubble its reply streams into
  const finished = new Set(); // turns whose reply was recorded: late deltas are dropped
  const drafts = new Map(); // "kind:id" -> card element
  let lastId = 0;

  const scroll = () => { log.scrollTop = log.scrollHeight; };
  const el = (tag, cls, text) => {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  };

  function bubble(direction, plain) {
    const div = el("div", "msg " + direction + (plain ? " plain" : ""));
    div.appendChild(el("div", "body"));
    div.appendChild(el("div", "meta"));
    return div;
  }

  function render(m) {
    if (shown.has(m.id)) return;
    shown.add(m.id);
    lastId = Math.max(lastId, m.id);
    const pending = log.querySelector(`.msg[data-pending-id="${m.id}"]`);
    if (pending) pending.remove();
    const div = bubble(m.direction, !m.html);
    div.dataset.id = m.id;
    div.dataset.channel = m.channel;
    // Replies come as HTML the server rendered from Markdown and sanitised; the person's words as text.
    if (m.html) div.querySelector(".body").innerHTML = m.html;
    else div.querySelector(".body").textContent = m.body;
    const meta = div.querySelector(".meta");
    meta.appendChild(el("span", "channel", m.channel));
    meta.appendChild(document.createTextNode(" · " + new Date(m.created_at).toLocaleString()));
    if (m.direction === "outbound" && m.turn_id) {
      finished.add(m.turn_id);
      const streaming = streams.get(m.turn_id);
      if (streaming) { streaming.replaceWith(div); streams.delete(m.turn_id); } else log.appendChild(div);
      working.hidden = true;
    } else {
      log.appendChild(div);
    }
    scroll();
    // A reply is delivered once it is on screen: tell the server, which commits its staged writes.
    if (m.direction === "outbound" && m.channel === "web") {
      Pepper.request("POST", `/api/messages/${m.id}/ack`);
      loadDrafts();
    }
  }

  function streamInto(turnId) {
    let div = streams.get(turnId);
    if (!div) {
      div = bubble("outbound streaming", true);
      div.dataset.turn = turnId;
      div.querySelector(".meta").textContent = "writing…";
      streams.set(turnId, div);
      log.appendChild(div);
    }
    return div;
  }

  function delta(d) {
    if (finished.has(d.turn_id)) return;
    const div = streamInto(d.turn_id);
    div.querySelector(".body").appendChild(document.createTextNode(d.text));
    working.hidden = true;
    scroll();
  }

  function workingOn(w) {
    if (finished.has(w.turn_id)) return;
    const div = streams.get(w.turn_id);
    if (div) { div.remove(); streams.delete(w.turn_id); } // text before a tool call is not the reply
    working.textContent = `Working: ${w.label}…`;
    working.dataset.tool = w.tool;
    working.hidden = false;
    scroll();
  }

  // --- sending ---------------------------------------------------------------------------------
  function showLimit() {
    const n = box.value.trim().length;
    const over = n > MAX;
    limit.classList.toggle("over", over);
    limit.textContent = over
      ? `Too long: ${n} characters; a message has at most ${MAX}. Shorten it or split it in two.`
      : `${n} / ${MAX} characters`;
    return !over;
  }

  async function send(text, clientId, div) {
    div.classList.remove("failed");
    div.querySelector(".meta").textContent = "sending…";
    const answer = await Pepper.request("POST", "/api/messages", { text, client_id: clientId });
    if (answer.ok) {
      const id = answer.data.message_id;
      if (shown.has(id)) div.remove();
      else { div.dataset.pendingId = id; div.querySelector(".meta").textContent = "sent"; }
      return;
    }
    div.classList.add("failed");
    const meta = div.querySelector(".meta");
    meta.textContent = "";
    meta.appendChild(el("span", "error", "Not sent: " + (answer.data.message || `the server answered ${answer.status}`) + " "));
    const retry = el("button", "secondary retry", "Retry");
    retry.type = "button";
    retry.addEventListener("click", () => send(text, clientId, div));
    meta.appendChild(retry);
  }

  document.getElementById("send").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = box.value.trim();
    if (!text) return;
    if (!showLimit()) { box.focus(); return; } // it stays in the box
    box.value = "";
    showLimit();
    const div = bubble("inbound", true);
    div.querySelector(".body").textContent = text;
    log.appendChild(div);
    scroll();
    send(text, crypto.randomUUID(), div);
  });
  box.addEventListener("input", showLimit);
  box.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); document.getElementById("send").requestSubmit(); }
  });

  // --- draft cards -----------------------------------------------------------------------------
  function field(card, name, label, value, multiline) {
    const wrap = el("div");
    const id = `${card.dataset.key}-${name}`;
    const lab = el("label", "", label);
    lab.htmlFor = id;
    const input = el(multiline ? "textarea" : "input");
    input.id = id;
    input.name = name;
    input.value = value;
    if (multiline) input.rows = 6;
    wrap.append(lab, input);
    return wrap;
  }

  function draftCard(d) {
    const key = `${d.kind}:${d.id}`;
    const card = el("div", "msg card draft");
    card.dataset.key = key.replace(":", "-");
    card.dataset.draft = d.id;
    card.appendChild(el("h3", "", d.title));
    const fields = el("div", "fields");
    const show = [["From", d.from], ["To", d.to.join(", ")], ["Cc", d.cc.join(", ")], ["Subject", d.subject]];
    for (const [name, value] of show) {
      if (!value) continue;
      fields.append(el("span", "muted", name), el("span", "value " + name.toLowerCase(), value));
    }
    card.appendChild(fields);
    card.appendChild(el("pre", "draft-body", d.body));
    const editor = el("form", "editor");
    editor.hidden = true;
    editor.append(
      field(card, "to", "To (comma-separated)", d.to.join(", ")),
      field(card, "cc", "Cc", d.cc.join(", ")),
      field(card, "subject", "Subject", d.subject),
      field(card, "body", "Text", d.body, true),
    );
    card.appendChild(editor);
    const result = el("p", "result");
    result.hidden = true;
    const actions = el("div", "actions");
    const button = (label, cls, handler) => {
      const b = el("button", cls, label);
      b.type = "button";
      b.addEventListener("click", handler);
      actions.appendChild(b);
      return b;
    };
    const done = (answer, gone) => {
      result.hidden = false;
      result.className = "result " + (answer.ok ? "ok" : "error");
      result.textContent = answer.data.message || (answer.ok ? "Done." : "That did not work.");
      if (answer.ok && gone) { actions.remove(); editor.remove(); drafts.delete(key); }
    };
    const edit = button("Edit", "secondary edit", () => {
      editor.hidden = !editor.hidden;
      save.hidden = editor.hidden;
    });
    const save = button("Save", "save", async () => {
      const split = (s) => s.split(",").map((a) => a.trim()).filter(Boolean);
      const body = {
        to: split(editor.elements.to.value), cc: split(editor.elements.cc.value),
        subject: editor.elements.subject.value, body: editor.elements.body.value,
      };
      const answer = await Pepper.request("POST", `/api/drafts/${d.kind}/${d.id}/edit`, body);
      done(answer, false);
      if (answer.ok) { const fresh = draftCard(answer.data.draft); card.replaceWith(fresh); drafts.set(key, fresh); }
    });
    save.hidden = true;
    button("Send", "send", async () => done(await Pepper.request("POST", `/api/drafts/${d.kind}/${d.id}/send`, {}), true));
    button("Discard", "danger discard", async () => done(await Pepper.request("POST", `/api/drafts/${d.kind}/${d.id}/discard`, {}), true));
    void edit;
    card.append(actions, result);
    return card;
  }

  async function loadDrafts() {
    const answer = await Pepper.request("GET", "/api/drafts");
    if (!answer.ok) return;
    for (const d of answer.data.drafts) {
      const key = `${d.kind}:${d.id}`;
      if (drafts.has(key)) continue;
      const card = draftCard(d);
      drafts.set(key, card);
      log.appendChild(card);
    }
    scroll();
  }

  // --- suggestion cards: the calendar's suggestions (approvals of kind "suggestion") ------------
  function suggestionCard(item) {
    const key = `suggestion:${item.id}`;
    const card = el("div", "msg card suggestion");
    card.dataset.suggestion = item.id;
    card.appendChild(el("h3", "", item.title));
    card.appendChild(el("pre", "draft-body", item.detail));
    const result = el("p", "result");
    result.hidden = true;
    const actions = el("div", "actions");
    for (const [label, cls, decision] of [[item.approve_label, "accept", "approve"], [item.reject_label, "secondary dismiss", "reject"]]) {
      const b = el("button", cls, label);
      b.type = "button";
      b.addEventListener("click", async () => {
        const answer = await Pepper.request("POST", `/api/approvals/suggestion/${encodeURIComponent(item.id)}/${decision}`, {});
        result.hidden = false;
        result.className = "result " + (answer.ok ? "ok" : "error");
        result.textContent = answer.data.message || (answer.ok ? "Done." : "That did not work.");
        if (answer.ok) { actions.remove(); drafts.delete(key); }
      });
      actions.appendChild(b);
    }
    card.append(actions, result);
    return card;
  }

  async function loadSuggestions() {
    const answer = await Pepper.request("GET", "/api/approvals");
    if (!answer.ok) return;
    for (const item of answer.data.approvals) {
      const key = `suggestion:${item.id}`;
      if (item.kind !== "suggestion" || drafts.has(key)) continue;
      const card = suggestionCard(item);
      drafts.set(key, card);
      log.appendChild(card);
    }
    scroll();
  }

  // --- start -----------------------------------------------------------------------------------
  async function start() {
    showLimit();
    const history = await Pepper.request("GET", "/api/messages?limit=200");
    if (history.ok) history.data.messages.forEach(render);
    await loadDrafts();
    await loadSuggestions();
    const source = new EventSource(`/api/events?after=${lastId}&progress=1`);
    source.addEventListener("message", (e) => render(JSON.parse(e.data)));
    source.addEventListener("delta", (e) => delta(JSON.parse(e.data)));
    source.addEventListener("working", (e) => workingOn(JSON.parse(e.data)));
    source.onopen = () => { status.textContent = "connected"; };
    source.onerror = () => { status.textContent = "reconnecting…"; };
  }
  start();
})();
