//! Security review 2, findings 1-3 for real: repositories planted with programs git would run (hooks, `core.fsmonitor`, a filter driver, `.git/commondir`, a `.git` file pointing elsewhere, a nested repository, `git init` inside a workspace in a repository, a worktree's rewritten `.git` file); the runtime's own git (environment detection, worktrees, checkpoints) must run none of them. Each planted program would create a marker file outside the workspace; the tests assert it does not exist.

use std::path::{Path, PathBuf};
use std::process::Command;

use bumblehive::context::environment::{Environment, GitState};

/// Plain git for setting repositories up, away from the machine's own config.
fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A folder for markers, outside every workspace of the test.
struct Markers {
    dir: tempfile::TempDir,
}

impl Markers {
    fn new() -> Markers {
        Markers {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A shell command that leaves the marker `name` when run (and, as a filter, passes
    /// its input on, so that git would go on working normally).
    fn program(&self, name: &str) -> String {
        format!("touch {}; cat", self.path(name).display())
    }

    /// Every marker the planted programs left.
    fn left(&self) -> Vec<String> {
        std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }
}

/// Appends to a git config file every program-running line the review names:
/// `core.fsmonitor`, a clean/smudge/process filter, `core.pager`, `diff.external`, and
/// turns hooks on in `hooks_dir` (every hook the commands used here could run).
fn plant_config(config: &Path, hooks_dir: &Path, markers: &Markers, tag: &str) {
    let mut text = std::fs::read_to_string(config).unwrap_or_default();
    text.push_str(&format!(
        "[core]\n\tfsmonitor = \"{fs} #\"\n\tpager = \"{pager}\"\n\thooksPath = {hooks}\n\
         [diff]\n\texternal = \"{ext}\"\n\
         [filter \"evil\"]\n\tclean = \"{clean}\"\n\tsmudge = \"{smudge}\"\n\trequired = true\n",
        fs = markers.program(&format!("{tag}-fsmonitor")),
        pager = markers.program(&format!("{tag}-pager")),
        hooks = hooks_dir.display(),
        ext = markers.program(&format!("{tag}-diff-external")),
        clean = markers.program(&format!("{tag}-clean")),
        smudge = markers.program(&format!("{tag}-smudge")),
    ));
    std::fs::write(config, text).unwrap();
    std::fs::create_dir_all(hooks_dir).unwrap();
    for hook in [
        "post-checkout",
        "post-index-change",
        "reference-transaction",
        "pre-commit",
        "post-commit",
    ] {
        let path = hooks_dir.join(hook);
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\ntouch {}\n",
                markers.path(&format!("{tag}-hook-{hook}")).display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// A repository in `dir` with one commit of `file.txt` under the `evil` filter, and
/// `file.txt` then changed with the same size and a later time, so that git must read it
/// (through the clean filter) to know whether it changed.
fn repo_with_commit(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q"]);
    std::fs::write(dir.join(".gitattributes"), "* filter=evil\n").unwrap();
    std::fs::write(dir.join("file.txt"), "one\n").unwrap();
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-qm", "one"]);
    touch_changed(&dir.join("file.txt"));
}

/// Rewrites `file` with other bytes of the same length and a modification time an hour on.
fn touch_changed(file: &Path) {
    let old = std::fs::read(file).unwrap();
    let new: Vec<u8> = old
        .iter()
        .map(|b| if *b == b'\n' { *b } else { b'x' })
        .collect();
    std::fs::write(file, new).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(file)
        .unwrap()
        .set_modified(later)
        .unwrap();
}

/// The temporary folder, canonical (tempfile's may sit behind a symlink).
fn tmp() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().canonicalize().unwrap();
    (dir, path)
}

fn assert_repository(state: &GitState) {
    assert!(
        matches!(state, GitState::Repository { .. }),
        "the workspace is a repository: {state:?}"
    );
}

/// Finding 2: a repository that came with a hostile `.git/config` (fsmonitor, pager,
/// diff.external, a clean filter that `.gitattributes` applies, hooks). The prompt's git
/// state is still read, and none of it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_git_environment_runs_no_repository_config() {
    let markers = Markers::new();
    let (_dir, root) = tmp();
    let ws = root.join("ws");
    repo_with_commit(&ws);
    plant_config(
        &ws.join(".git/config"),
        &ws.join(".git/hooks"),
        &markers,
        "repo",
    );
    let env = Environment::detect(&ws).await;
    assert_repository(&env.git);
    assert_eq!(markers.left(), Vec::<String>::new(), "{:?}", env.git);
}

/// Finding 1, variant 2: `.git/commondir` names a folder the command made, whose config
/// and hooks git would use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_git_environment_ignores_a_planted_commondir() {
    let markers = Markers::new();
    let (_dir, root) = tmp();
    let ws = root.join("ws");
    repo_with_commit(&ws);
    let cd = ws.join(".cd");
    std::fs::create_dir_all(&cd).unwrap();
    std::fs::copy(ws.join(".git/config"), cd.join("config")).unwrap();
    for part in ["objects", "refs"] {
        std::os::unix::fs::symlink(ws.join(".git").join(part), cd.join(part)).unwrap();
    }
    std::fs::write(ws.join(".git/commondir"), "../.cd\n").unwrap();
    plant_config(&cd.join("config"), &cd.join("hooks"), &markers, "commondir");
    let env = Environment::detect(&ws).await;
    assert_eq!(markers.left(), Vec::<String>::new(), "{:?}", env.git);
}

/// Finding 1, variant 3: the workspace's `.git` is a file that names a git dir the
/// command made (`gitdir: <ws>/.gd`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_git_environment_ignores_a_git_file_pointing_elsewhere() {
    let markers = Markers::new();
    let (_dir, root) = tmp();
    let ws = root.join("ws");
    repo_with_commit(&ws);
    std::fs::rename(ws.join(".git"), ws.join(".gd")).unwrap();
    std::fs::write(
        ws.join(".git"),
        format!("gitdir: {}\n", ws.join(".gd").display()),
    )
    .unwrap();
    plant_config(
        &ws.join(".gd/config"),
        &ws.join(".gd/hooks"),
        &markers,
        "gitfile",
    );
    let env = Environment::detect(&ws).await;
    assert_repository(&env.git);
    assert_eq!(markers.left(), Vec::<String>::new(), "{:?}", env.git);
}

/// Finding 1, variant 4: a nested repository (`vendor/lib`, recorded as a gitlink) with
/// its own hostile config; `git status` of the workspace would look inside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_git_environment_runs_nothing_of_a_nested_repository() {
    let markers = Markers::new();
    let (_dir, root) = tmp();
    let ws = root.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    git(&ws, &["init", "-q"]);
    let nested = ws.join("vendor/lib");
    repo_with_commit(&nested);
    std::fs::write(ws.join("top.txt"), "top\n").unwrap();
    git(&ws, &["add", "-A"]);
    git(&ws, &["commit", "-qm", "top"]);
    plant_config(
        &nested.join(".git/config"),
        &nested.join(".git/hooks"),
        &markers,
        "nested",
    );
    touch_changed(&nested.join("file.txt"));
    let env = Environment::detect(&ws).await;
    assert_repository(&env.git);
    assert_eq!(markers.left(), Vec::<String>::new(), "{:?}", env.git);
}

