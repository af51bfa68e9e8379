#!/usr/bin/env bash
# Builds the Linux packages of Bumblehive from this checkout:
#   target/packages/bumblehive_<version>-1_amd64.deb   (cargo-deb; dependencies by dpkg-shlibdeps)
#   target/packages/Bumblehive-<version>-x86_64.AppImage (see scripts/appimage.sh)
# Both carry bumblehive-desktop (menu entry + icon) and bumblehive (serve / run).
# Installs what is missing (system packages, cargo-deb from crates.io), builds the UI and
# the release binaries, then packs them.
# Env: PKG_NO_BUILD=1 packs the binaries already built (CI builds once);
#      PKG_NO_APPIMAGE=1 makes only the .deb;
#      PKG_CLI_PROFILE=release packs a release-profile CLI instead of the shipped `dist`
#      one (fat LTO). CI uses it: `dist` compiles every dependency a second time with
#      LTO (about 10 of CI's minutes on 2 cores), while a release CLI reuses the desktop
#      build's; the packages are built, installed and started the same way either way.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }
out=target/packages
CARGO_DEB_VERSION=3.8.0
cli_profile=${PKG_CLI_PROFILE:-dist}

step "System packages (only those missing)"
./scripts/setup-system.sh desktop package
export PATH="$HOME/.cargo/bin:$PATH"

if [ "${PKG_NO_BUILD:-}" != 1 ]; then
  step "UI build (embedded in the desktop binary)"
  if [ ! -f ui/node_modules/.package-lock.json ] || [ ui/package-lock.json -nt ui/node_modules/.package-lock.json ]; then
    (cd ui && npm ci --no-audit --no-fund)
  fi
  (cd ui && npm run build)
  step "Release builds: bumblehive (profile $cli_profile) and bumblehive-desktop"
  if [ "$cli_profile" = release ]; then
    # One invocation, so that the CLI shares the desktop's dependency builds: built
    # alone, its features differ and a third of the dependencies compile again.
    cargo build --release -p bumblehive-desktop -p bumblehive --features bumblehive-desktop/custom-protocol \
      --bin bumblehive-desktop --bin bumblehive
  else
    cargo build --release -p bumblehive-desktop --features custom-protocol
    cargo build --profile "$cli_profile" -p bumblehive --bin bumblehive
  fi
fi
for bin in "$cli_profile/bumblehive" release/bumblehive-desktop; do
  [ -x "target/$bin" ] || { echo "target/$bin is missing: run without PKG_NO_BUILD=1" >&2; exit 1; }
done
# Both packages take the CLI from one staged place, whichever profile built it.
mkdir -p target/stage
install -m 755 "target/$cli_profile/bumblehive" target/stage/bumblehive

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
