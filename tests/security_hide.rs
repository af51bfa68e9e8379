//! Security review 2, findings 5 and 10 for real (bubblewrap): what a sandboxed command cannot reach besides the home folder: host Unix sockets under /run and /var/run (the Docker socket, the system bus), and the runtime's data dir and config wherever they live.

use std::path::Path;

use serde_json::json;

use crate::tools::{RecordingGate, context, yes};

/// Runs `command` with `run_command` in `settings`' sandbox, in `ws`; its result text.
async fn sandboxed(
    ws: &Path,
    settings: bumblehive::sandbox::CommandSettings,
    command: &str,
) -> String {
    let ctx = context(ws, RecordingGate::new(|_| yes()));
    let tools = crate::tools::with_command(settings);
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

/// A Unix socket listening at `path`, removed when dropped.
struct Listener {
    path: std::path::PathBuf,
    _socket: std::os::unix::net::UnixListener,
}

impl Listener {
    fn at(path: std::path::PathBuf) -> Listener {
        let _ = std::fs::remove_file(&path);
        let socket = std::os::unix::net::UnixListener::bind(&path).unwrap();
        Listener {
            path,
            _socket: socket,
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A command that connects to each socket and prints `connected <path>` or why not.
fn connect_each(paths: &[&Path]) -> String {
    let list: Vec<String> = paths.iter().map(|p| format!("'{}'", p.display())).collect();
    format!(
        "/usr/bin/python3 -c \"\nimport socket\nfor p in [{}]:\n  s = socket.socket(socket.AF_UNIX)\n  try:\n    s.connect(p); print('connected', p)\n  except OSError as e:\n    print('refused', p, e)\n\"",
        list.join(", ")
    )
}

/// Finding 5: a socket in /run (where docker.sock and the system bus live), reached as
/// /run/... and /var/run/..., is out of reach of a command without network, and of one
/// with network too; a socket the workspace holds still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_hide_host_sockets_under_run_are_unreachable() {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("skipped: needs root to make a socket in /run");
        return;
    }
    let run = Listener::at(format!("/run/bh-test-{}.sock", std::process::id()).into());
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    let inside = Listener::at(ws.join("in.sock"));
    let var_run = Path::new("/var/run").join(run.path.file_name().unwrap());
    let command = connect_each(&[&run.path, &var_run, &inside.path]);
    let settings = bumblehive::sandbox::CommandSettings::default();
    let out = sandboxed(&ws, settings.clone(), &command).await;
    assert!(
        out.contains(&format!("refused {}", run.path.display())),
        "{out}"
    );
    assert!(
        out.contains(&format!("refused {}", var_run.display())),
        "{out}"
    );
    assert!(
        out.contains(&format!("connected {}", inside.path.display())),
        "{out}"
    );
    let networked = bumblehive::sandbox::CommandSettings {
        network: true,
        ..settings
    };
    let out = sandboxed(
        &ws,
        networked,
        &format!("{command}; cat /etc/resolv.conf >/dev/null && echo dns-config"),
    )
    .await;
    assert!(
        out.contains(&format!("refused {}", run.path.display())),
        "{out}"
    );
    assert!(
        out.contains("dns-config"),
        "name resolution's config is still there: {out}"
    );
}

/// Finding 10: the runtime's data dir and config file are hidden from sandboxed commands
/// wherever they live (here under /var/tmp, outside the home folder), also through a
/// symlink planted in the workspace; a workspace inside the data dir (a worktree) stays
/// usable, while the rest of the data dir is hidden from it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_hide_data_dir_and_config_outside_home() {
    let root = tempfile::tempdir_in("/var/tmp").unwrap();
    let root = root.path().canonicalize().unwrap();
    let data = root.join("data");
    std::fs::create_dir_all(data.join("sessions")).unwrap();
    std::fs::write(data.join("server-token"), "SECRET-TOKEN").unwrap();
    std::fs::write(data.join("sessions/s.jsonl"), "HISTORY-LINE").unwrap();
    let config = root.join("etc/config.json");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::write(&config, "CONFIG-SECRET").unwrap();
    bumblehive::sandbox::hide(&[data.clone(), config.clone()]);

    let ws_dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let ws = ws_dir.path().canonicalize().unwrap();
    std::os::unix::fs::symlink(&data, ws.join("d")).unwrap();
    let settings = bumblehive::sandbox::CommandSettings::default();
    let read = format!(
        "cat {0}/server-token {0}/sessions/s.jsonl {1} d/server-token; echo made > here.txt; cat here.txt",
        data.display(),
        config.display()
    );
    let out = sandboxed(&ws, settings.clone(), &read).await;
    for secret in ["SECRET-TOKEN", "HISTORY-LINE", "CONFIG-SECRET"] {
        assert!(!out.contains(secret), "{secret} was readable: {out}");
    }
    assert!(out.contains("made"), "{out}");

    // A worktree's workspace lies inside the data dir: it is shown, the rest is not.
    let tree = data.join("worktrees/child");
    std::fs::create_dir_all(&tree).unwrap();
    let out = sandboxed(
        &tree,
        settings,
        &format!(
            "cat {}/server-token; echo in-tree > t.txt; cat t.txt",
            data.display()
        ),
    )
    .await;
    assert!(!out.contains("SECRET-TOKEN"), "{out}");
    assert!(out.contains("in-tree"), "{out}");
    bumblehive::sandbox::hide(&[]);
}

/// Inherited descriptors: a descriptor the runtime holds without close-on-exec (one it
/// inherited from whatever started it, or a library's) is not open in a command, sandboxed
/// or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_hide_commands_inherit_no_descriptor() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    let secret = ws.join("held.txt");
    std::fs::write(&secret, "held").unwrap();
    let path = std::ffi::CString::new(secret.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; the descriptor is closed at the end of the test.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY) };
    assert!(fd > 2);
    let check = format!("ls /proc/self/fd; cat /proc/self/fd/{fd} && echo READ-INHERITED");
    for policy in [
        bumblehive::sandbox::CommandPolicy::Sandbox,
        bumblehive::sandbox::CommandPolicy::Off,
    ] {
        let settings = bumblehive::sandbox::CommandSettings {
            policy,
            ..Default::default()
        };
        let out = sandboxed(&ws, settings, &check).await;
        assert!(
            !out.contains("READ-INHERITED"),
            "{policy:?}: fd {fd} was inherited: {out}"
        );
    }
    // SAFETY: our own descriptor from above.
    unsafe { libc::close(fd) };
}

/// Review note: pids cgroups left by a runtime that exited before its clean-up thread ran
/// (`bumblehive-<pid>-…` of a dead process) are removed when a command next makes one; a
/// live process's are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_hide_leftover_cgroups_are_removed() {
    let base = Path::new("/sys/fs/cgroup/pids");
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 || !base.join("cgroup.procs").exists() {
        eprintln!("skipped: needs root and a pids cgroup hierarchy");
        return;
    }
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let leftover = base.join(format!(
        "bumblehive-{dead}-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let live = base.join(format!("bumblehive-1-{}", uuid::Uuid::new_v4().simple()));
    for dir in [&leftover, &live] {
        std::fs::create_dir(dir).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    let out = sandboxed(&ws, Default::default(), "echo ran").await;
    assert!(out.contains("ran"), "{out}");
    assert!(!leftover.exists(), "a dead process's cgroup was left");
    assert!(live.exists(), "a live process's cgroup was removed");
    std::fs::remove_dir(&live).unwrap();
}