/// Finding 1, variant 4: the workspace is a folder of a repository (a monorepo
/// package), and a command ran `git init` there: git in the workspace now uses the new,
/// planted `.git`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_git_environment_runs_nothing_of_a_new_git_in_a_sub_folder() {
    let markers = Markers::new();
    let (_dir, root) = tmp();
    let top = root.join("mono");
    repo_with_commit(&top);
    let ws = top.join("pkg");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("a.txt"), "a\n").unwrap();
    git(&ws, &["init", "-q"]);
    std::fs::write(ws.join(".gitattributes"), "* filter=evil\n").unwrap();
    git(&ws, &["add", "-A"]);
    git(&ws, &["commit", "-qm", "pkg"]);
    touch_changed(&ws.join("a.txt"));
    plant_config(
        &ws.join(".git/config"),
        &ws.join(".git/hooks"),
        &markers,
        "init",
    );
    let env = Environment::detect(&ws).await;
    assert_repository(&env.git);
    assert_eq!(markers.left(), Vec::<String>::new(), "{:?}", env.git);
}

/// Findings 2 and 3: the worktree commands run none of the origin's config (its smudge
/// filter at checkout, its fsmonitor, its hooks), and a sub-agent that rewrote its
/// worktree's `.git` file to name a git dir of its own (with fsmonitor, filters and
/// hooks) gets nothing run by the diff stat of its report or by an apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_git_worktree_runs_nothing_planted() {
    use bumblehive::checkpoints::worktree;
    let markers = Markers::new();
    let (_dir, root) = tmp();
    let ws = root.join("ws");
    repo_with_commit(&ws);
    git(&ws, &["add", "-A"]);
    git(&ws, &["commit", "-qm", "two"]);
    plant_config(
        &ws.join(".git/config"),
        &ws.join(".git/hooks"),
        &markers,
        "origin",
    );
    let data = root.join("data");
    let (info, child_ws) = worktree::create(&data, &ws, "child1").unwrap();
    assert!(child_ws.join("file.txt").exists());
    assert_eq!(
        markers.left(),
        Vec::<String>::new(),
        "worktree add ran a program"
    );

    // The child plants a git dir of its own and points its `.git` file at it.
    let gd = child_ws.join(".gd");
    std::fs::create_dir_all(&gd).unwrap();
    git(&gd, &["init", "-q", "--bare"]);
    plant_config(&gd.join("config"), &gd.join("hooks"), &markers, "child");
    std::fs::write(child_ws.join(".git"), format!("gitdir: {}\n", gd.display())).unwrap();
    std::fs::write(child_ws.join("new.txt"), "new\n").unwrap();
    touch_changed(&child_ws.join("file.txt"));

    let stat = worktree::diff_stat(&info);
    assert_eq!(markers.left(), Vec::<String>::new(), "diff_stat: {stat:?}");
    let applied = worktree::apply(&info);
    assert_eq!(markers.left(), Vec::<String>::new(), "apply: {applied:?}");
    let _ = worktree::remove(&info);
    assert_eq!(markers.left(), Vec::<String>::new(), "remove ran a program");
}

