package debimage

import v1 "github.com/google/go-containerregistry/pkg/v1"

// Suite is the Debian release the images are built from.
const Suite = "bookworm"

// addUser makes the desktop's user: uid 1000 "user", home /home/user, as
// E2B's desktop template has.
const addUser = `useradd --uid 1000 --user-group --create-home --home-dir /home/user --shell /bin/bash user`

// env is the environment of both images.
var env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/home/user",
	"USER=user", "LANG=C.UTF-8", "DISPLAY=:0"}

// chromiumFlags is read by Debian's chromium wrapper (/etc/chromium.d).
// Chromium's own sandbox needs user namespaces (or a setuid helper), which
// an airlock sandbox does not give its workload: its renderers run in
// airlock's sandbox only. /dev/shm is small in a sandbox; /tmp is used.
const chromiumFlags = `export CHROMIUM_FLAGS="$CHROMIUM_FLAGS --no-sandbox --disable-dev-shm-usage --no-first-run --password-store=basic"
`

// desktopScript starts the desktop: Xvfb on $DISPLAY, then the XFCE
// session. airlock's computer-use API runs it when a sandbox of the
// desktop image has no display yet; E2B's SDK starts the same programs
// itself.
const desktopScript = `#!/bin/sh
# airlock-desktop: start Xvfb on $DISPLAY (default :0, size $AIRLOCK_SCREEN,
# without resetting when its last client leaves,
# default 1024x768x24) and the XFCE session on it. Returns when the session
# ends; run it in the background.
set -u
export DISPLAY="${DISPLAY:-:0}"
if ! xdpyinfo >/dev/null 2>&1; then
  Xvfb "$DISPLAY" -ac -noreset -screen 0 "${AIRLOCK_SCREEN:-1024x768x24}" -nolisten tcp -nolisten unix >/tmp/xvfb.log 2>&1 &
  i=0
  until xdpyinfo >/dev/null 2>&1; do
    i=$((i + 1))
    if [ "$i" -gt 200 ]; then echo "airlock-desktop: Xvfb did not start" >&2; cat /tmp/xvfb.log >&2; exit 1; fi
    sleep 0.1
  done
fi
exec startxfce4 >/tmp/xfce.log 2>&1
`

// browserScript starts headless Chromium with its DevTools port. With
// an allowlist, Chromium goes through the sandbox's egress proxy (named
// explicitly, not left to Chromium's reading of the environment); with
// credential injection, it trusts the sandbox's egress CA: Chromium on
// Linux takes added roots from the user's NSS database, not from
// /etc/ssl/certs, so the script adds the CA there (the CA's name
// constraints still hold: it vouches only for the secrets' hosts).
const browserScript = `#!/bin/sh
# airlock-browser: headless Chromium with the DevTools protocol on
# 127.0.0.1:${AIRLOCK_CDP_PORT:-9222}, for Playwright/CDP clients through
# airlock's ports relay.
set -eu
if [ -r /etc/airlock/egress-ca.pem ]; then
  db="$HOME/.pki/nssdb"
  mkdir -p "$db"
  [ -e "$db/cert9.db" ] || certutil -d "sql:$db" -N --empty-password
  certutil -d "sql:$db" -A -t C,, -n airlock-egress -i /etc/airlock/egress-ca.pem
fi
proxy="${https_proxy:-${HTTPS_PROXY:-}}"
if [ -n "$proxy" ]; then set -- --proxy-server="$proxy" "$@"; fi
exec chromium --headless=new --no-sandbox --disable-dev-shm-usage --no-first-run --disable-gpu \
  --remote-debugging-address=127.0.0.1 --remote-debugging-port="${AIRLOCK_CDP_PORT:-9222}" \
  --user-data-dir=/tmp/chromium-profile "$@" about:blank
`

// Desktop is the desktop image: what E2B Desktop's SDK runs (Xvfb, XFCE,
// xdotool, scrot, xrandr, x11vnc, noVNC at /opt/noVNC, netstat) and
// airlock's computer-use API needs, with Chromium and an xterm.
func Desktop() *Spec {
	return &Spec{
		Name:  "desktop",
		Suite: Suite,
		Packages: []string{"xvfb", "xfce4", "xfce4-terminal", "xterm", "dbus-x11", "xdotool", "scrot",
			"x11vnc", "novnc", "python3-websockify", "chromium", "fonts-dejavu-core", "x11-xserver-utils",
			"x11-utils", "wmctrl", "net-tools", "procps", "ca-certificates", "python3", "xdg-utils"},
		Files: map[string]string{
			"/usr/local/bin/airlock-desktop": desktopScript,
			"/etc/chromium.d/airlock":        chromiumFlags,
		},
		Run: []string{addUser, "ln -s /usr/share/novnc /opt/noVNC",
			// noVNC's index is vnc.html; E2B's stream URL asks for it.
			"test -e /usr/share/novnc/vnc.html"},
		Config: v1.Config{User: "1000:1000", WorkingDir: "/home/user", Env: env, Cmd: []string{"/bin/bash"}},
	}
}

// Browser is the browser image: headless Chromium, fonts, python3 (to
// serve pages from inside the sandbox) and NSS's certutil (to trust the
// sandbox's egress CA).
func Browser() *Spec {
	return &Spec{
		Name:     "browser",
		Suite:    Suite,
		Packages: []string{"chromium", "fonts-dejavu-core", "ca-certificates", "procps", "python3", "libnss3-tools"},
		Files: map[string]string{
			"/usr/local/bin/airlock-browser": browserScript,
			"/etc/chromium.d/airlock":        chromiumFlags,
		},
		Run:    []string{addUser},
		Config: v1.Config{User: "1000:1000", WorkingDir: "/home/user", Env: env[:4], Cmd: []string{"/bin/bash"}},
	}
}

// Specs are the images this package builds, by name.
var Specs = map[string]func() *Spec{"desktop": Desktop, "browser": Browser}
