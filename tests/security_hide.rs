//! Security review 2, findings 5 and 10 for real (bubblewrap): what a sandboxed command cannot reach besides the home folder: host Unix sockets under /run and /var/run (the Docker socket, the system bus), and the runtime's data dir and config wherever they live.

use std::path::Path;

use serde_json::json;

use crate::tools::{RecordingGate, context, yes};

/// Runs `command` with `run_command` in `settings`' sandbox, in `ws`; its result text.
/// When the settings allow the network, the command asks for it (`network: true`), as a
/// model's would: the settings alone give no command the network.
async fn sandboxed(
    ws: &Path,
    settings: bumblehive::sandbox::CommandSettings,
    command: &str,
) -> String {
    let ctx = context(ws, RecordingGate::new(|_| yes()));
    let arguments = json!({ "command": command, "network": settings.network });
    let tools = crate::tools::with_command(settings);
    let result = tokio::time::timeout(
        crate::support::WAIT * 4,
        tools.call(&ctx, "run_command", arguments),
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
        "/usr/bin/python3 -c \"\nimport socket\nfor p in [{}]:\n  try:\n    s = socket.socket(socket.AF_UNIX); s.connect(p); print('connected', p)\n  except OSError as e:\n    print('refused', p, e)\n\"",
        list.join(", ")
    )
}

/// Finding 5: a socket in /run (where docker.sock and the system bus live), reached as
/// /run/... and /var/run/..., is out of reach of a command without network, and of one
/// with network too (/run is a tmpfs; without network no Unix socket can be made at all,
/// `security_hide_host_unix_sockets_need_the_network`); with the network, a socket the
/// workspace holds works.
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
    // With the network a command may make Unix sockets again: the workspace's works.
    assert!(
        out.contains(&format!("connected {}", inside.path.display())),
        "{out}"
    );
}

/// The command for `host_unix_sockets_need_the_network`: connects to each path socket,
/// the abstract socket `abstract_name`, and tries a stream and a datagram socketpair and
/// io_uring; one line of `connected`/`refused` (or `pair`) each.
fn socket_probe(paths: &[&Path], abstract_name: &str) -> String {
    let list: Vec<String> = paths.iter().map(|p| format!("'{}'", p.display())).collect();
    format!(
        "/usr/bin/python3 -c \"\nimport socket, ctypes\nfor p in [{}, '\\0{abstract_name}']:\n  try:\n    s = socket.socket(socket.AF_UNIX); s.connect(p); print('connected', p.replace(chr(0), '@'))\n  except OSError as e:\n    print('refused', p.replace(chr(0), '@'), e)\nfor kind, name in [(socket.SOCK_STREAM, 'stream'), (socket.SOCK_DGRAM, 'dgram')]:\n  try:\n    a, b = socket.socketpair(socket.AF_UNIX, kind); a.send(b'x'); print('pair', name, b.recv(1))\n  except OSError as e:\n    print('pair', name, 'refused', e)\nlibc = ctypes.CDLL(None, use_errno=True)\nparams = ctypes.create_string_buffer(120)\nfd = libc.syscall(425, 4, params)\nprint('uring', 'made' if fd >= 0 else 'errno %d' % ctypes.get_errno())\n\"",
        list.join(", ")
    )
}

/// Finding 5, the rest of it: without network a command reaches no host Unix socket,
/// wherever it is: not one in a folder beside the workspace (here under /var/tmp, which
/// no tmpfs hides), not an abstract one, not one in the workspace either (no Unix socket
/// can be made; a seccomp filter, `sandbox::linux::socket_filter`); socketpairs of
/// stream sockets still work, datagram pairs (which can be connected again, to any path)
/// and io_uring do not. With the network allowed, and unsandboxed, the same sockets are
/// reached, as the config says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_hide_host_unix_sockets_need_the_network() {
    let host = tempfile::tempdir_in("/var/tmp").unwrap();
    let outside = Listener::at(host.path().canonicalize().unwrap().join("host.sock"));
    let name = format!("bh-test-abstract-{}", uuid::Uuid::new_v4().simple());
    let address =
        <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(
            name.as_bytes(),
        )
        .unwrap();
    let _abstract = std::os::unix::net::UnixListener::bind_addr(&address).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    let inside = Listener::at(ws.join("in.sock"));
    let probe = socket_probe(&[&outside.path, &inside.path], &name);
    let at = format!("@{name}");
    let reached = |out: &str| {
        for target in [
            outside.path.display().to_string(),
            inside.path.display().to_string(),
            at.clone(),
        ] {
            assert!(
                out.contains(&format!("connected {target}")),
                "{target}: {out}"
            );
        }
        assert!(out.contains("pair stream b'x'"), "{out}");
        assert!(out.contains("pair dgram b'x'"), "{out}");
    };

    let unsandboxed = sandboxed(
        &ws,
        bumblehive::sandbox::CommandSettings {
            policy: bumblehive::sandbox::CommandPolicy::Off,
            ..Default::default()
        },
        &probe,
    )
    .await;
    reached(&unsandboxed);
    let networked = sandboxed(
        &ws,
        bumblehive::sandbox::CommandSettings {
            network: true,
            ..Default::default()
        },
        &probe,
    )
    .await;
    reached(&networked);

    // A fresh sandbox, then the spare it left for the next command: both filtered.
    for round in ["fresh", "spare"] {
        let used = bumblehive::sandbox::spare_stats().used;
        let out = sandboxed(&ws, Default::default(), &probe).await;
        if round == "spare" {
            assert!(
                bumblehive::sandbox::spare_stats().used > used,
                "the spare was not used"
            );
        }
        for target in [
            outside.path.display().to_string(),
            inside.path.display().to_string(),
            at.clone(),
        ] {
            assert!(
                out.contains(&format!("refused {target}")),
                "{round}: {target}: {out}"
            );
        }
        assert!(
            out.contains("pair stream b'x'"),
            "{round}: socketpairs still work: {out}"
        );
        assert!(out.contains("pair dgram refused"), "{round}: {out}");
        // io_uring makes and connects sockets out of the filter's sight: refused, where
        // the host has it at all.
        if unsandboxed.contains("uring made") {
            assert!(out.contains("uring errno 1"), "{round}: {out}");
        }
        assert!(
            bumblehive::sandbox::wait_for_spare(&ws, crate::support::WAIT),
            "no spare was made"
        );
    }
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