/// The worktree flow still works through the hardened git: the child's change (a new
/// file, a changed one) shows in the stat and applies to the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_git_worktree_still_applies_a_child_change() {
    use bumblehive::checkpoints::worktree;
    let (_dir, root) = tmp();
    let ws = root.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    git(&ws, &["init", "-q"]);
    std::fs::write(ws.join("a.txt"), "a\n").unwrap();
    git(&ws, &["add", "-A"]);
    git(&ws, &["commit", "-qm", "a"]);
    let (info, child_ws) = worktree::create(&root.join("data"), &ws, "c2").unwrap();
    std::fs::write(child_ws.join("a.txt"), "changed\n").unwrap();
    std::fs::write(child_ws.join("b.txt"), "b\n").unwrap();
    let stat = worktree::diff_stat(&info).unwrap();
    assert!(stat.contains("a.txt") && stat.contains("b.txt"), "{stat}");
    worktree::apply(&info).unwrap();
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "changed\n"
    );
    assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "b\n");
    worktree::remove(&info).unwrap();
    assert!(!child_ws.exists());
}

// ---------------------------------------------------------------------------------------
// The sandbox side of finding 1: what a sandboxed command (real bubblewrap) can do to
// `.git`.

use crate::tools::{RecordingGate, context, yes};
use serde_json::json;

/// Runs `command` with `run_command` in the default sandbox, in `ws`; its result text.
async fn sandboxed(ws: &Path, command: &str) -> String {
    let ctx = context(ws, RecordingGate::new(|_| yes()));
    let tools = crate::tools::with_command(bumblehive::sandbox::CommandSettings::default());
    let result = tokio::time::timeout(
        crate::support::WAIT * 4,
        tools.call(&ctx, "run_command", json!({ "command": command })),
    )
    .await
    .expect("run_command did not return");
    match result {
        Ok(text) => text,
        Err(err) => err.to_string(),
    }
}

fn inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).unwrap().ino()
}

