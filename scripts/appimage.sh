#!/usr/bin/env bash
# Makes target/packages/Bumblehive-<version>-x86_64.AppImage from the release binaries:
# our own type-2 runtime (scripts/appimage/runtime.c, built here from Debian's
# libsquashfuse and libfuse3) followed by a squashfs (mksquashfs) of an AppDir holding
# AppRun, both binaries, the .desktop entry and the icons. Called by scripts/package.sh.
# The AppImage uses the system's WebKitGTK 4.1 and GTK 3 (libwebkit2gtk-4.1-0), as the
# .deb does; it does not carry them.
# Usage: scripts/appimage.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/packages}
version=$(sed -nE 's/^version = "(.*)"/\1/p' src-tauri/Cargo.toml | head -n 1)
work=target/appimage
rm -rf "$work"; mkdir -p "$work" "$out"

# The runtime: static libsquashfuse, the system's libfuse3 and decompressors.
gcc -O2 -Wall -Wextra -std=c11 -D_FILE_OFFSET_BITS=64 -I/usr/include/fuse3 \
  scripts/appimage/runtime.c -o "$work/runtime" \
  -Wl,-Bstatic -lsquashfuse_ll -lsquashfuse -Wl,-Bdynamic \
  -l:libfuse3.so.3 -l:libz.so.1 -l:liblzma.so.5 -l:liblzo2.so.2 -l:liblz4.so.1 -l:libzstd.so.1
strip "$work/runtime"
# The AppImage type-2 magic: "AI" 0x02 at offset 8 of the ELF header (its padding bytes).
printf 'AI\002' | dd of="$work/runtime" bs=1 seek=8 conv=notrunc status=none

app=$work/Bumblehive.AppDir
mkdir -p "$app/usr/bin" "$app/usr/share/applications"
install -m 755 scripts/appimage/AppRun "$app/AppRun"
# The CLI as scripts/package.sh staged it (profile dist, or release in CI).
for bin in stage/bumblehive release/bumblehive-desktop; do
  install -m 755 "target/$bin" "$app/usr/bin/${bin#*/}"
  strip "$app/usr/bin/${bin#*/}"
done
sed "s/^Version=.*/&\nX-AppImage-Version=$version/" icons/bumblehive.desktop >"$app/bumblehive.desktop"
cp "$app/bumblehive.desktop" "$app/usr/share/applications/"
for size in 32 64 128 256 512; do
  mkdir -p "$app/usr/share/icons/hicolor/${size}x${size}/apps"
  cp "icons/${size}x${size}.png" "$app/usr/share/icons/hicolor/${size}x${size}/apps/bumblehive.png"
done
mkdir -p "$app/usr/share/icons/hicolor/scalable/apps"
cp icons/bumblehive.svg "$app/usr/share/icons/hicolor/scalable/apps/"
cp icons/256x256.png "$app/bumblehive.png"
ln -s bumblehive.png "$app/.DirIcon"

mksquashfs "$app" "$work/app.squashfs" -root-owned -noappend -comp zstd -quiet >/dev/null
image="$out/Bumblehive-$version-x86_64.AppImage"
cat "$work/runtime" "$work/app.squashfs" >"$image.tmp"
chmod 755 "$image.tmp"
mv "$image.tmp" "$image"

# The runtime must find the squashfs exactly where it was put.
offset=$("$image" --appimage-offset)
[ "$offset" -eq "$(stat -c %s "$work/runtime")" ] || { echo "AppImage offset $offset is wrong" >&2; exit 1; }
echo "$image ($(du -h "$image" | cut -f1))"
