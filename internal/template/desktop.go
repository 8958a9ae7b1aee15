package template

import (
	"context"
	"slices"
)

// desktopPackages are base's packages plus what the @e2b/desktop SDK runs
// in its sandboxes, all from Debian: Xvfb (xvfb), the XFCE session it
// starts and waits for (startxfce4, xfce4-session, xfwm4, xfdesktop; dbus-x11
// for the session bus), xdotool for the mouse and keyboard, scrot for
// screenshots, xrandr and xdpyinfo (x11-xserver-utils, x11-utils), x11vnc
// and noVNC with websockify for the stream, netstat (net-tools) and pgrep
// (procps) for its readiness checks, xdg-open and gtk-launch (xdg-utils,
// libgtk-3-bin) for open() and launch(), chromium and xterm to run, and
// fonts.
var desktopPackages = append(slices.Clone(basePackages),
	"xvfb", "xfce4-session", "xfwm4", "xfdesktop4", "dbus-x11",
	"xdotool", "scrot", "x11-xserver-utils", "x11-utils",
	"x11vnc", "novnc", "websockify", "net-tools",
	"xdg-utils", "libgtk-3-bin", "chromium", "xterm",
	"fonts-dejavu-core")

// desktopHooks are the desktop template's customize hooks (mmdebstrap's
// $1 is the tree):
//   - /opt/noVNC is Debian's noVNC, where the SDK runs
//     utils/novnc_proxy from and serves vnc.html;
//   - chromium runs without its own sandbox (the fence sandbox is the
//     boundary; its namespace sandbox needs privileges a sandbox has
//     not), without first-run dialogs, and with /dev/shm spared;
//   - launch("xterm") finds xterm (Debian names its entry debian-xterm).
var desktopHooks = []string{
	`mkdir -p "$1/opt" && ln -s /usr/share/novnc "$1/opt/noVNC"`,
	`printf 'export CHROMIUM_FLAGS="$CHROMIUM_FLAGS --no-sandbox --disable-dev-shm-usage --no-first-run --no-default-browser-check --password-store=basic"\n' > "$1/etc/chromium.d/fence"`,
	`ln -s debian-xterm.desktop "$1/usr/share/applications/xterm.desktop"`,
}

// buildDesktop builds base's tree plus the desktop the @e2b/desktop SDK
// drives. It has no start command: the SDK starts Xvfb itself, at the
// resolution and DPI its create() was given, then startxfce4.
func buildDesktop(ctx context.Context, s *Store, rootfs string) (string, error) {
	return debootstrap(ctx, s, rootfs, "desktop", desktopPackages, "about 5 min", desktopHooks)
}