/// Finding 1, variant 1 (and hooks): `.git` cannot be renamed or replaced by a copy
/// whose config and hooks are writable, nor can config, hooks or info be changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_git_sandbox_cannot_rename_replace_or_plant_in_dot_git() {
    let (_dir, root) = tmp();
    let ws = root.join("ws");
    repo_with_commit(&ws);
    let config = std::fs::read(ws.join(".git/config")).unwrap();
    let before = inode(&ws.join(".git"));
    let out = sandboxed(
        &ws,
        "mv .git .git.orig && mkdir .git && cp -a .git.orig/. .git/ && printf '[core]\\n\\tfsmonitor = x\\n' >> .git/config; echo renamed:$?",
    )
    .await;
    assert!(!ws.join(".git.orig").exists(), "{out}");
    assert_eq!(inode(&ws.join(".git")), before, "{out}");
    let out = sandboxed(
        &ws,
        "echo '[core] fsmonitor = x' >> .git/config; touch .git/hooks/pre-commit; \
         mv .git/hooks .git/h2; mv .git/config .git/c2; rm -rf .git/info; \
         echo '* filter=x' > .git/info/attributes; \
         git add -A && git -c user.name=a -c user.email=a@a commit -qm in-sandbox && echo committed",
    )
    .await;
    assert_eq!(
        std::fs::read(ws.join(".git/config")).unwrap(),
        config,
        "{out}"
    );
    assert!(!ws.join(".git/hooks/pre-commit").exists(), "{out}");
    assert!(
        !ws.join(".git/h2").exists() && !ws.join(".git/c2").exists(),
        "{out}"
    );
    assert!(!ws.join(".git/info/attributes").exists(), "{out}");
    // Git itself still works in the sandbox (objects, index, refs).
    assert!(out.contains("committed"), "{out}");
}

/// Finding 1, variant 3: a `.git` file (a submodule or linked worktree) cannot be
/// rewritten, and the git dir it names inside the workspace is protected like `.git`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_git_sandbox_protects_a_git_file_and_its_git_dir() {
    let (_dir, root) = tmp();
    let ws = root.join("ws");
    repo_with_commit(&ws);
    std::fs::rename(ws.join(".git"), ws.join(".gd")).unwrap();
    std::fs::write(ws.join(".git"), "gitdir: .gd\n").unwrap();
    let config = std::fs::read(ws.join(".gd/config")).unwrap();
    let out = sandboxed(
        &ws,
        "printf 'gitdir: /tmp/x\\n' > .git; echo '[core] fsmonitor = x' >> .gd/config; \
         touch .gd/hooks/pre-commit; mv .gd .gd2; printf ../.cd > .gd/commondir; echo done",
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(ws.join(".git")).unwrap(),
        "gitdir: .gd\n",
        "{out}"
    );
    assert_eq!(
        std::fs::read(ws.join(".gd/config")).unwrap(),
        config,
        "{out}"
    );
    assert!(!ws.join(".gd/hooks/pre-commit").exists(), "{out}");
    assert!(
        ws.join(".gd/HEAD").exists() && !ws.join(".gd2").exists(),
        "{out}"
    );
    // A commondir cannot be kept from appearing (git dirs must stay writable), but it
    // is reported in the result.
    assert!(ws.join(".gd/commondir").exists(), "{out}");
    assert!(out.contains(".git/commondir was created"), "{out}");
}

/// Finding 1, variants 2 and 4: what the sandbox cannot prevent is reported in the
/// command's result: a planted `commondir`, a `git init` where there was no `.git`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_git_sandbox_reports_a_new_git_or_commondir() {
    let (_dir, root) = tmp();
    let ws = root.join("ws");
    repo_with_commit(&ws);
    let out = sandboxed(
        &ws,
        "mkdir .cd && printf ../.cd > .git/commondir; echo done",
    )
    .await;
    assert!(
        out.contains("[notice:") && out.contains(".git/commondir was created"),
        "{out}"
    );
    std::fs::remove_file(ws.join(".git/commondir")).unwrap();
    let out = sandboxed(&ws, "echo plain > plain.txt").await;
    assert!(!out.contains("[notice:"), "nothing of .git changed: {out}");

    let top = root.join("mono");
    repo_with_commit(&top);
    let pkg = top.join("pkg");
    std::fs::create_dir_all(&pkg).unwrap();
    let out = sandboxed(&pkg, "git init -q && echo initialised").await;
    assert!(out.contains("initialised"), "{out}");
    assert!(
        out.contains("a new .git appeared in the workspace"),
        "{out}"
    );
}

