//! Security review 2, finding 9 and the note on profile precedence: `AGENTS.md`, `CLAUDE.md` and profile files are not read through symlinks that lead out of the project (the outside file would go to the provider), and a workspace profile that replaces a user-level or built-in one says so.

use std::path::PathBuf;

use bumblehive::context::instructions;

fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let ws = root.join("ws");
    let outside = root.join("home");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    (dir, ws, outside)
}

/// `AGENTS.md -> ../home/credentials` (a relative link, which git clones): not read, a
/// notice says where it leads, and the folder's `CLAUDE.md` is read instead; a link that
/// stays inside the project is still read.
#[test]
fn security_links_instruction_files_follow_no_symlink_out() {
    let (_dir, ws, outside) = dirs();
    std::fs::write(outside.join("credentials"), "AWS-SECRET-KEY").unwrap();
    std::os::unix::fs::symlink("../home/credentials", ws.join("AGENTS.md")).unwrap();
    std::fs::write(ws.join("CLAUDE.md"), "use tabs").unwrap();
    let sub = ws.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(ws.join("shared.md"), "inside rules").unwrap();
    std::os::unix::fs::symlink("../shared.md", sub.join("AGENTS.md")).unwrap();
    let found = instructions::load(&sub, Some(&ws), None);
    assert!(!found.text.contains("AWS-SECRET-KEY"), "{}", found.text);
    assert!(found.text.contains("use tabs"), "{}", found.text);
    assert!(found.text.contains("inside rules"), "{}", found.text);
    assert!(
        found
            .notices
            .iter()
            .any(|n| n.contains("outside the project")),
        "{:?}",
        found.notices
    );
    // CLAUDE.md as the link out (no AGENTS.md there): not read either.
    std::fs::remove_file(ws.join("AGENTS.md")).unwrap();
    std::fs::remove_file(ws.join("CLAUDE.md")).unwrap();
    std::os::unix::fs::symlink(outside.join("credentials"), ws.join("CLAUDE.md")).unwrap();
    let found = instructions::load(&ws, Some(&ws), None);
    assert!(!found.text.contains("AWS-SECRET-KEY"), "{}", found.text);
}

/// `.bumblehive/agents/helper.md -> ../../../home/id_ed25519`, and a whole agents folder
/// that is a link out: no profile carries the outside file, and the error says why.
#[test]
fn security_links_profile_files_follow_no_symlink_out() {
    let (_dir, ws, outside) = dirs();
    std::fs::write(
        outside.join("id_ed25519"),
        "---\nname: helper\n---\nPRIVATE-KEY-BYTES",
    )
    .unwrap();
    let agents = ws.join(".bumblehive/agents");
    std::fs::create_dir_all(&agents).unwrap();
    std::os::unix::fs::symlink("../../../home/id_ed25519", agents.join("helper.md")).unwrap();
    std::fs::create_dir_all(outside.join("claude")).unwrap();
    std::fs::write(
        outside.join("claude/other.md"),
        "---\nname: other\n---\nOUTSIDE-PROFILE",
    )
    .unwrap();
    std::fs::create_dir_all(ws.join(".claude")).unwrap();
    std::os::unix::fs::symlink(outside.join("claude"), ws.join(".claude/agents")).unwrap();
    let profiles = bumblehive::profiles::load(&ws, None);
    for profile in &profiles.profiles {
        assert!(
            !profile.instructions.contains("PRIVATE-KEY-BYTES")
                && !profile.instructions.contains("OUTSIDE-PROFILE"),
            "{profile:?}"
        );
    }
    assert!(
        profiles
            .errors
            .iter()
            .any(|e| e.contains("outside the project")),
        "{:?}",
        profiles.errors
    );
}

/// A workspace profile named like a user-level or built-in one replaces it, with a
/// notice on the profile that says which it replaced.
#[test]
fn security_links_a_workspace_profile_replacing_another_says_so() {
    let (_dir, ws, outside) = dirs();
    let agents = ws.join(".bumblehive/agents");
    std::fs::create_dir_all(&agents).unwrap();
    std::fs::write(
        agents.join("explore.md"),
        "---\nname: explore\n---\nrepo explore",
    )
    .unwrap();
    std::fs::write(agents.join("mine.md"), "---\nname: mine\n---\nrepo mine").unwrap();
    let user = outside.join("config");
    std::fs::create_dir_all(user.join("agents")).unwrap();
    std::fs::write(user.join("agents/mine.md"), "---\nname: mine\n---\nmy own").unwrap();
    let profiles = bumblehive::profiles::load(&ws, Some(&user));
    let explore = profiles.get("explore").unwrap();
    assert!(
        explore.notices.iter().any(|n| n.contains("built-in")),
        "{:?}",
        explore.notices
    );
    let mine = profiles.get("mine").unwrap();
    assert_eq!(mine.instructions.trim(), "repo mine");
    assert!(
        mine.notices.iter().any(|n| n.contains("replaces")
            && n.contains(&user.join("agents/mine.md").display().to_string())),
        "{:?}",
        mine.notices
    );
}
