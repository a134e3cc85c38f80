// Keys page: the server's API keys through the admin endpoints (/v1/keys),
// shown only to an admin key's session. A new key's secret is shown once,
// in a box the user closes; it is never kept (not in the table, not in
// storage) and no other answer holds it.

// keyLimitFields are the limits form's fields: id, label, JSON field,
// scale from the form's unit to the API's.
const keyLimitFields = [
  ["max-sandboxes", "Max sandboxes", null, 1],
  ["memory", "Memory (MiB)", "memory_bytes", 1048576],
  ["cpus", "CPUs", "cpus", 1],
  ["pids", "Processes", "pids", 1],
  ["disk", "Disk (MiB)", "disk_bytes", 1048576],
  ["timeout", "Timeout (s)", "timeout_s", 1],
];

// limitsText shows a key's own ceilings ("none": only the server's).
function limitsText(k) {
  const l = k.limits || {};
  const parts = [];
  if (l.memory_bytes) parts.push("memory " + Math.round(l.memory_bytes / 1048576) + " MiB");
  if (l.cpus) parts.push("cpus " + l.cpus);
  if (l.pids) parts.push("pids " + l.pids);
  if (l.disk_bytes) parts.push("disk " + Math.round(l.disk_bytes / 1048576) + " MiB");
  if (l.timeout_s) parts.push("timeout " + l.timeout_s + " s");
  return parts.length ? parts.join(", ") : "none of its own";
}

// limitInputs makes the limit fields (prefix-ID inputs) and reads them back
// as a PUT /v1/keys/{id}/limits body.
function limitInputs(el, prefix, k) {
  const inputs = keyLimitFields.map(([id, label, field, scale]) => {
    const v = k ? (field ? (k.limits || {})[field] : k.max_sandboxes) : 0;
    return [field, scale, el("input", { id: prefix + id, type: "number", min: "0", step: id === "cpus" ? "0.1" : "1", placeholder: "no cap", value: v ? v / scale : undefined }), label];
  });
  const read = () => {
    const body = { max_sandboxes: 0, limits: {} };
    for (const [field, scale, input] of inputs) {
      const n = Number(input.value || 0) * scale;
      if (!field) body.max_sandboxes = n;
      else if (n) body.limits[field] = field === "cpus" ? n : Math.round(n);
    }
    return body;
  };
  return { labels: inputs.map(([, , input, label]) => el("label", {}, label, input)), read };
}

// keysPage lists the keys and creates, re-limits and revokes them. ui holds
// app.js's helpers; session is the logged-in key's session.
export async function keysPage(ui, session) {
  const { el, api, clear, table, placeholder, confirmButton } = ui;
  const m = clear();
  m.append(el("h2", {}, "API keys"));
  if (!session || !session.key || !session.key.admin) {
    m.append(el("p", { class: "error", id: "keys-denied" }, "Only an admin key manages keys (airlock keys create --admin)."));
    return;
  }
  const status = el("span", { class: "muted", id: "keys-status" });
  const secretBox = el("div", { id: "key-secret", class: "secret", hidden: true });
  const name = el("input", { id: "key-name", placeholder: "name, e.g. ci-runner", required: true, maxlength: "200" });
  const admin = el("input", { type: "checkbox", id: "key-admin" });
  const lim = limitInputs(el, "key-", null);
  const create = el("button", { id: "key-create", type: "submit" }, "Create key");
  const form = el("form", { class: "create", id: "key-form" }, el("label", {}, "Name", name), ...lim.labels,
    el("label", { class: "check" }, el("span", {}, admin, " admin (may manage keys)")), create);
  const editor = el("div", { id: "key-editor" });
  const tbody = el("tbody", { id: "keys" });
  placeholder(tbody, 9, "loading", "loading");
  m.append(el("p", { class: "muted" }, "Keys authenticate the API, the E2B API, MCP and this dashboard. A new key's secret is shown once; revoking a key refuses it from its next request on."),
    form, secretBox, el("div", { class: "toolbar" }, status), editor,
    table(["ID", "Name", "Admin", "~Created", "State", "~Max sandboxes", "~Limits", "~Last used", ""], tbody));

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    create.disabled = true;
    status.textContent = "";
    try {
      const body = lim.read();
      const r = await api("POST", "/v1/keys", { name: name.value.trim(), admin: admin.checked, max_sandboxes: body.max_sandboxes, limits: body.limits });
      name.value = ""; admin.checked = false;
      for (const l of lim.labels) l.querySelector("input").value = "";
      showSecret(r);
      load();
    } catch (e) { status.textContent = e.message; }
    create.disabled = false;
  });

  // showSecret shows a new key's secret until the user closes the box.
  const showSecret = (r) => {
    const done = el("button", { id: "key-secret-done", onclick: () => { secretBox.replaceChildren(); secretBox.hidden = true; } }, "I have copied it");
    secretBox.replaceChildren(el("strong", {}, "Key " + r.key.id + " (" + r.key.name + ") created. Copy its secret now: it is shown only this once."),
      el("label", {}, "Secret", el("code", { id: "key-secret-value" }, r.secret)),
      el("label", {}, "E2B form (E2B_API_KEY)", el("code", { id: "key-secret-e2b" }, r.e2b_secret)), done);
    secretBox.hidden = false;
  };

  const edit = (k) => {
    const l = limitInputs(el, "edit-", k);
    const save = el("button", { id: "edit-save", type: "submit" }, "Save limits");
    const f = el("form", { class: "create", id: "edit-form" }, el("strong", { class: "span" }, "Limits of " + k.id + " (" + k.name + ")"), ...l.labels, save,
      el("button", { type: "button", onclick: () => editor.replaceChildren() }, "Cancel"));
    f.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      save.disabled = true;
      try {
        await api("PUT", "/v1/keys/" + encodeURIComponent(k.id) + "/limits", l.read());
        status.textContent = "limits of " + k.id + " saved";
        editor.replaceChildren();
        load();
      } catch (e) { status.textContent = e.message; save.disabled = false; }
    });
    editor.replaceChildren(f);
  };

  const load = async () => {
    try {
      const keys = (await api("GET", "/v1/keys")).keys || [];
      if (!keys.length) { placeholder(tbody, 9, "no keys"); return; }
      tbody.replaceChildren(...keys.map((k) => el("tr", { "data-id": k.id, class: k.revoked_at ? "revoked" : "" },
        el("td", {}, el("code", {}, k.id)), el("td", {}, k.name), el("td", {}, k.admin ? "admin" : ""),
        el("td", { class: "hide-narrow" }, new Date(k.created_at).toLocaleString()),
        el("td", { class: k.revoked_at ? "state-revoked" : "state-running" }, k.revoked_at ? "revoked " + new Date(k.revoked_at).toLocaleString() : "live"),
        el("td", { class: "hide-narrow" }, k.max_sandboxes || "server's"), el("td", { class: "hide-narrow" }, limitsText(k)),
        el("td", { class: "hide-narrow" }, k.last_used_at ? new Date(k.last_used_at).toLocaleString() : "never"),
        el("td", {}, k.revoked_at ? "" : [
          el("button", { class: "limits", onclick: () => edit(k) }, "Limits"), " ",
          confirmButton("Revoke", "revoke", async () => {
            try { await api("DELETE", "/v1/keys/" + encodeURIComponent(k.id)); status.textContent = "revoked " + k.id; load(); } catch (e) { status.textContent = e.message; }
          })]))));
    } catch (e) { placeholder(tbody, 9, e.message, "error"); }
  };
  load();
}
