//! Stamps the build with the commit it was made from (`BUMBLEHIVE_COMMIT`), for
//! `bumblehive --version` and the About box; "unknown" outside a git checkout.
use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

fn main() {
    // A packager may stamp the commit itself (a source tarball has no .git).
    println!("cargo:rerun-if-env-changed=BUMBLEHIVE_COMMIT");
    let commit = std::env::var("BUMBLEHIVE_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| git(&["rev-parse", "--short=10", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=BUMBLEHIVE_COMMIT={commit}");
    // Rebuild when HEAD moves: HEAD itself (a branch switch) and the ref it names (a
    // commit). In a worktree these live in different git dirs, so ask git for each path.
    for name in ["HEAD", "packed-refs"] {
        if let Some(path) = git(&["rev-parse", "--git-path", name]) {
            let path = PathBuf::from(path);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    if let Some(head_ref) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(path) = git(&["rev-parse", "--git-path", &head_ref])
    {
        let path = PathBuf::from(path);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}
