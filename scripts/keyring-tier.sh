#!/usr/bin/env bash
# The OS keyring tier: a real Secret Service (gnome-keyring) in a private D-Bus session,
# so an API key stored with `set_api_key` is read back by the provider for real.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
for p in gnome-keyring dbus-daemon; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# A throwaway keyring: its password only unlocks this session's test keyring.
dbus-run-session -- bash -c '
  printf "test-keyring-password" | gnome-keyring-daemon --unlock --components=secrets >/dev/null
  BUMBLEHIVE_KEYRING_TEST=1 cargo test --test tests keyring_ -- --nocapture
'
