#!/usr/bin/env bash
# Builds the Linux packages of Bumblehive from this checkout:
#   target/packages/bumblehive_<version>-1_amd64.deb   (cargo-deb; dependencies by dpkg-shlibdeps)
#   target/packages/Bumblehive-<version>-x86_64.AppImage (see scripts/appimage.sh)
# Both carry bumblehive-desktop (menu entry + icon) and bumblehive (serve / run).
# Installs what is missing (system packages, cargo-deb from crates.io), builds the UI and
# the release binaries, then packs them.
# Env: PKG_NO_BUILD=1 packs the release binaries already in target/release (CI builds once);
#      PKG_NO_APPIMAGE=1 makes only the .deb.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }
out=target/packages
CARGO_DEB_VERSION=3.8.0

step "System packages (only those missing)"
./scripts/setup-system.sh desktop package
export PATH="$HOME/.cargo/bin:$PATH"

if [ "${PKG_NO_BUILD:-}" != 1 ]; then
  step "UI build (embedded in the desktop binary)"
  if [ ! -f ui/node_modules/.package-lock.json ] || [ ui/package-lock.json -nt ui/node_modules/.package-lock.json ]; then
    (cd ui && npm ci --no-audit --no-fund)
  fi
  (cd ui && npm run build)
  step "Release builds: bumblehive (profile dist: LTO) and bumblehive-desktop"
  cargo build --profile dist -p bumblehive --bin bumblehive
  cargo build --release -p bumblehive-desktop --features custom-protocol
fi
for bin in dist/bumblehive release/bumblehive-desktop; do
  [ -x "target/$bin" ] || { echo "target/$bin is missing: run without PKG_NO_BUILD=1" >&2; exit 1; }
done

if ! cargo deb --version 2>/dev/null | grep -q "$CARGO_DEB_VERSION"; then
  step "cargo-deb $CARGO_DEB_VERSION (crates.io, once)"
  cargo install cargo-deb --version "$CARGO_DEB_VERSION" --locked
fi

desktop-file-validate icons/bumblehive.desktop

step ".deb"
mkdir -p "$out"
rm -f "$out"/bumblehive_*.deb
cargo deb -p bumblehive-desktop --no-build --output "$out/"
deb=$(ls "$out"/bumblehive_*.deb)
dpkg-deb --field "$deb" Package Version Depends

if [ "${PKG_NO_APPIMAGE:-}" != 1 ]; then
  step "AppImage"
  ./scripts/appimage.sh "$out"
fi

step "Packages"
ls -l "$out"/
