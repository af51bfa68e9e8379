//! Reads the root-level tauri.conf.json and capabilities/ (see ../shared/NOTES.md).
fn main() {
    println!("cargo:rerun-if-changed=../capabilities");
    println!("cargo:rerun-if-changed=../tauri.conf.json");
    tauri_build::try_build(
        tauri_build::Attributes::new()
            .config_path("../tauri.conf.json")
            .capabilities_path_pattern("../capabilities/**/*"),
    )
    .unwrap_or_else(|err| panic!("tauri build failed: {err:#}"));
}
