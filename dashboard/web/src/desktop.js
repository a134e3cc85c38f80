// The desktop view (#/desktop/ID): a desktop sandbox live, through noVNC
// in a frame on a link's own origin (POST /v1/sandboxes/{id}/stream,
// package portlink), never the dashboard's: the page the sandbox serves
// can neither script the dashboard nor use its session. Read-only by
// default (noVNC's view_only); "Take over" reloads it taking input.
// Kept apart from app.js, which passes in its helpers.

// desktopPage fills m with sandbox id's desktop. api and el are app.js's.
export async function desktopPage(m, id, { api, el }) {
  const base = "/v1/sandboxes/" + encodeURIComponent(id);
  const status = el("span", { class: "muted", id: "desktop-status" }, "starting the desktop's stream…");
  const take = el("button", { id: "take-over", "aria-pressed": "false", disabled: true }, "Take over");
  m.append(el("div", { class: "toolbar" }, el("h2", {}, "Desktop of " + id),
    el("a", { href: "#/sb/" + encodeURIComponent(id) }, "back to the sandbox"), take, status));
  const frame = el("iframe", {
    id: "desktop", title: "desktop of " + id,
    // Its own origin already; no navigating the dashboard, no popups.
    sandbox: "allow-scripts allow-same-origin", referrerpolicy: "no-referrer",
  });
  m.append(frame);
  let links;
  try { links = await api("POST", base + "/stream"); } catch (e) { status.textContent = e.message; status.className = "error"; return; }
  let control = false;
  const show = () => {
    frame.src = control ? links.control_url : links.view_url;
    frame.dataset.mode = control ? "control" : "view";
    take.textContent = control ? "Watch only" : "Take over";
    take.setAttribute("aria-pressed", String(control));
    status.textContent = control ? "you have the keyboard and mouse" : "watching (read-only)";
  };
  take.disabled = false;
  take.addEventListener("click", () => { control = !control; show(); });
  show();
}
