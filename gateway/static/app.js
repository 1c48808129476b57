// What every page shares: the session's CSRF token, JSON requests, sign-out, and action buttons.
// A button with data-post="/api/..." posts (with its data-body JSON, or the fields of its form)
// and shows the answer in the element named by data-result, then reloads when data-reload is set.
"use strict";
const Pepper = (() => {
  const csrf = document.body.dataset.csrf || "";

  async function request(method, url, body) {
    let response;
    try {
      response = await fetch(url, {
        method,
        headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (e) {
      return { ok: false, status: 0, data: { message: "Pepper could not be reached. Check your connection." } };
    }
    let data = {};
    try { data = await response.json(); } catch (e) { data = {}; }
    return { ok: response.ok, status: response.status, data };
  }

  function formBody(form) {
    const body = {};
    for (const field of form.querySelectorAll("[name]")) body[field.name] = field.value;
    return body;
  }

  document.addEventListener("click", async (e) => {
    const button = e.target.closest("button[data-post]");
    if (!button) return;
    e.preventDefault();
    const result = button.dataset.result ? document.getElementById(button.dataset.result) : null;
    const form = button.closest("form");
    const body = button.dataset.body ? JSON.parse(button.dataset.body) : form ? formBody(form) : {};
    button.disabled = true;
    const answer = await request("POST", button.dataset.post, body);
    button.disabled = false;
    if (result) {
      result.hidden = false;
      result.className = answer.ok ? "ok" : "error";
      result.textContent = answer.data.message || (answer.ok ? "Done." : "That did not work.");
    }
    if (answer.ok && button.dataset.reload !== undefined) location.reload();
  });

  const signout = document.getElementById("signout");
  if (signout) {
    signout.addEventListener("click", async () => {
      await request("POST", "/chat/logout");
      location.href = "/";
    });
  }
  return { csrf, request };
})();
