//! Reads the root-level tauri.conf.json and capabilities/ (see ../shared/NOTES.md), and
//! asks the linker to place the functions run at start together (startup-order.txt).
fn main() {
    println!("cargo:rerun-if-changed=../capabilities");
    println!("cargo:rerun-if-changed=../tauri.conf.json");
    tauri_build::try_build(
        tauri_build::Attributes::new()
            .config_path("../tauri.conf.json")
            .capabilities_path_pattern("../capabilities/**/*"),
    )
    .unwrap_or_else(|err| panic!("tauri build failed: {err:#}"));
    startup_order();
}

/// The functions the shell runs while it starts and paints a session
/// (`scripts/startup-order.sh` lists them), placed side by side by the linker: the kernel
/// maps code 64 KiB around each page faulted in, so spread over the binary's 22 MB of text
/// they kept 15 MiB of it resident, packed 6-8 (BENCHMARKS.md, issue #31). Release
/// builds only, and only where the linker is rust-lld, which reads the list: Rust's own
/// default for x86_64 Linux since 1.90 (GNU ld, the default before, has no such option).
/// `BUMBLEHIVE_NO_STARTUP_ORDER=1` leaves the layout to the linker.
fn startup_order() {
    println!("cargo:rerun-if-changed=startup-order.txt");
    println!("cargo:rerun-if-env-changed=BUMBLEHIVE_NO_STARTUP_ORDER");
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    let target = std::env::var("TARGET").unwrap_or_default();
    if !release
        || target != "x86_64-unknown-linux-gnu"
        || std::env::var_os("BUMBLEHIVE_NO_STARTUP_ORDER").is_some()
        || !rustc_links_with_lld()
    {
        return;
    }
    let list = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default())
        .join("startup-order.txt");
    if list.is_file() {
        println!(
            "cargo:rustc-link-arg-bin=bumblehive-desktop=-Wl,--symbol-ordering-file={}",
            list.display()
        );
        // Names the list holds that this build no longer has are skipped, not reported.
        println!("cargo:rustc-link-arg-bin=bumblehive-desktop=-Wl,--no-warn-symbol-ordering");
    }
}

/// Whether this rustc links x86_64 Linux binaries with its own lld (1.90 and later).
fn rustc_links_with_lld() -> bool {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let Ok(out) = std::process::Command::new(rustc).arg("-V").output() else {
        return false;
    };
    // "rustc 1.95.0 (59807616e 2026-04-14)"
    let version = String::from_utf8_lossy(&out.stdout);
    let mut parts = version
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .split('.')
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (1, 90)
}