/// The rest of finding 2: a repository whose config includes a file of the workspace
/// (which a sandboxed command could rewrite between the runtime's config listing and its
/// git command) is not run at all; the prompt says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_git_environment_refuses_a_config_that_includes_a_workspace_file() {
    let markers = Markers::new();
    let (_dir, root) = tmp();
    let ws = root.join("ws");
    repo_with_commit(&ws);
    let inc = ws.join("inc.cfg");
    std::fs::write(
        &inc,
        format!(
            "[filter \"evil\"]\n\tclean = \"{}\"\n",
            markers.program("include-clean")
        ),
    )
    .unwrap();
    let mut config = std::fs::read_to_string(ws.join(".git/config")).unwrap();
    config.push_str("[include]\n\tpath = ../inc.cfg\n");
    std::fs::write(ws.join(".git/config"), config).unwrap();
    let env = Environment::detect(&ws).await;
    assert!(
        matches!(&env.git, GitState::Unknown { reason } if reason.contains("includes")),
        "{:?}",
        env.git
    );
    assert_eq!(markers.left(), Vec::<String>::new());
}

/// Finding 1, variant 4, nested repositories: a repository inside the workspace
/// (`vendor/lib/.git`) is protected as the workspace's `.git` is (its config, hooks and
/// info cannot be changed, it cannot be renamed away), git still works in it, and one
/// a command makes (`git init fresh/repo`, whose config is the command's) is named in
/// the result. The runtime's own git then runs nothing of either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_git_sandbox_protects_nested_repositories() {
    let markers = Markers::new();
    let (_dir, root) = tmp();
    let ws = root.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    git(&ws, &["init", "-q"]);
    let nested = ws.join("vendor/lib");
    repo_with_commit(&nested);
    let config = std::fs::read(nested.join(".git/config")).unwrap();
    let before = inode(&nested.join(".git"));
    let command = format!(
        "cd vendor/lib && printf '[core]\\n\\tfsmonitor = \"{fs} #\"\\n' >> .git/config; \
         printf '#!/bin/sh\\n{hook}\\n' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit; \
         rm -rf .git/info; mv .git .git.orig; \
         git -c user.name=a -c user.email=a@a commit -qam in-sandbox && echo committed; \
         cd ../.. && git init -q fresh/repo && \
         printf '[core]\\n\\tfsmonitor = \"{fresh} #\"\\n' >> fresh/repo/.git/config && echo initialised",
        fs = markers.program("nested-fsmonitor"),
        hook = markers.program("nested-hook"),
        fresh = markers.program("fresh-fsmonitor"),
    );
    let out = sandboxed(&ws, &command).await;
    assert_eq!(
        std::fs::read(nested.join(".git/config")).unwrap(),
        config,
        "{out}"
    );
    assert!(!nested.join(".git/hooks/pre-commit").exists(), "{out}");
    assert!(nested.join(".git/info").exists(), "{out}");
    assert!(!nested.join(".git.orig").exists(), "{out}");
    assert_eq!(inode(&nested.join(".git")), before, "{out}");
    // Git itself still works in the nested repository.
    assert!(out.contains("committed"), "{out}");
    assert!(out.contains("initialised"), "{out}");
    assert!(
        out.contains(&format!(
            "a new repository appeared at {}",
            ws.join("fresh/repo/.git").display()
        )),
        "{out}"
    );
    // The next command protects the new one too.
    let fresh_config = std::fs::read(ws.join("fresh/repo/.git/config")).unwrap();
    let out = sandboxed(&ws, "echo x >> fresh/repo/.git/config; echo done").await;
    assert_eq!(
        std::fs::read(ws.join("fresh/repo/.git/config")).unwrap(),
        fresh_config,
        "{out}"
    );
    assert!(!out.contains("[notice:"), "{out}");
    // A repository made under the name of one moved away is new too.
    let out = sandboxed(
        &ws,
        "mv fresh/repo fresh/old && git init -q fresh/repo && echo again",
    )
    .await;
    assert!(out.contains("again"), "{out}");
    assert!(
        out.contains(&format!(
            "a new repository appeared at {}",
            ws.join("fresh/repo/.git").display()
        )) && !out.contains("fresh/old/.git (its"),
        "{out}"
    );
    // The runtime's git in either (a session opened there) runs nothing planted.
    for repo in [nested.clone(), ws.join("fresh/repo")] {
        touch_changed(&nested.join("file.txt"));
        let env = Environment::detect(&repo).await;
        assert_repository(&env.git);
    }
    assert_eq!(markers.left(), Vec::<String>::new());
}
