//! Workspace tools and approvals (issue 4): each tool driven directly through `ToolRegistry::call` with a recording gate, and the approval flow end to end through a real service with a scripted provider.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bumblehive::config::Config;
use bumblehive::controller::{SessionController, Subscription};
use bumblehive::protocol::{Event, Message, Role, ToolCall, commands::DecideApproval};
use bumblehive::provider::{
    ModelProvider, ModelRequest, ModelResponse, ProviderError, ProviderSink, fixed_provider,
};
use bumblehive::service::{RuntimeService, ServiceOptions};
use bumblehive::tools::{
    Access, ApprovalAsk, ApprovalGate, Decision, ToolContext, ToolError, ToolRegistry,
};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::support::WAIT;

// ---------------------------------------------------------------------------------------
// Driving tools directly.

type Rule = Box<dyn Fn(&ApprovalAsk) -> Decision + Send + Sync>;

/// An approval gate that records every ask and decides by a rule.
pub struct RecordingGate {
    pub asks: Mutex<Vec<ApprovalAsk>>,
    rule: Rule,
}

impl RecordingGate {
    pub fn new(rule: impl Fn(&ApprovalAsk) -> Decision + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(RecordingGate {
            asks: Mutex::new(Vec::new()),
            rule: Box::new(rule),
        })
    }

    /// Approves everything.
    pub fn approving() -> Arc<Self> {
        Self::new(|_| yes())
    }

    /// Approves what is inside the workspace, denies everything outside: a person who
    /// never lets an agent out. With it, anything that reaches outside is a tool's fault.
    pub fn inside_only() -> Arc<Self> {
        Self::new(|ask| {
            if ask.access == Access::Outside {
                no("outside")
            } else {
                yes()
            }
        })
    }

    pub fn asks(&self) -> Vec<ApprovalAsk> {
        self.asks.lock().unwrap().clone()
    }

    /// Asks a person would have been shown (free reads inside excluded).
    pub fn prompts(&self) -> Vec<ApprovalAsk> {
        self.asks()
            .into_iter()
            .filter(|a| a.access != Access::Read)
            .collect()
    }

    pub fn clear(&self) {
        self.asks.lock().unwrap().clear();
    }
}

pub fn yes() -> Decision {
    Decision {
        approved: true,
        reason: None,
    }
}

pub fn no(reason: &str) -> Decision {
    Decision {
        approved: false,
        reason: Some(reason.into()),
    }
}

#[async_trait]
impl ApprovalGate for RecordingGate {
    async fn ask(&self, ask: ApprovalAsk, _cancel: &CancellationToken) -> Decision {
        let decision = (self.rule)(&ask);
        self.asks.lock().unwrap().push(ask);
        decision
    }
}

pub fn context(workspace: &Path, gate: Arc<dyn ApprovalGate>) -> ToolContext {
    ToolContext {
        session_id: "direct".into(),
        workspace: workspace.to_path_buf(),
        call_id: "call-1".into(),
        cancel: CancellationToken::new(),
        approvals: gate,
        delegator: None,
        run_config: Default::default(),
        secret_env: Vec::new(),
        checkpoints: None,
    }
}

/// The standard tools with `run_command` unsandboxed (policy `off`): the process-group
/// tests below report host pids, which a sandboxed command (own pid namespace) cannot.
/// The sandboxed path has its own tests in `tests/security.rs`.
pub fn unsandboxed() -> ToolRegistry {
    with_command(bumblehive::sandbox::CommandSettings {
        policy: bumblehive::sandbox::CommandPolicy::Off,
        ..Default::default()
    })
}

/// The standard tools, in their order, with `run_command` on the given settings.
pub fn with_command(settings: bumblehive::sandbox::CommandSettings) -> ToolRegistry {
    ToolRegistry::standard_with(bumblehive::tools::RunCommand::configured(settings))
}

async fn call_off(ctx: &ToolContext, tool: &str, args: Value) -> Result<String, ToolError> {
    tokio::time::timeout(WAIT, unsandboxed().call(ctx, tool, args))
        .await
        .unwrap_or_else(|_| panic!("{tool} did not return within {WAIT:?}"))
}

pub async fn call(ctx: &ToolContext, tool: &str, args: Value) -> Result<String, ToolError> {
    tokio::time::timeout(WAIT, ToolRegistry::standard().call(ctx, tool, args))
        .await
        .unwrap_or_else(|_| panic!("{tool} did not return within {WAIT:?}"))
}

/// A workspace in a temp dir, with the temp dir's root for things outside it.
struct Ws {
    dir: tempfile::TempDir,
    ws: PathBuf,
}

impl Ws {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        Ws { dir, ws }
    }

    fn put(&self, rel: &str, content: impl AsRef<[u8]>) {
        let path = self.ws.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }

    fn get(&self, rel: &str) -> String {
        std::fs::read_to_string(self.ws.join(rel)).unwrap()
    }

    fn outside(&self) -> &Path {
        self.dir.path()
    }
}

