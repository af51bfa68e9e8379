#!/usr/bin/env bash
# Installs the system packages Bumblehive needs on Debian/Ubuntu, only those missing.
# Usage: scripts/setup-system.sh [desktop] [e2e]
#   (no group)  what the runtime and its tests need
#   desktop     WebKitGTK and friends for the Tauri window
#   e2e         a virtual display, WebKit's WebDriver and Chromium for end-to-end tests
#   package     what scripts/package.sh needs: dpkg-shlibdeps, .desktop checks, squashfs
set -euo pipefail

# bubblewrap: the sandbox `run_command` runs shell commands in (without it every command asks);
# python3: the sandbox tests connect to a local server with it.
# python3-venv: the MCP tests run a small server on the Python `mcp` SDK in a venv.
packages=(build-essential pkg-config libssl-dev curl ca-certificates bubblewrap python3 python3-venv)
for group in "$@"; do
  case "$group" in
    desktop) packages+=(libwebkit2gtk-4.1-dev libxdo-dev libayatana-appindicator3-dev librsvg2-dev) ;;
    e2e) packages+=(xvfb xauth x11-utils xdotool xclip dbus-daemon dunst imagemagick webkit2gtk-driver chromium) ;;
    package) packages+=(dpkg-dev desktop-file-utils squashfs-tools libsquashfuse-dev libfuse3-dev zlib1g-dev) ;;
    *) echo "unknown group: $group" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  echo "installing: ${missing[*]}"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Rust (rustup) and Node.js 20+ are needed too; install them when absent.
if ! command -v cargo >/dev/null 2>&1; then
  echo "installing Rust with rustup"
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component clippy,rustfmt
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi
node_major=$(node -e 'console.log(process.versions.node.split(".")[0])' 2>/dev/null || echo 0)
if [ "$node_major" -lt 20 ]; then
  echo "Node.js 20 or newer is needed for the web UI (found: ${node_major}); installing Debian's nodejs" >&2
  DEBIAN_FRONTEND=noninteractive ${sudo_cmd:-} apt-get install -y -qq nodejs npm
fi