fn err_text(result: Result<String, ToolError>) -> String {
    match result {
        Ok(text) => panic!("expected an error, got Ok({text:?})"),
        Err(err) => err.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_file_ranges_caps_and_refusals() {
    let w = Ws::new();
    let gate = RecordingGate::approving();
    let ctx = context(&w.ws, gate.clone());
    w.put("lines.txt", "one\ntwo\nthree\nfour\n");
    assert_eq!(
        call(&ctx, "read_file", json!({"path": "lines.txt"}))
            .await
            .unwrap(),
        "one\ntwo\nthree\nfour\n"
    );
    assert_eq!(
        call(
            &ctx,
            "read_file",
            json!({"path": "lines.txt", "start_line": 2, "end_line": 3})
        )
        .await
        .unwrap(),
        "two\nthree\n"
    );
    assert_eq!(
        call(
            &ctx,
            "read_file",
            json!({"path": "lines.txt", "start_line": 4})
        )
        .await
        .unwrap(),
        "four\n"
    );
    let past = err_text(
        call(
            &ctx,
            "read_file",
            json!({"path": "lines.txt", "start_line": 9}),
        )
        .await,
    );
    assert!(past.contains("has 4 lines"), "{past}");
    let backwards = err_text(
        call(
            &ctx,
            "read_file",
            json!({"path": "lines.txt", "start_line": 3, "end_line": 2}),
        )
        .await,
    );
    assert!(backwards.contains("before start_line"), "{backwards}");
    // Over the cap: cut at a whole line, with a marker saying how to see more.
    let line = "x".repeat(99) + "\n";
    w.put("big.txt", line.repeat(5000));
    let big = call(&ctx, "read_file", json!({"path": "big.txt"}))
        .await
        .unwrap();
    assert!(big.len() < 300 * 1024);
    let (body, marker) = big.rsplit_once('\n').unwrap();
    assert!(
        marker.starts_with("[truncated: showing lines 1-"),
        "{marker}"
    );
    assert!(marker.contains("of 500000 bytes"), "{marker}");
    assert!(body.lines().all(|l| l.len() == 99));
    // A range deep in the big file works.
    let deep = call(
        &ctx,
        "read_file",
        json!({"path": "big.txt", "start_line": 4999}),
    )
    .await
    .unwrap();
    assert_eq!(deep, line.repeat(2));
    // Binary, folders, pipes: refused with a message, never hanging.
    w.put("blob.bin", b"PNG\x00\x01\x02binary");
    let binary = err_text(call(&ctx, "read_file", json!({"path": "blob.bin"})).await);
    assert!(binary.contains("binary"), "{binary}");
    std::fs::create_dir_all(w.ws.join("folder")).unwrap();
    let folder = err_text(call(&ctx, "read_file", json!({"path": "folder"})).await);
    assert!(folder.contains("directory"), "{folder}");
    let fifo = w.ws.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let pipe = err_text(call(&ctx, "read_file", json!({"path": "fifo"})).await);
    assert!(pipe.contains("not a regular file"), "{pipe}");
    let missing = err_text(call(&ctx, "read_file", json!({"path": "nope.txt"})).await);
    assert!(missing.contains("no such file"), "{missing}");
    w.put("empty.txt", "");
    assert_eq!(
        call(&ctx, "read_file", json!({"path": "empty.txt"}))
            .await
            .unwrap(),
        "[empty file]"
    );
    // Inside the workspace nothing was shown to a person.
    assert!(gate.prompts().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_file_asks_with_a_diff_and_creates_folders() {
    let w = Ws::new();
    let gate = RecordingGate::approving();
    let ctx = context(&w.ws, gate.clone());
    w.put("a.txt", "keep\nold\n");
    let done = call(
        &ctx,
        "write_file",
        json!({"path": "a.txt", "content": "keep\nnew\n"}),
    )
    .await
    .unwrap();
    assert_eq!(done, "Wrote 9 bytes to a.txt");
    assert_eq!(w.get("a.txt"), "keep\nnew\n");
    let asks = gate.prompts();
    assert_eq!(asks.len(), 1);
    assert_eq!(asks[0].access, Access::Change);
    let diff = asks[0].diff.clone().unwrap();
    assert!(
        diff.contains("--- a/a.txt") && diff.contains("+++ b/a.txt"),
        "{diff}"
    );
    assert!(
        diff.contains("-old\n") && diff.contains("+new\n") && diff.contains(" keep\n"),
        "{diff}"
    );
    let created = call(
        &ctx,
        "write_file",
        json!({"path": "deep/er/b.txt", "content": "hi"}),
    )
    .await
    .unwrap();
    assert_eq!(created, "Created deep/er/b.txt (2 bytes)");
    assert_eq!(w.get("deep/er/b.txt"), "hi");
    std::fs::create_dir_all(w.ws.join("folder")).unwrap();
    gate.clear();
    let folder = err_text(
        call(
            &ctx,
            "write_file",
            json!({"path": "folder", "content": "x"}),
        )
        .await,
    );
    assert!(folder.contains("directory"), "{folder}");
    assert!(
        gate.asks().is_empty(),
        "no approval for a write that cannot happen"
    );
    // Denied: nothing written, the reason reaches the model.
    let deny = RecordingGate::new(|_| no("not now"));
    let ctx = context(&w.ws, deny);
    let denied = err_text(
        call(
            &ctx,
            "write_file",
            json!({"path": "a.txt", "content": "gone"}),
        )
        .await,
    );
    assert_eq!(denied, "denied by user: not now");
    assert_eq!(w.get("a.txt"), "keep\nnew\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edit_file_edge_cases() {
    let w = Ws::new();
    let gate = RecordingGate::approving();
    let ctx = context(&w.ws, gate.clone());
    let edit = |path: &str, old: &str, new: &str| json!({"path": path, "old_string": old, "new_string": new});

    // Unique: replaced, with a diff in the approval.
    w.put("f.rs", "fn a() {}\nfn b() {}\n");
    let done = call(&ctx, "edit_file", edit("f.rs", "fn b() {}", "fn b() { 1 }"))
        .await
        .unwrap();
    assert_eq!(done, "Replaced 1 occurrence in f.rs");
    assert_eq!(w.get("f.rs"), "fn a() {}\nfn b() { 1 }\n");
    let diff = gate.prompts()[0].diff.clone().unwrap();
    assert!(
        diff.contains("-fn b() {}") && diff.contains("+fn b() { 1 }"),
        "{diff}"
    );

    // Absent, not unique, empty, no-op, missing file: clear errors, nothing asked or changed.
    gate.clear();
    let absent = err_text(call(&ctx, "edit_file", edit("f.rs", "fn c()", "x")).await);
    assert!(absent.contains("not found in f.rs"), "{absent}");
    w.put("dup.txt", "x = 1\ny = 2\nx = 1\nx = 1\n");
    let dup = err_text(call(&ctx, "edit_file", edit("dup.txt", "x = 1", "x = 3")).await);
    assert!(
        dup.contains("occurs 3 times") && dup.contains("lines 1, 3, 4"),
        "{dup}"
    );
    assert!(dup.contains("replace_all"), "{dup}");
    let empty = err_text(call(&ctx, "edit_file", edit("dup.txt", "", "x")).await);
    assert!(empty.contains("old_string is empty"), "{empty}");
    let same = err_text(call(&ctx, "edit_file", edit("dup.txt", "y", "y")).await);
    assert!(same.contains("the same"), "{same}");
    let missing = err_text(call(&ctx, "edit_file", edit("none.txt", "a", "b")).await);
    assert!(
        missing.contains("does not exist") && missing.contains("write_file"),
        "{missing}"
    );
    assert!(gate.asks().is_empty());
    assert_eq!(w.get("dup.txt"), "x = 1\ny = 2\nx = 1\nx = 1\n");

    // replace_all replaces every occurrence.
    let mut all = edit("dup.txt", "x = 1", "x = 3");
    all["replace_all"] = json!(true);
    assert_eq!(
        call(&ctx, "edit_file", all).await.unwrap(),
        "Replaced 3 occurrences in dup.txt"
    );
    assert_eq!(w.get("dup.txt"), "x = 3\ny = 2\nx = 3\nx = 3\n");

    // Line endings and whitespace: exact matching, with a hint when a looser one would hit.
    w.put("crlf.txt", "one\r\ntwo\r\nthree\r\n");
    let crlf = err_text(call(&ctx, "edit_file", edit("crlf.txt", "one\ntwo", "1\n2")).await);
    assert!(crlf.contains("CRLF"), "{crlf}");
    call(&ctx, "edit_file", edit("crlf.txt", "one\r\ntwo", "1\r\n2"))
        .await
        .unwrap();
    assert_eq!(w.get("crlf.txt"), "1\r\n2\r\nthree\r\n");
    w.put("ws.py", "def f():\n    return 1\n");
    let indent = err_text(
        call(
            &ctx,
            "edit_file",
            edit("ws.py", "def f():\n  return 1", "x"),
        )
        .await,
    );
    assert!(indent.contains("whitespace"), "{indent}");

    // Unicode around the edit survives byte for byte; multi-line replacement.
    w.put("u.txt", "héllo wörld\n→ arrow\nend\n");
    call(
        &ctx,
        "edit_file",
        edit("u.txt", "wörld\n→ arrow", "мир\n← back"),
    )
    .await
    .unwrap();
    assert_eq!(w.get("u.txt"), "héllo мир\n← back\nend\n");

    // Binary files are not edited.
    w.put("b.bin", b"abc\x00def");
    let binary = err_text(call(&ctx, "edit_file", edit("b.bin", "abc", "x")).await);
    assert!(binary.contains("binary"), "{binary}");

    // Through a symlink inside the workspace: the target is edited, the link stays a link.
    std::os::unix::fs::symlink("f.rs", w.ws.join("link.rs")).unwrap();
    call(
        &ctx,
        "edit_file",
        edit("link.rs", "fn a() {}", "fn a() { 0 }"),
    )
    .await
    .unwrap();
    assert!(w.get("f.rs").starts_with("fn a() { 0 }"));
    assert!(
        std::fs::symlink_metadata(w.ws.join("link.rs"))
            .unwrap()
            .file_type()
            .is_symlink()
    );

    // Denied with a reason: unchanged, the reason is in the error the model sees.
    let ctx_no = context(&w.ws, RecordingGate::new(|_| no("keep b as it is")));
    let denied = err_text(
        call(
            &ctx_no,
            "edit_file",
            edit("f.rs", "fn b() { 1 }", "fn b() {}"),
        )
        .await,
    );
    assert_eq!(denied, "denied by user: keep b as it is");
    assert!(w.get("f.rs").contains("fn b() { 1 }"));

    // Changed by someone else while waiting for approval: the edit is not applied over it.
    let target = w.ws.join("race.txt");
    w.put("race.txt", "alpha\nbeta\n");
    let racer = target.clone();
    let ctx_race = context(
        &w.ws,
        RecordingGate::new(move |_| {
            std::fs::write(&racer, "alpha\nbeta\ngamma\n").unwrap();
            yes()
        }),
    );
    let raced = err_text(call(&ctx_race, "edit_file", edit("race.txt", "beta", "BETA")).await);
    assert!(raced.contains("changed while the edit waited"), "{raced}");
    assert_eq!(w.get("race.txt"), "alpha\nbeta\ngamma\n");
}

/// A workspace whose .gitignore files hide some files with the word "needle" in them.
fn ignore_fixture() -> Ws {
    let w = Ws::new();
    w.put(".gitignore", "target/\n*.log\n");
    w.put("src/main.rs", "fn main() { needle(); }\n");
    w.put("src/lib.rs", "// no match here\n");
    w.put("target/debug/out.rs", "needle in build output\n");
    w.put("debug.log", "needle in a log\n");
    w.put("sub/.gitignore", "secret.txt\n");
    w.put("sub/secret.txt", "needle ignored by a nested .gitignore\n");
    w.put("sub/kept.txt", "a Needle with a capital\n");
    w.put(".hidden/conf.rs", "needle in a dotfolder\n");
    w.put(".git/config", "needle in git internals\n");
    w.put("data.bin", b"needle\x00\x01binary");
    std::fs::create_dir_all(w.outside().join("elsewhere")).unwrap();
    std::fs::write(w.outside().join("elsewhere/x.rs"), "needle outside\n").unwrap();
    std::os::unix::fs::symlink(w.outside().join("elsewhere"), w.ws.join("linked")).unwrap();
    w
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grep_honours_gitignore_and_skips_binaries_and_links() {
    let w = ignore_fixture();
    let gate = RecordingGate::inside_only();
    let ctx = context(&w.ws, gate.clone());
    let found = call(&ctx, "grep", json!({"pattern": "needle"}))
        .await
        .unwrap();
    let files: Vec<&str> = found
        .lines()
        .map(|l| l.split(':').next().unwrap())
        .collect();
    assert_eq!(files, vec![".hidden/conf.rs", "src/main.rs"], "{found}");
    assert!(
        found.contains("src/main.rs:1:fn main() { needle(); }"),
        "{found}"
    );
    let ci = call(
        &ctx,
        "grep",
        json!({"pattern": "NEEDLE", "case_insensitive": true, "path": "sub"}),
    )
    .await
    .unwrap();
    assert_eq!(ci, "sub/kept.txt:1:a Needle with a capital");
    let filtered = call(
        &ctx,
        "grep",
        json!({"pattern": "needle", "glob": "src/*.rs"}),
    )
    .await
    .unwrap();
    assert_eq!(filtered.lines().count(), 1, "{filtered}");
    let one_file = call(
        &ctx,
        "grep",
        json!({"pattern": "needle", "path": "src/main.rs"}),
    )
    .await
    .unwrap();
    assert!(one_file.starts_with("src/main.rs:1:"), "{one_file}");
    let fixed = call(
        &ctx,
        "grep",
        json!({"pattern": "needle()", "fixed_strings": true}),
    )
    .await
    .unwrap();
    assert!(fixed.starts_with("src/main.rs:1:"), "{fixed}");
    let none = call(&ctx, "grep", json!({"pattern": "haystack"}))
        .await
        .unwrap();
    assert!(none.starts_with("No matches"), "{none}");
    let bad = err_text(call(&ctx, "grep", json!({"pattern": "("})).await);
    assert!(bad.contains("bad regular expression"), "{bad}");
    for i in 0..30 {
        w.put(&format!("many/{i:02}.txt"), "hit\nhit\n");
    }
    let capped = call(&ctx, "grep", json!({"pattern": "hit", "max_results": 5}))
        .await
        .unwrap();
    assert_eq!(capped.lines().count(), 6, "{capped}");
    assert!(
        capped.ends_with("[truncated: stopped after 5 matches; narrow the pattern, path or glob]")
    );
    assert!(gate.prompts().is_empty(), "searching inside never asks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn glob_and_list_dir_honour_gitignore() {
    let w = ignore_fixture();
    let gate = RecordingGate::inside_only();
    let ctx = context(&w.ws, gate.clone());
    let rs = call(&ctx, "glob", json!({"pattern": "**/*.rs"}))
        .await
        .unwrap();
    assert_eq!(rs, ".hidden/conf.rs\nsrc/lib.rs\nsrc/main.rs");
    let top = call(&ctx, "glob", json!({"pattern": "*.rs", "path": "src"}))
        .await
        .unwrap();
    assert_eq!(top, "src/lib.rs\nsrc/main.rs");
    let logs = call(&ctx, "glob", json!({"pattern": "*.log"}))
        .await
        .unwrap();
    assert!(logs.starts_with("No files match"), "{logs}");
    let all = call(
        &ctx,
        "glob",
        json!({"pattern": "**/*.{rs,log}", "include_ignored": true}),
    )
    .await
    .unwrap();
    assert!(
        all.contains("target/debug/out.rs") && all.contains("debug.log"),
        "{all}"
    );
    assert!(
        !all.contains(".git/") && !all.contains("elsewhere"),
        "{all}"
    );
    let escape = err_text(call(&ctx, "glob", json!({"pattern": "../**"})).await);
    assert!(
        escape.contains("cannot start with `/` or contain `..`"),
        "{escape}"
    );

    let listing = call(&ctx, "list_dir", json!({})).await.unwrap();
    let names: Vec<&str> = listing.lines().collect();
    assert!(
        names.contains(&"src/") && names.contains(&".hidden/") && names.contains(&"sub/"),
        "{listing}"
    );
    assert!(
        names.iter().any(|l| l.starts_with(".gitignore (")),
        "{listing}"
    );
    assert!(
        names.iter().any(|l| l.starts_with("linked -> ")),
        "{listing}"
    );
    assert!(
        !listing.contains("target") && !listing.contains("debug.log") && !listing.contains(".git/"),
        "{listing}"
    );
    let deep = call(&ctx, "list_dir", json!({"path": "sub", "depth": 2}))
        .await
        .unwrap();
    assert_eq!(deep, "sub/.gitignore (11 bytes)\nsub/kept.txt (24 bytes)");
    let everything = call(&ctx, "list_dir", json!({"include_ignored": true}))
        .await
        .unwrap();
    assert!(
        everything.contains("target/") && everything.contains("debug.log"),
        "{everything}"
    );
    let file = err_text(call(&ctx, "list_dir", json!({"path": "src/main.rs"})).await);
    assert!(file.contains("not a directory"), "{file}");
    assert!(gate.prompts().is_empty());
}

// ---------------------------------------------------------------------------------------
// run_command: output, timeout, cancel, drop — and no process left behind.

/// A FIFO in the workspace the command writes its pids to; read without blocking a thread.
async fn pid_pipe(ws: &Path) -> tokio::net::unix::pipe::Receiver {
    let path = ws.join("pids");
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // read_write: no EOF before the command has opened it for writing.
    tokio::net::unix::pipe::OpenOptions::new()
        .read_write(true)
        .open_receiver(&path)
        .unwrap()
}

async fn read_pids(pipe: &mut tokio::net::unix::pipe::Receiver) -> Vec<i32> {
    let mut text = String::new();
    tokio::time::timeout(WAIT, async {
        let mut byte = [0u8; 1];
        while !text.ends_with('\n') {
            pipe.read_exact(&mut byte).await.unwrap();
            text.push(byte[0] as char);
        }
    })
    .await
    .expect("the command never wrote its pids");
    text.split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

/// Waits (at most [`WAIT`]) until `pid` has exited, by its pidfd (readable on exit).
/// A zombie has exited: reaping orphans is init's job, not the tool's.
async fn wait_gone(pid: i32) {
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ESRCH),
            "pidfd_open({pid})"
        );
        return;
    }
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
    // SAFETY: the pidfd is owned here and lives as long as the AsyncFd.
    let fd = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    }
    .unwrap();
    tokio::time::timeout(WAIT, fd.readable())
        .await
        .unwrap_or_else(|_| panic!("process {pid} is still running"))
        .unwrap()
        .retain_ready();
}

/// `$$` is the shell (the group leader), `$!` a background child in the same group.
const SPAWN_AND_WAIT: &str = "sleep 1000 & echo $$ $! > pids; wait";

/// Starts a `run_command` call in its own task and returns it with the pids the command
/// reported (its shell and the background child), once both exist.
async fn start_spawn_and_wait(
    ctx: &ToolContext,
    ws: &Path,
    arguments: Value,
) -> (tokio::task::JoinHandle<Result<String, ToolError>>, Vec<i32>) {
    let mut pipe = pid_pipe(ws).await;
    let call = tokio::spawn({
        let ctx = ctx.clone();
        async move { unsandboxed().call(&ctx, "run_command", arguments).await }
    });
    let pids = read_pids(&mut pipe).await;
    (call, pids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_command_output_exit_code_and_cap() {
    let w = Ws::new();
    let gate = RecordingGate::approving();
    let ctx = context(&w.ws, gate.clone());
    w.put("hello.txt", "hi");
    let out = call_off(
        &ctx,
        "run_command",
        json!({"command": "cat hello.txt; echo; echo err >&2; exit 3"}),
    )
    .await
    .unwrap();
    assert!(out.starts_with("exit code: 3\n"), "{out}");
    assert!(out.contains("hi") && out.contains("err"), "{out}");
    let asks = gate.prompts();
    assert_eq!(asks.len(), 1);
    assert_eq!(asks[0].access, Access::Change);
    let big = call_off(
        &ctx,
        "run_command",
        json!({"command": "head -c 200000 /dev/zero | tr '\\0' x; echo END"}),
    )
    .await
    .unwrap();
    assert!(big.len() < 40 * 1024, "{}", big.len());
    assert!(
        big.contains("[truncated: ") && big.trim_end().ends_with("END"),
        "cut in the middle"
    );
    // Secret variables (the provider's key) are not passed on; the rest of the
    // environment is. HOME stands in for a key: it is set in every test environment.
    assert!(std::env::var("HOME").is_ok_and(|h| !h.is_empty()));
    let hidden = ToolContext {
        secret_env: vec!["HOME".into()],
        ..ctx.clone()
    };
    let printed = call_off(
        &hidden,
        "run_command",
        json!({"command": "echo \"[$HOME]\" \"$PATH\""}),
    )
    .await
    .unwrap();
    assert!(printed.starts_with("exit code: 0\n[] /"), "{printed}");
    let sub = call_off(&ctx, "run_command", json!({"command": "pwd", "cwd": "."}))
        .await
        .unwrap();
    assert!(
        sub.contains(w.ws.canonicalize().unwrap().to_str().unwrap()),
        "{sub}"
    );
    let outside = RecordingGate::inside_only();
    let ctx_out = context(&w.ws, outside.clone());
    let denied = err_text(
        call_off(
            &ctx_out,
            "run_command",
            json!({"command": "pwd", "cwd": ".."}),
        )
        .await,
    );
    assert!(denied.starts_with("denied by user"), "{denied}");
    assert_eq!(outside.asks()[0].access, Access::Outside);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_command_leaves_no_background_process() {
    let w = Ws::new();
    let ctx = context(&w.ws, RecordingGate::approving());
    let mut pipe = pid_pipe(&w.ws).await;
    let out = call_off(
        &ctx,
        "run_command",
        json!({"command": "sleep 1000 & echo $$ $! > pids; echo started"}),
    )
    .await
    .unwrap();
    assert!(out.starts_with("exit code: 0\nstarted"), "{out}");
    for pid in read_pids(&mut pipe).await {
        wait_gone(pid).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_command_timeout_kills_the_process_group() {
    let w = Ws::new();
    let ctx = context(&w.ws, RecordingGate::approving());
    let (call, pids) = start_spawn_and_wait(
        &ctx,
        &w.ws,
        json!({"command": SPAWN_AND_WAIT, "timeout_secs": 1}),
    )
    .await;
    assert_eq!(pids.len(), 2);
    let result = tokio::time::timeout(WAIT, call).await.unwrap().unwrap();
    let text = err_text(result);
    assert!(text.contains("timed out after 1 s"), "{text}");
    for pid in pids {
        wait_gone(pid).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_command_cancel_kills_the_process_group() {
    let w = Ws::new();
    let ctx = context(&w.ws, RecordingGate::approving());
    let (call, pids) = start_spawn_and_wait(&ctx, &w.ws, json!({"command": SPAWN_AND_WAIT})).await;
    ctx.cancel.cancel();
    let result = tokio::time::timeout(WAIT, call)
        .await
        .expect("run_command did not return promptly on cancel")
        .unwrap();
    assert!(err_text(result).contains("cancelled"));
    for pid in pids {
        wait_gone(pid).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_command_dropped_call_kills_the_process_group() {
    let w = Ws::new();
    let ctx = context(&w.ws, RecordingGate::approving());
    let (call, pids) = start_spawn_and_wait(&ctx, &w.ws, json!({"command": SPAWN_AND_WAIT})).await;
    // The run loop drops the calls a cancel left open; dropping must kill the group too.
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    for pid in pids {
        wait_gone(pid).await;
    }
}

// ---------------------------------------------------------------------------------------
// End to end: a real service, a scripted model, approvals decided like a person would.

type Script = Box<dyn Fn(&ModelRequest) -> ModelResponse + Send + Sync>;

/// A model that answers each request with what the script says, recording the requests.
pub struct Scripted {
    script: Script,
    requests: watch::Sender<Vec<ModelRequest>>,
}

impl Scripted {
    pub fn requests(&self) -> Vec<ModelRequest> {
        self.requests.borrow().clone()
    }
}

#[async_trait]
impl ModelProvider for Scripted {
    async fn generate(
        &self,
        request: ModelRequest,
        _sink: ProviderSink<'_>,
    ) -> Result<ModelResponse, ProviderError> {
        let response = (self.script)(&request);
        self.requests.send_modify(|r| r.push(request));
        Ok(response)
    }
}

fn tool_call(id: &str, name: &str, arguments: Value) -> ModelResponse {
    ModelResponse::tool_calls(vec![ToolCall {
        id: id.into(),
        name: name.into(),
        arguments,
    }])
}

/// The first user message (the task), and the tool results so far.
fn first_user(request: &ModelRequest) -> &str {
    request.messages[1].text()
}

fn tool_results(request: &ModelRequest) -> Vec<&Message> {
    request
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .collect()
}

fn tool_names(request: &ModelRequest) -> Vec<String> {
    request.tools.iter().map(|t| t.name.clone()).collect()
}

struct Fixture {
    service: RuntimeService,
    provider: Arc<Scripted>,
    ws: PathBuf,
    _dir: tempfile::TempDir,
}

impl Fixture {
    fn new(
        config: Value,
        script: impl Fn(&ModelRequest) -> ModelResponse + Send + Sync + 'static,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        let provider = Arc::new(Scripted {
            script: Box::new(script),
            requests: watch::channel(Vec::new()).0,
        });
        let service = RuntimeService::new(ServiceOptions {
            data_dir: dir.path().join("data"),
            config_path: None,
            config: Some(Config::default().patched(&config).unwrap()),
            provider_factory: fixed_provider(provider.clone()),
            tools: Some(unsandboxed()),
        })
        .unwrap();
        Fixture {
            service,
            provider,
            ws,
            _dir: dir,
        }
    }

    /// A new session in the workspace, subscribed, with `task` submitted.
    fn start(&self, task: &str) -> (Arc<SessionController>, Subscription) {
        let info = self
            .service
            .create_session(self.ws.to_str().unwrap(), None)
            .unwrap();
        let controller = self.service.controller(&info.session_id).unwrap();
        let (events, _) = controller.subscribe();
        controller.submit(task.into(), None).unwrap();
        (controller, events)
    }

    fn decide(
        &self,
        session_id: &str,
        approval: &Value,
        approved: bool,
        remember: bool,
        reason: Option<&str>,
    ) {
        self.service
            .decide_approval(DecideApproval {
                session_id: session_id.into(),
                approval_id: approval["approval_id"].as_str().unwrap().into(),
                approved,
                remember,
                reason: reason.map(String::from),
            })
            .unwrap();
    }

    async fn shutdown(self) {
        tokio::time::timeout(WAIT, self.service.shutdown())
            .await
            .expect("shutdown hung");
        assert_eq!(self.service.active_runs(), 0);
    }
}

/// The next event (as JSON) that satisfies `pred`, within [`WAIT`]; others are skipped.
async fn next_where(events: &mut Subscription, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    tokio::time::timeout(WAIT, async {
        loop {
            let event: Event = events.next_event().await.expect("event stream closed");
            let value = serde_json::to_value(&event).unwrap();
            if pred(&value) {
                return value;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// Everything up to and including the first event that satisfies `pred`.
async fn events_until(
    events: &mut Subscription,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> Vec<Value> {
    let mut seen = Vec::new();
    tokio::time::timeout(WAIT, async {
        loop {
            let event: Event = events.next_event().await.expect("event stream closed");
            let value = serde_json::to_value(&event).unwrap();
            let done = pred(&value);
            seen.push(value);
            if done {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}; saw {seen:#?}"));
    seen
}

fn is_type(value: &Value, kind: &str) -> bool {
    value["type"] == kind
}

/// Parent delegates "WRITE" to a child titled "Scribe"; the child writes notes.txt.
fn delegating_script(request: &ModelRequest) -> ModelResponse {
    let results = tool_results(request);
    if first_user(request).contains("\nTask:\nWRITE") {
        return match results.last() {
            None => tool_call(
                "child-write",
                "write_file",
                json!({"path": "notes.txt", "content": "hello from child\n"}),
            ),
            Some(last) => ModelResponse::text(format!("child done: {}", last.text())),
        };
    }
    let reports: Vec<&str> = request
        .messages
        .iter()
        .filter(|m| m.role == Role::User && m.text().starts_with("[Background tool result]"))
        .map(|m| m.text())
        .collect();
    if results.is_empty() {
        tool_call(
            "delegate",
            "sub_agent",
            json!({"title": "Scribe", "task": "WRITE notes.txt"}),
        )
    } else if reports.is_empty() {
        ModelResponse::text("parent waiting")
    } else {
        ModelResponse::text(format!("parent saw: {}", reports.join("\n")))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_write_approval_reaches_parent_subscriber_and_child_finishes() {
    let fx = Fixture::new(json!({}), delegating_script);
    let (parent, mut events) = fx.start("please delegate");
    let parent_id = parent.session_id().to_string();
    let created = next_where(&mut events, "session_created", |v| {
        is_type(v, "session_created")
    })
    .await;
    let child_id = created["session_id"].as_str().unwrap().to_string();
    let request = next_where(&mut events, "approval_request", |v| {
        is_type(v, "approval_request")
    })
    .await;
    // The person sees it in the parent's window, tagged with the child.
    assert_eq!(request["session_id"], child_id.as_str());
    assert_eq!(request["parent_session_id"], parent_id.as_str());
    assert_eq!(request["title"], "Scribe");
    assert_eq!(request["tool"], "write_file");
    assert_eq!(request["arguments"]["path"], "notes.txt");
    assert_eq!(request["rememberable"], true);
    let diff = request["diff"].as_str().unwrap();
    assert!(
        diff.contains("+++ b/notes.txt") && diff.contains("+hello from child"),
        "{diff}"
    );
    // A reconnecting UI finds it in the parent's snapshot; the child waits, nothing written.
    let (_again, snapshot) = parent.subscribe();
    assert_eq!(snapshot.approvals.len(), 1);
    assert_eq!(serde_json::to_value(&snapshot.approvals[0]).unwrap(), {
        let mut info = request.clone();
        info.as_object_mut().unwrap().remove("type");
        info
    });
    let child = fx.service.controller(&child_id).unwrap();
    assert!(child.is_running());
    assert!(!fx.ws.join("notes.txt").exists());
    // Decided in the parent's window with the child's approval id.
    fx.decide(&parent_id, &request, true, false, None);
    let resolved = next_where(&mut events, "approval_resolved", |v| {
        is_type(v, "approval_resolved")
    })
    .await;
    assert_eq!(resolved["session_id"], child_id.as_str());
    assert_eq!(resolved["approved"], true);
    let child_result = next_where(&mut events, "child result", |v| {
        is_type(v, "result") && v["session_id"] == child_id.as_str()
    })
    .await;
    assert_eq!(
        child_result["content"],
        "child done: Created notes.txt (17 bytes)"
    );
    let parent_result = next_where(&mut events, "parent result with report", |v| {
        is_type(v, "result")
            && v["session_id"] == parent_id.as_str()
            && v["content"].as_str().unwrap().starts_with("parent saw:")
    })
    .await;
    assert!(
        parent_result["content"]
            .as_str()
            .unwrap()
            .contains("child done: Created notes.txt")
    );
    assert_eq!(
        std::fs::read_to_string(fx.ws.join("notes.txt")).unwrap(),
        "hello from child\n"
    );
    assert!(parent.snapshot().approvals.is_empty());
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_parent_leaves_a_childs_approval_open_until_decided() {
    let fx = Fixture::new(json!({}), delegating_script);
    let (parent, mut events) = fx.start("please delegate");
    let parent_id = parent.session_id().to_string();
    let request = next_where(&mut events, "approval_request", |v| {
        is_type(v, "approval_request")
    })
    .await;
    let child_id = request["session_id"].as_str().unwrap().to_string();
    parent.cancel().await;
    // Never auto-denied: still open, still shown to a reconnecting parent window.
    let (mut events, snapshot) = parent.subscribe();
    assert_eq!(snapshot.approvals.len(), 1);
    assert_eq!(snapshot.approvals[0].session_id, child_id);
    assert!(fx.service.controller(&child_id).unwrap().is_running());
    fx.decide(&parent_id, &request, true, false, None);
    next_where(&mut events, "child result", |v| {
        is_type(v, "result") && v["session_id"] == child_id.as_str()
    })
    .await;
    assert!(fx.ws.join("notes.txt").exists());
    fx.shutdown().await;
}

/// Writes a.txt, b.txt, an outside file twice, then edits a.txt, then ends.
fn remember_script(outside: PathBuf) -> impl Fn(&ModelRequest) -> ModelResponse + Send + Sync {
    move |request| {
        if first_user(request) == "second session" {
            return match tool_results(request).len() {
                0 => tool_call("c", "write_file", json!({"path": "c.txt", "content": "c"})),
                _ => ModelResponse::text("second done"),
            };
        }
        let out = |name: &str| outside.join(name).display().to_string();
        match tool_results(request).len() {
            0 => tool_call(
                "w-a",
                "write_file",
                json!({"path": "a.txt", "content": "a"}),
            ),
            1 => tool_call(
                "w-b",
                "write_file",
                json!({"path": "b.txt", "content": "b"}),
            ),
            2 => tool_call(
                "w-out",
                "write_file",
                json!({"path": out("out.txt"), "content": "o"}),
            ),
            3 => tool_call(
                "w-out2",
                "write_file",
                json!({"path": out("out2.txt"), "content": "o"}),
            ),
            4 => tool_call(
                "e-a",
                "edit_file",
                json!({"path": "a.txt", "old_string": "a", "new_string": "A"}),
            ),
            _ => ModelResponse::text("done"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remember_for_session_covers_the_tool_inside_but_never_outside() {
    let dir_outside = tempfile::tempdir().unwrap();
    let outside = dir_outside.path().to_path_buf();
    let fx = Fixture::new(json!({}), remember_script(outside.clone()));
    let (session, mut events) = fx.start("first session");
    let id = session.session_id().to_string();
    let approval = |v: &Value| is_type(v, "approval_request");
    let first = next_where(&mut events, "write a.txt", approval).await;
    assert_eq!(first["arguments"]["path"], "a.txt");
    fx.decide(&id, &first, true, true, None);
    // b.txt is covered by the remembered choice: the next request is the outside write.
    let seen = events_until(&mut events, "outside write", approval).await;
    let out = seen.last().unwrap();
    assert!(
        out["arguments"]["path"]
            .as_str()
            .unwrap()
            .ends_with("out.txt"),
        "{out}"
    );
    assert_eq!(out["rememberable"], false);
    assert!(out["diff"].as_str().unwrap().contains("+o"));
    assert_eq!(fx.ws.join("b.txt").metadata().unwrap().len(), 1);
    // Even "approve and remember" on an outside path covers only that one call.
    fx.decide(&id, out, true, true, None);
    let again = next_where(&mut events, "second outside write", approval).await;
    assert!(
        again["arguments"]["path"]
            .as_str()
            .unwrap()
            .ends_with("out2.txt"),
        "{again}"
    );
    fx.decide(&id, &again, false, false, None);
    // Remembering is per tool: edit_file still asks.
    let edit = next_where(&mut events, "edit", approval).await;
    assert_eq!(edit["tool"], "edit_file");
    fx.decide(&id, &edit, false, false, None);
    next_where(&mut events, "result", |v| is_type(v, "result")).await;
    assert!(outside.join("out.txt").exists());
    assert!(!outside.join("out2.txt").exists());
    assert_eq!(std::fs::read_to_string(fx.ws.join("a.txt")).unwrap(), "a");
    // And per session: another session in the same workspace is asked again.
    let (second, mut events2) = fx.start("second session");
    let asked = next_where(&mut events2, "second session's write", approval).await;
    assert_eq!(asked["session_id"], second.session_id());
    fx.decide(second.session_id(), &asked, true, false, None);
    next_where(&mut events2, "result", |v| is_type(v, "result")).await;
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remember_settles_the_other_open_asks_of_the_batch() {
    let fx = Fixture::new(json!({}), |request| match tool_results(request).len() {
        0 => ModelResponse::tool_calls(vec![
            ToolCall {
                id: "x".into(),
                name: "write_file".into(),
                arguments: json!({"path": "x.txt", "content": "x"}),
            },
            ToolCall {
                id: "y".into(),
                name: "write_file".into(),
                arguments: json!({"path": "y.txt", "content": "y"}),
            },
        ]),
        _ => ModelResponse::text("done"),
    });
    let (session, mut events) = fx.start("two writes");
    let id = session.session_id().to_string();
    let first = next_where(&mut events, "first ask", |v| is_type(v, "approval_request")).await;
    next_where(&mut events, "second ask", |v| {
        is_type(v, "approval_request")
    })
    .await;
    fx.decide(&id, &first, true, true, None);
    next_where(&mut events, "result", |v| is_type(v, "result")).await;
    assert!(fx.ws.join("x.txt").exists() && fx.ws.join("y.txt").exists());
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denial_reason_reaches_the_model() {
    let fx = Fixture::new(json!({}), |request| match tool_results(request).len() {
        0 => tool_call("w", "write_file", json!({"path": "a.txt", "content": "a"})),
        _ => ModelResponse::text("understood"),
    });
    let (session, mut events) = fx.start("write a");
    let ask = next_where(&mut events, "ask", |v| is_type(v, "approval_request")).await;
    fx.decide(
        session.session_id(),
        &ask,
        false,
        false,
        Some("put it in docs/ instead"),
    );
    let resolved = next_where(&mut events, "resolved", |v| is_type(v, "approval_resolved")).await;
    assert_eq!(resolved["approved"], false);
    next_where(&mut events, "result", |v| is_type(v, "result")).await;
    let requests = fx.provider.requests();
    let last = requests.last().unwrap().messages.last().unwrap();
    assert_eq!(last.role, Role::Tool);
    assert_eq!(
        last.text(),
        "Error: denied by user: put it in docs/ instead"
    );
    assert!(!fx.ws.join("a.txt").exists());
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_children_get_a_narrowed_tool_set() {
    let fx = Fixture::new(
        json!({"subagents": {"tools": ["read_file", "list_dir", "glob", "grep"]}}),
        delegating_script,
    );
    let (parent, mut events) = fx.start("please delegate");
    let parent_id = parent.session_id().to_string();
    let result = next_where(&mut events, "parent result with report", |v| {
        is_type(v, "result")
            && v["session_id"] == parent_id.as_str()
            && v["content"].as_str().unwrap().starts_with("parent saw:")
    })
    .await;
    // The child's write_file call was not a tool it has: an error, no approval, no file.
    let content = result["content"].as_str().unwrap();
    assert!(content.contains("unknown tool \"write_file\""), "{content}");
    assert!(!fx.ws.join("notes.txt").exists());
    let requests = fx.provider.requests();
    let child_tools: Vec<Vec<String>> = requests
        .iter()
        .filter(|r| first_user(r).contains("\nTask:\n"))
        .map(tool_names)
        .collect();
    assert!(!child_tools.is_empty());
    for tools in child_tools {
        assert_eq!(tools, vec!["read_file", "list_dir", "glob", "grep"]);
    }
    let parent_tools = tool_names(&requests[0]);
    assert_eq!(
        parent_tools,
        vec![
            "read_file",
            "list_dir",
            "glob",
            "grep",
            "write_file",
            "edit_file",
            "run_command",
            "sub_agent",
            "message_subagent",
            "update_plan"
        ]
    );
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_policy_allow_ask_and_deny() {
    let dir_outside = tempfile::tempdir().unwrap();
    let outside = dir_outside.path().join("o.txt").display().to_string();
    let fx = Fixture::new(
        json!({"tools": {"policy": {"write_file": "allow", "read_file": "ask", "run_command": "deny"}}}),
        move |request| match tool_results(request).len() {
            0 => tool_call("w", "write_file", json!({"path": "a.txt", "content": "a"})),
            1 => tool_call(
                "o",
                "write_file",
                json!({"path": outside.clone(), "content": "o"}),
            ),
            2 => tool_call("r", "read_file", json!({"path": "a.txt"})),
            3 => tool_call("c", "run_command", json!({"command": "touch ran"})),
            _ => ModelResponse::text("done"),
        },
    );
    let (session, mut events) = fx.start("policies");
    let id = session.session_id().to_string();
    // allow: the inside write needs no approval; the outside one still asks.
    let seen = events_until(&mut events, "outside ask", |v| {
        is_type(v, "approval_request")
    })
    .await;
    let outside_ask = seen.last().unwrap();
    assert_eq!(outside_ask["tool"], "write_file");
    assert_eq!(outside_ask["rememberable"], false);
    assert!(fx.ws.join("a.txt").exists());
    fx.decide(&id, outside_ask, false, false, None);
    // ask: even a read inside the workspace asks.
    let read = next_where(&mut events, "read ask", |v| is_type(v, "approval_request")).await;
    assert_eq!(read["tool"], "read_file");
    assert_eq!(read["rememberable"], true);
    fx.decide(&id, &read, true, false, None);
    next_where(&mut events, "result", |v| is_type(v, "result")).await;
    // deny: not offered, and refused when called anyway.
    let requests = fx.provider.requests();
    assert!(!tool_names(&requests[0]).contains(&"run_command".to_string()));
    let last = requests.last().unwrap().messages.last().unwrap();
    assert_eq!(
        last.text(),
        "Error: the run_command tool is disabled by configuration (tools.policy)"
    );
    assert!(!fx.ws.join("ran").exists());
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_run_kills_its_command() {
    let fx = Fixture::new(
        json!({"tools": {"policy": {"run_command": "allow"}}}),
        |request| match tool_results(request).len() {
            0 => tool_call("cmd", "run_command", json!({"command": SPAWN_AND_WAIT})),
            _ => ModelResponse::text("done"),
        },
    );
    let mut pipe = pid_pipe(&fx.ws).await;
    let (session, _events) = fx.start("run it");
    let pids = read_pids(&mut pipe).await;
    tokio::time::timeout(WAIT, session.cancel())
        .await
        .expect("cancel hung");
    for pid in pids {
        wait_gone(pid).await;
    }
    let history = fx
        .service
        .store()
        .load(session.session_id())
        .unwrap()
        .messages;
    let result = history.iter().find(|m| m.role == Role::Tool).unwrap();
    assert!(
        result.text() == bumblehive::CANCELLED_RESULT || result.text().contains("cancelled"),
        "{}",
        result.text()
    );
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_agent_asks_when_its_policy_says_ask() {
    let fx = Fixture::new(
        json!({"tools": {"policy": {"sub_agent": "ask", "write_file": "allow"}}}),
        delegating_script,
    );
    let (parent, mut events) = fx.start("please delegate");
    let parent_id = parent.session_id().to_string();
    let ask = next_where(&mut events, "delegation ask", |v| {
        is_type(v, "approval_request")
    })
    .await;
    assert_eq!(ask["tool"], "sub_agent");
    assert_eq!(ask["arguments"]["title"], "Scribe");
    fx.decide(&parent_id, &ask, true, false, None);
    // The child's write is allowed by policy: no further ask, the report comes back.
    let seen = events_until(&mut events, "parent result with report", |v| {
        is_type(v, "result")
            && v["session_id"] == parent_id.as_str()
            && v["content"].as_str().unwrap().starts_with("parent saw:")
    })
    .await;
    assert!(!seen.iter().any(|v| is_type(v, "approval_request")));
    assert!(fx.ws.join("notes.txt").exists());
    fx.shutdown().await;
}

/// Issue 29's `plan`: `update_plan` takes the whole plan (it asks nothing and changes no
/// file), says how far it is, and refuses a malformed one with words the model can act on.
#[tokio::test]
async fn update_plan_takes_a_plan_and_refuses_a_malformed_one() {
    let w = Ws::new();
    let gate = RecordingGate::new(|_| yes());
    let ctx = context(&w.ws, gate.clone());
    let step = |text: &str, status: &str| json!({"step": text, "status": status});
    let taken = call(
        &ctx,
        "update_plan",
        json!({"explanation": "first look", "plan": [step("Read", "completed"), step("Fix", "in_progress"), step("Test", "pending")]}),
    )
    .await
    .unwrap();
    assert_eq!(taken, "Plan updated: 1 of 3 steps completed.");
    assert!(
        gate.asks.lock().unwrap().is_empty(),
        "a plan asked for approval"
    );
    assert_eq!(std::fs::read_dir(&w.ws).unwrap().count(), 0);
    for (args, says) in [
        (json!({"plan": []}), "no steps"),
        (
            json!({"plan": [step("a", "in_progress"), step("b", "in_progress")]}),
            "at most one",
        ),
        (json!({"plan": [step("a", "started")]}), "unknown variant"),
        (json!({"plan": [step(" ", "pending")]}), "a text of at most"),
        (json!({"steps": [step("a", "pending")]}), "unknown field"),
    ] {
        let err = call(&ctx, "update_plan", args.clone()).await.unwrap_err();
        assert!(
            matches!(err, ToolError::InvalidArguments(_)) && err.to_string().contains(says),
            "{args}: {err}"
        );
    }
}

/// A registry narrowed for a turn (a child without `sub_agent`, a profile's list) shares
/// each tool's schema with the registry it came from instead of building it again: with a
/// copy per turn, every running child held its own copy of every schema (the child-memory
/// bench: 220–226 KiB per running child before, against a 200 KiB target; 104–108 after).
#[test]
fn narrowed_registries_share_the_tools_schemas() {
    let all = ToolRegistry::standard();
    let narrowed = all.filtered(|name| name != "write_file");
    let again = all.clone().filtered(|name| name != "write_file");
    let read = |r: &ToolRegistry| {
        r.specs()
            .iter()
            .find(|s| s.name == "read_file")
            .map(|s| s.parameters.clone())
            .expect("read_file is a standard tool")
    };
    assert!(narrowed.specs().iter().all(|s| s.name != "write_file"));
    assert!(Arc::ptr_eq(&read(&all), &read(&narrowed)));
    assert!(Arc::ptr_eq(&read(&narrowed), &read(&again)));
}
