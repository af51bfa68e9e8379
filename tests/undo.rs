//! Checkpoints and undo end to end: real sessions against the scripted model server make write_file / edit_file / run_command calls; the Changes view, undo (git and plain folders), the person's later edits, rewind and fork, deletion, and SIGKILL during an undo (names start with undo_).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bumblehive::commands::dispatch;
use bumblehive::config::Config;
use bumblehive::controller::Subscription;
use bumblehive::protocol::Message;
use bumblehive::providers::provider_from_config;
use bumblehive::service::{RuntimeService, ServiceOptions};
use serde_json::{Value, json};

use crate::mock_llm::{MockLlm, openai};
use crate::support::{assert_message_order, is_event, receive};

/// The tools allowed by policy (the approval flow has its own tests), commands run
/// without the OS sandbox so the test does not depend on bubblewrap.
fn config(mock: &MockLlm) -> Config {
    Config::default()
        .patched(&json!({
            "provider": {"kind": "openai", "base_url": format!("{}/v1", mock.url()),
                         "model": "scripted", "max_retries": 0},
            "tools": {
                "policy": {"write_file": "allow", "edit_file": "allow", "run_command": "allow"},
                "command": {"policy": "off"}
            }
        }))
        .unwrap()
}

struct Fx {
    mock: MockLlm,
    service: RuntimeService,
    dir: tempfile::TempDir,
    ws: PathBuf,
}

impl Fx {
    async fn new() -> Fx {
        let mock = MockLlm::start().await;
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        let service = RuntimeService::new(ServiceOptions {
            data_dir: dir.path().join("data"),
            config_path: None,
            config: Some(config(&mock)),
            provider_factory: Arc::new(provider_from_config),
            tools: None,
        })
        .unwrap();
        Fx {
            mock,
            service,
            dir,
            ws,
        }
    }

    fn put(&self, rel: &str, text: &str) {
        let path = self.ws.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn get(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.ws.join(rel)).ok()
    }

    fn session(&self) -> (String, Subscription) {
        let info = self
            .service
            .create_session(self.ws.to_str().unwrap(), None)
            .unwrap();
        let (events, _) = self
            .service
            .controller(&info.session_id)
            .unwrap()
            .subscribe();
        (info.session_id, events)
    }

    /// One turn: the person's `text`, the model's one batch of `calls`, then its answer.
    async fn turn(
        &self,
        session: &str,
        events: &mut Subscription,
        text: &str,
        calls: &[(&str, &str, Value)],
    ) {
        self.mock.push_sse(openai::tool_answer(calls, (10, 5)));
        self.mock.push_sse(openai::text_answer(&["done"], (10, 5)));
        self.ok("submit", json!({"session_id": session, "content": text}))
            .await;
        // Longer than `support::WAIT`: each changing call takes two snapshots (a few git
        // processes each), which a loaded machine makes slow.
        let wanted = async {
            loop {
                let event = events.next_event().await.expect("event stream closed");
                let value = serde_json::to_value(&event).unwrap();
                if is_event(&value, "result", Some(session), None) {
                    return value;
                }
            }
        };
        let result = tokio::time::timeout(std::time::Duration::from_secs(30), wanted)
            .await
            .expect("timed out waiting for the turn's result");
        assert_eq!(result["content"], "done", "{result}");
    }

    async fn ok(&self, command: &str, args: Value) -> Value {
        dispatch(&self.service, command, args.clone())
            .await
            .unwrap_or_else(|err| panic!("{command} {args}: {err}"))
    }

    async fn err(&self, command: &str, args: Value) -> (String, String) {
        let err = dispatch(&self.service, command, args)
            .await
            .expect_err("the command should fail");
        (err.code().to_string(), err.to_string())
    }

    fn history(&self, session: &str) -> Vec<Message> {
        self.service.store().load(session).unwrap().messages
    }

    async fn shutdown(self) {
        self.mock.assert_valid();
        self.service.shutdown().await;
    }
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every file under `dir` but `.git`, with its content, sorted.
fn tree(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        for entry in std::fs::read_dir(&current).unwrap().flatten() {
            let path = entry.path();
            let rel = path.strip_prefix(dir).unwrap().display().to_string();
            if rel == ".git" {
                continue;
            }
            if path.is_dir() {
                out.push((format!("{rel}/"), String::new()));
                stack.push(path);
            } else {
                out.push((rel, std::fs::read_to_string(&path).unwrap_or_default()));
            }
        }
    }
    out.sort();
    out
}

/// A write, an edit and a command that creates, changes and deletes files (and a folder),
/// then the Changes view, the preview, the undo, and nothing left to undo.
async fn undo_one_turn(in_git: bool) {
    let fx = Fx::new().await;
    fx.put("edit.txt", "fn a() {}\n");
    fx.put("changed.txt", "line 1\n");
    fx.put("gone.txt", "keep me\n");
    fx.put(".gitignore", "build/\n");
    let mut person_git = None;
    if in_git {
        git(&fx.ws, &["init", "-q"]);
        git(&fx.ws, &["add", "-A"]);
        git(&fx.ws, &["commit", "-q", "-m", "start"]);
        let index = std::fs::read(fx.ws.join(".git/index")).unwrap();
        person_git = Some((index, git(&fx.ws, &["log", "--format=%H", "--all"])));
    }
    let before = tree(&fx.ws);
    let (session, mut events) = fx.session();
    fx.turn(
        &session,
        &mut events,
        "change things",
        &[
            (
                "c1",
                "write_file",
                json!({"path": "new.txt", "content": "brand new\n"}),
            ),
            (
                "c2",
                "edit_file",
                json!({"path": "edit.txt", "old_string": "fn a() {}", "new_string": "fn a() { 1 }"}),
            ),
            (
                "c3",
                "run_command",
                json!({"command": "printf made > made.txt && rm gone.txt && printf 'line 2\\n' >> changed.txt && mkdir -p sub/deep && printf x > sub/deep/n.txt"}),
            ),
            (
                "c4",
                "write_file",
                json!({"path": "build/out.log", "content": "ignored\n"}),
            ),
        ],
    )
    .await;
    assert_eq!(fx.get("made.txt").as_deref(), Some("made"));
    assert_eq!(fx.get("gone.txt"), None);
    assert_eq!(fx.get("changed.txt").as_deref(), Some("line 1\nline 2\n"));

    let changes = fx.ok("turn_changes", json!({"session_id": session})).await;
    assert_eq!(changes["available"], true);
    let turns = changes["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 1, "{changes}");
    assert_eq!(turns[0]["message_index"], 0);
    assert_eq!(turns[0]["undone"], false);
    let files: Vec<(String, String)> = turns[0]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                f["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = [
        ("changed.txt", "modified"),
        ("edit.txt", "modified"),
        ("gone.txt", "deleted"),
        ("made.txt", "added"),
        ("new.txt", "added"),
        ("sub/deep/n.txt", "added"),
    ]
    .iter()
    .map(|(p, s)| (p.to_string(), s.to_string()))
    .collect();
    assert_eq!(files, expected, "{changes}");
    let edit_diff = turns[0]["files"][1]["diff"].as_str().unwrap();
    assert!(
        edit_diff.contains("-fn a() {}") && edit_diff.contains("+fn a() { 1 }"),
        "{edit_diff}"
    );
    let skipped = turns[0]["skipped"].to_string();
    assert!(
        skipped.contains("build/out.log (ignored by .gitignore)"),
        "{skipped}"
    );

    // The preview shows what changes back and changes nothing.
    let preview = fx
        .ok(
            "undo_turn",
            json!({"session_id": session, "message_index": 0, "preview": true}),
        )
        .await;
    assert_eq!(preview["applied"], false);
    assert_eq!(preview["files"].as_array().unwrap().len(), 6, "{preview}");
    assert_eq!(preview["conflicts"], json!([]));
    let gone_back = preview["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "gone.txt")
        .unwrap();
    assert_eq!(gone_back["status"], "added");
    assert!(gone_back["diff"].as_str().unwrap().contains("+keep me"));
    assert_eq!(fx.get("made.txt").as_deref(), Some("made"));

    let undone = fx
        .ok(
            "undo_turn",
            json!({"session_id": session, "message_index": 0}),
        )
        .await;
    assert_eq!(undone["applied"], true, "{undone}");
    // Everything is as before the turn, but the ignored file, which the preview named.
    let mut after = tree(&fx.ws);
    after.retain(|(p, _)| !p.starts_with("build"));
    assert_eq!(after, before);
    assert_eq!(fx.get("build/out.log").as_deref(), Some("ignored\n"));
    if let Some((index, log)) = person_git {
        assert_eq!(std::fs::read(fx.ws.join(".git/index")).unwrap(), index);
        assert_eq!(git(&fx.ws, &["log", "--format=%H", "--all"]), log);
        assert_eq!(
            git(&fx.ws, &["status", "--porcelain"]),
            "",
            "the person's repository sees no change"
        );
    }
    let changes = fx.ok("turn_changes", json!({"session_id": session})).await;
    assert_eq!(changes["turns"][0]["undone"], true);
    // Nothing is left to undo: a second undo changes nothing.
    let again = fx
        .ok(
            "undo_turn",
            json!({"session_id": session, "message_index": 0}),
        )
        .await;
    assert_eq!(again["files"], json!([]));
    assert_eq!(tree(&fx.ws).len(), before.len() + 2, "build/ and its file");
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_a_turn_in_a_plain_folder() {
    undo_one_turn(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_a_turn_in_a_git_repository_leaves_its_git_alone() {
    undo_one_turn(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_refuses_files_the_person_changed_since_unless_forced() {
    let fx = Fx::new().await;
    fx.put("f.txt", "original\n");
    fx.put("g.txt", "g original\n");
    let (session, mut events) = fx.session();
    fx.turn(
        &session,
        &mut events,
        "edit both",
        &[(
            "c1",
            "run_command",
            json!({"command": "printf 'agent\\n' > f.txt && printf 'g agent\\n' > g.txt"}),
        )],
    )
    .await;
    // The person edits one of them afterwards.
    fx.put("f.txt", "person\n");
    let preview = fx
        .ok(
            "undo_turn",
            json!({"session_id": session, "message_index": 0, "preview": true}),
        )
        .await;
    assert_eq!(preview["conflicts"], json!(["f.txt"]));
    let (code, message) = fx
        .err(
            "undo_turn",
            json!({"session_id": session, "message_index": 0}),
        )
        .await;
    assert_eq!(code, "conflict");
    assert!(
        message.contains("f.txt") && message.contains("force"),
        "{message}"
    );
    // Refused means nothing at all was restored.
    assert_eq!(fx.get("f.txt").as_deref(), Some("person\n"));
    assert_eq!(fx.get("g.txt").as_deref(), Some("g agent\n"));
    let forced = fx
        .ok(
            "undo_turn",
            json!({"session_id": session, "message_index": 0, "force": true}),
        )
        .await;
    assert_eq!(forced["applied"], true);
    assert_eq!(fx.get("f.txt").as_deref(), Some("original\n"));
    assert_eq!(fx.get("g.txt").as_deref(), Some("g original\n"));
    // A message index that is not the person's message is a clear error.
    let (code, message) = fx
        .err(
            "undo_turn",
            json!({"session_id": session, "message_index": 1}),
        )
        .await;
    assert_eq!(code, "invalid_argument", "{message}");
    fx.shutdown().await;
}

/// UX review E7: an undo leaves a note in the conversation, which the chat reads from
/// the history and the model gets at its next turn; the stored history stays valid
/// (SPEC §2), and a later undo counts turns from 1 past the note.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_leaves_a_note_the_model_reads_at_its_next_turn() {
    let fx = Fx::new().await;
    fx.put("a.txt", "one\n");
    let (session, mut events) = fx.session();
    fx.turn(
        &session,
        &mut events,
        "write hello",
        &[
            (
                "c1",
                "write_file",
                json!({"path": "hello.t", "content": "Hello, world"}),
            ),
            (
                "c2",
                "write_file",
                json!({"path": "a.txt", "content": "two\n"}),
            ),
        ],
    )
    .await;
    let before = fx.history(&session);
    fx.ok(
        "undo_turn",
        json!({"session_id": session, "message_index": 0}),
    )
    .await;
    assert_eq!(fx.get("hello.t"), None);
    let history = fx.history(&session);
    assert_eq!(history.len(), before.len() + 1, "one note: {history:#?}");
    let note = history.last().unwrap().clone();
    assert!(note.is_note() && !note.is_from_person(), "{note:?}");
    assert_eq!(
        note.text(),
        "Note: the person undid the file changes of turn 1: hello.t deleted; a.txt restored. \
         The files are as they were before that turn; the conversation above is unchanged."
    );
    assert_message_order(&history);
    // Subscribers were told (the chat shows it at once).
    let note_id = note.id.clone().unwrap();
    tokio::time::timeout(crate::support::WAIT, async {
        loop {
            let event = events.next_event().await.expect("event stream closed");
            let event = serde_json::to_value(&event).unwrap();
            if event["kind"] == "message.appended"
                && event["data"]["message"]["id"] == note_id.as_str()
            {
                return;
            }
        }
    })
    .await
    .expect("no message.appended for the note");
    // The next model request has it, as a user message after the last answer and before
    // the person's next message.
    let sent = fx.mock.requests().len();
    fx.turn(
        &session,
        &mut events,
        "is hello.t there?",
        &[("c3", "read_file", json!({"path": "a.txt"}))],
    )
    .await;
    let (messages, at) = note_in_request(&fx, sent, note.text());
    assert_eq!(messages[at - 1]["role"], "assistant");
    assert_eq!(messages[at + 1]["content"], "is hello.t there?");
    // The note is no turn: the second turn is the person's message after it.
    let changes = fx.ok("turn_changes", json!({"session_id": session})).await;
    let history = fx.history(&session);
    assert_message_order(&history);
    let second = history
        .iter()
        .position(|m| m.text() == "is hello.t there?")
        .unwrap();
    assert!(
        changes["turns"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["message_index"] != json!(second - 1)),
        "{changes}"
    );
    // A preview leaves no note.
    fx.ok(
        "undo_turn",
        json!({"session_id": session, "message_index": second, "preview": true}),
    )
    .await;
    assert_eq!(fx.history(&session).len(), history.len());
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_rewind_forks_at_the_message_and_keeps_the_original() {
    let fx = Fx::new().await;
    let (session, mut events) = fx.session();
    fx.turn(
        &session,
        &mut events,
        "first",
        &[(
            "c1",
            "write_file",
            json!({"path": "a.txt", "content": "one\n"}),
        )],
    )
    .await;
    let second = fx.history(&session).len();
    fx.turn(
        &session,
        &mut events,
        "second",
        &[
            (
                "c2",
                "write_file",
                json!({"path": "a.txt", "content": "two\n"}),
            ),
            ("c3", "run_command", json!({"command": "printf b > b.txt"})),
        ],
    )
    .await;
    let original = fx.history(&session);
    let changes = fx.ok("turn_changes", json!({"session_id": session})).await;
    let indexes: Vec<&Value> = changes["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["message_index"])
        .collect();
    assert_eq!(indexes, [&json!(0), &json!(second)]);

    // Fork from here: a new session, the files untouched.
    let forked = fx
        .ok(
            "fork_session",
            json!({"session_id": session, "message_index": second}),
        )
        .await;
    let fork = forked["session"]["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(forked["session"]["forked_from"], session.as_str());
    assert_eq!(forked["draft"], "second");
    assert_eq!(fx.get("a.txt").as_deref(), Some("two\n"));
    assert_eq!(fx.history(&fork), original[..second].to_vec());

    // Rewind to here: the fork, and the files as they were before that message.
    let rewound = fx
        .ok(
            "fork_session",
            json!({"session_id": session, "message_index": second, "rewind": true}),
        )
        .await;
    let rewind = rewound["session"]["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(rewound["undo"]["applied"], true);
    assert_eq!(fx.get("a.txt").as_deref(), Some("one\n"));
    assert_eq!(fx.get("b.txt"), None);
    let history = fx.history(&rewind);
    assert_eq!(history, original[..second].to_vec());
    assert_message_order(&history);
    assert_eq!(history.last().unwrap().text(), "done");
    // The original is as it was, but for the rewind's note at its end (UX review E7),
    // and lists its forks under it.
    let after = fx.history(&session);
    assert_eq!(after[..original.len()], original[..]);
    assert_eq!(after.len(), original.len() + 1);
    let note = after.last().unwrap();
    assert!(note.is_note(), "{note:?}");
    assert!(
        note.text()
            .starts_with("Note: the person rewound to before turn 2 and went on in a fork")
            && note.text().contains("b.txt deleted; a.txt restored"),
        "{}",
        note.text()
    );
    assert_message_order(&after);
    let list = fx.ok("list_sessions", json!({})).await;
    let forks: Vec<&Value> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["forked_from"] == session.as_str())
        .collect();
    assert_eq!(forks.len(), 2, "{list}");
    assert!(forks.iter().all(|s| s["forked_at"] == second));

    // The fork is a session of its own: it runs on from where it was cut.
    let (fork_events, _) = fx.service.controller(&rewind).unwrap().subscribe();
    let mut fork_events = fork_events;
    fx.turn(
        &rewind,
        &mut fork_events,
        "second, again",
        &[(
            "c9",
            "write_file",
            json!({"path": "a.txt", "content": "three\n"}),
        )],
    )
    .await;
    assert_eq!(fx.get("a.txt").as_deref(), Some("three\n"));
    assert_eq!(fx.history(&rewind).len(), second + 4);

    // Deleting a session forgets its checkpoint records.
    let records = fx
        .dir
        .path()
        .join("data/checkpoints/sessions")
        .join(format!("{session}.jsonl"));
    assert!(records.exists());
    fx.ok("delete_session", json!({"session_id": session}))
        .await;
    assert!(!records.exists());
    let (code, _) = fx.err("turn_changes", json!({"session_id": session})).await;
    assert_eq!(code, "not_found");
    fx.shutdown().await;
}

/// How many files the crash test's turn rewrites, and how big each is: enough that the
/// undo takes long enough to be killed in the middle.
const CRASH_FILES: usize = 300;
const CRASH_BYTES: usize = 64 * 1024;

/// The real binary is killed (SIGKILL) while it undoes a turn that rewrote many files:
/// each file is then wholly old or wholly new, the restarted app loads the session, and
/// a forced undo finishes the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_crash_sigkill_during_an_undo_leaves_each_file_old_or_new() {
    for kill_after in [1, CRASH_FILES / 3] {
        crash_during_undo(kill_after).await;
    }
}

fn crash_file(ws: &Path, i: usize) -> PathBuf {
    ws.join(format!("f{i:03}.txt"))
}

async fn crash_during_undo(kill_after: usize) {
    use crate::server::{Model, Server};
    let mock = MockLlm::start().await;
    let dir = tempfile::tempdir().unwrap();
    let settings = json!({
        "provider": {"kind": "openai", "base_url": format!("{}/v1", mock.url()),
                     "model": "scripted", "max_retries": 0},
        "tools": {"policy": {"run_command": "allow"}, "command": {"policy": "off"}}
    });
    std::fs::write(dir.path().join("config.json"), settings.to_string()).unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    for i in 0..CRASH_FILES {
        std::fs::write(crash_file(&ws, i), vec![b'a'; CRASH_BYTES]).unwrap();
    }
    let command =
        format!("for f in f*.txt; do head -c {CRASH_BYTES} /dev/zero | tr '\\0' b > \"$f\"; done");
    mock.push_sse(openai::tool_answer(
        &[("c1", "run_command", json!({"command": command}))],
        (10, 5),
    ));
    mock.push_sse(openai::text_answer(&["done"], (10, 5)));
    let mut server = Server::spawn(dir, Model::default(), mock).await;
    let info = server
        .ok(
            "create_session",
            json!({"workspace": ws.display().to_string()}),
        )
        .await;
    let id = info["session_id"].as_str().unwrap().to_string();
    let mut events = server.events(&id).await;
    assert_eq!(events.next().await["type"], "snapshot");
    server
        .ok(
            "submit",
            json!({"session_id": id, "content": "rewrite them"}),
        )
        .await;
    events
        .wait_within(
            std::time::Duration::from_secs(60),
            "result",
            Some(&id),
            None,
        )
        .await;
    assert_eq!(std::fs::read(crash_file(&ws, 0)).unwrap()[0], b'b');

    // The undo runs in the server; the test watches the files and kills the process
    // once `kill_after` of them are back.
    let (http, url, token) = (
        server.http.clone(),
        server.url.clone(),
        server.token.clone(),
    );
    let undo_id = id.clone();
    let undo = tokio::spawn(async move {
        http.post(format!("{url}/api/undo_turn"))
            .bearer_auth(token)
            .json(&json!({"session_id": undo_id, "message_index": 0}))
            .send()
            .await
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let back = (0..CRASH_FILES)
            .filter(|i| {
                std::fs::read(crash_file(&ws, *i)).is_ok_and(|bytes| bytes.first() == Some(&b'a'))
            })
            .count();
        assert!(
            back < CRASH_FILES,
            "the undo finished before the kill point; make the turn bigger"
        );
        if back >= kill_after {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the undo never started"
        );
        // Polls the files, which no event reports: the server is killed at a point of its
        // own progress, not after a guessed delay.
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    server.kill().await;
    let _ = undo.await;

    let mut old = 0;
    for i in 0..CRASH_FILES {
        let bytes = std::fs::read(crash_file(&ws, i)).unwrap();
        assert_eq!(bytes.len(), CRASH_BYTES, "f{i:03}.txt was cut");
        let first = bytes[0];
        assert!(
            bytes.iter().all(|b| *b == first),
            "f{i:03}.txt mixes old and new content"
        );
        if first == b'a' {
            old += 1;
        }
    }
    assert!(
        old >= kill_after && old < CRASH_FILES,
        "{old} files restored"
    );

    // After the restart the session loads, and a forced undo (the files restored so far
    // are no longer what the agent left) restores the rest.
    let server = server.restart().await;
    let history = server.history(&id).await;
    assert_message_order(&history);
    let done = server
        .ok(
            "undo_turn",
            json!({"session_id": id, "message_index": 0, "force": true}),
        )
        .await;
    assert_eq!(done["applied"], true);
    for i in 0..CRASH_FILES {
        assert_eq!(
            std::fs::read(crash_file(&ws, i)).unwrap(),
            vec![b'a'; CRASH_BYTES]
        );
    }
    // The killed undo's temporary files went with the one that finished.
    let names: Vec<String> = std::fs::read_dir(&ws)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), CRASH_FILES, "left in the workspace: {names:?}");
    let mut server = server;
    server.kill().await;
}

/// A git repository with `a.txt` committed, as the parent's workspace.
fn repository(fx: &Fx) {
    fx.put("a.txt", "one\n");
    git(&fx.ws, &["init", "-q"]);
    git(&fx.ws, &["add", "-A"]);
    git(&fx.ws, &["commit", "-q", "-m", "start"]);
}

/// The parent delegates one child with these `sub_agent` arguments; the child rewrites
/// `a.txt` and creates `b.txt` (in its worktree), then reports.
fn isolated_script(mock: &MockLlm, delegation: Value) {
    mock.respond_with(move |request| {
        let messages = request.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let first_user = messages
            .iter()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_string();
        let results = messages.iter().filter(|m| m["role"] == "tool").count();
        let body = if first_user.contains("You are the sub-agent") {
            match results {
                0 => openai::tool_answer(
                    &[
                        (
                            "w1",
                            "write_file",
                            json!({"path": "a.txt", "content": "child\n"}),
                        ),
                        (
                            "w2",
                            "write_file",
                            json!({"path": "b.txt", "content": "new\n"}),
                        ),
                    ],
                    (10, 5),
                ),
                _ => openai::text_answer(&["child done"], (10, 5)),
            }
        } else {
            match results {
                0 => openai::tool_answer(&[("d1", "sub_agent", delegation.clone())], (10, 5)),
                _ => openai::text_answer(&["parent ok"], (10, 5)),
            }
        };
        crate::mock_llm::MockResponse::sse(body)
    });
}

fn worktree_call() -> Value {
    json!({"title": "iso", "task": "rewrite a.txt", "isolation": "worktree"})
}

/// Starts the parent, waits until the whole tree is idle; returns the parent and child.
async fn delegate_isolated(fx: &Fx) -> (String, String) {
    delegate_with(fx, worktree_call()).await
}

/// The messages of the model request numbered `sent`, and where `note` is among them
/// (as a user message: the model reads it).
fn note_in_request(fx: &Fx, sent: usize, note: &str) -> (Vec<Value>, usize) {
    let request = fx.mock.requests()[sent].body.clone();
    let messages = request["messages"].as_array().unwrap().clone();
    let at = messages
        .iter()
        .position(|m| m["role"] == "user" && m["content"] == note)
        .unwrap_or_else(|| panic!("the note is not in the request: {request}"));
    (messages, at)
}

/// Hands `content` to `session` and waits until the whole tree is idle.
async fn submit_until_idle(fx: &Fx, session: &str, content: &str) {
    fx.ok("submit", json!({"session_id": session, "content": content}))
        .await;
    tokio::time::timeout(std::time::Duration::from_secs(20), fx.service.wait_idle())
        .await
        .expect("the tree did not finish");
}

/// A parent whose turn delegated "helper", which rewrote a.txt ("one" to "child") and
/// added b.txt.
async fn helper_delegated() -> (Fx, String, String) {
    let fx = Fx::new().await;
    fx.put("a.txt", "one\n");
    let (parent, child) =
        delegate_with(&fx, json!({"title": "helper", "task": "rewrite a.txt"})).await;
    (fx, parent, child)
}

async fn delegate_with(fx: &Fx, delegation: Value) -> (String, String) {
    isolated_script(&fx.mock, delegation);
    let (parent, _events) = fx.session();
    submit_until_idle(fx, &parent, "delegate").await;
    let sessions = fx.ok("list_sessions", json!({})).await;
    let child = sessions
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["parent_session_id"] == parent.as_str())
        .expect("a child")
        .clone();
    (parent, child["session_id"].as_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_worktree_child_applies_without_conflict_and_reports_its_diff_stat() {
    let fx = Fx::new().await;
    repository(&fx);
    let (parent, child) = delegate_isolated(&fx).await;
    let info = fx.service.session_info(&child).unwrap();
    let worktree = info.worktree.clone().expect("the child has a worktree");
    assert_eq!(worktree.branch, format!("bumblehive/{child}"));
    assert_eq!(
        Path::new(&worktree.path),
        fx.dir.path().join("data/worktrees").join(&child)
    );
    // The child wrote in its worktree, not in the workspace.
    assert_eq!(fx.get("a.txt").as_deref(), Some("one\n"));
    assert_eq!(fx.get("b.txt"), None);
    assert_eq!(
        std::fs::read_to_string(Path::new(&worktree.path).join("a.txt")).unwrap(),
        "child\n"
    );
    // Its report ends with the diff stat.
    let report = fx
        .history(&parent)
        .into_iter()
        .find(|m| {
            m.id.as_deref()
                .is_some_and(|id| id.starts_with("subagent:"))
        })
        .expect("the report");
    let text = report.text();
    assert!(
        text.contains("child done") && text.contains(&worktree.branch),
        "{text}"
    );
    assert!(
        text.contains("a.txt") && text.contains("b.txt") && text.contains("2 files changed"),
        "{text}"
    );
    let applied = fx.ok("apply_worktree", json!({"session_id": child})).await;
    assert!(
        applied["stat"]
            .as_str()
            .unwrap()
            .contains("2 files changed")
    );
    assert_eq!(fx.get("a.txt").as_deref(), Some("child\n"));
    assert_eq!(fx.get("b.txt").as_deref(), Some("new\n"));
    let (code, _) = fx.err("apply_worktree", json!({"session_id": child})).await;
    assert_eq!(code, "invalid_argument", "applied once only");
    // Deleting the parent deletes the child, its worktree and its branch.
    fx.ok("delete_session", json!({"session_id": parent})).await;
    assert!(!Path::new(&worktree.path).exists());
    assert_eq!(git(&fx.ws, &["branch", "--list", "bumblehive/*"]), "");
    assert_eq!(git(&fx.ws, &["worktree", "list"]).lines().count(), 1);
    fx.shutdown().await;
}

/// UX review E2 and E20: an isolated child stays listed under its parent's workspace
/// (the list, the list feed, after a restart), its worktree is no workspace of its own,
/// and its approvals say the write goes to its worktree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_worktree_child_stays_listed_under_its_parents_workspace_after_a_restart_too() {
    use futures::StreamExt;
    let mut fx = Fx::new().await;
    repository(&fx);
    let ws = fx.ws.to_str().unwrap().to_string();
    // The child's writes ask, so its approval can be read.
    fx.service
        .update_config(&json!({"tools": {"policy": {"write_file": "ask"}}}))
        .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let mut feed = Box::pin(fx.service.session_list_feed(Some(ws.clone()), stop.clone()));
    isolated_script(&fx.mock, worktree_call());
    let (parent, mut events) = fx.session();
    fx.ok(
        "submit",
        json!({"session_id": parent, "content": "delegate"}),
    )
    .await;
    let mut branches = Vec::new();
    while branches.len() < 2 {
        let asked = receive(&mut events, "approval_request", None, None).await;
        assert_ne!(asked["session_id"], parent.as_str(), "{asked}");
        branches.push(asked["worktree"].as_str().unwrap_or_default().to_string());
        fx.ok(
            "decide_approval",
            json!({"session_id": parent, "approval_id": asked["approval_id"], "approved": true}),
        )
        .await;
    }
    tokio::time::timeout(std::time::Duration::from_secs(20), fx.service.wait_idle())
        .await
        .expect("the tree did not finish");
    let listed = fx.ok("list_sessions", json!({"workspace": ws})).await;
    let child = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["parent_session_id"] == parent.as_str())
        .unwrap_or_else(|| panic!("the worktree child is not listed: {listed}"))
        .clone();
    let child_id = child["session_id"].as_str().unwrap().to_string();
    let branch = format!("bumblehive/{child_id}");
    assert_eq!(child["worktree"]["branch"], branch.as_str());
    assert_ne!(child["workspace"], ws.as_str(), "it works in its worktree");
    assert_eq!(
        branches,
        [branch.clone(), branch.clone()],
        "each approval names the worktree"
    );
    // The list feed follows it too: its last change (idle, worktree set) reaches the window.
    let followed = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while let Some(event) = feed.next().await {
            let event = serde_json::to_value(&event).unwrap();
            let session = &event["session"];
            if event["type"] == "changed"
                && session["session_id"] == child_id.as_str()
                && session["worktree"]["branch"] == branch.as_str()
                && session["state"] == "idle"
            {
                return;
            }
        }
    })
    .await;
    stop.cancel();
    assert!(
        followed.is_ok(),
        "the list feed dropped the worktree child's changes"
    );
    // Its worktree is no workspace of its own.
    let workspaces = fx.ok("list_workspaces", json!({})).await;
    let paths: Vec<&str> = workspaces
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, [ws.as_str()], "{workspaces}");
    // After a restart it is still listed, and its work can be applied.
    fx.service.shutdown().await;
    fx.service = RuntimeService::new(ServiceOptions {
        data_dir: fx.dir.path().join("data"),
        config_path: None,
        config: Some(config(&fx.mock)),
        provider_factory: Arc::new(provider_from_config),
        tools: None,
    })
    .unwrap();
    let listed = fx.ok("list_sessions", json!({"workspace": ws})).await;
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["session_id"] == child_id.as_str()
                && s["worktree"]["branch"] == branch.as_str()),
        "not listed after a restart: {listed}"
    );
    fx.ok("apply_worktree", json!({"session_id": child_id}))
        .await;
    assert_eq!(fx.get("b.txt").as_deref(), Some("new\n"));
    fx.shutdown().await;
}

/// UX review E6: a conversation's Changes view covers what its sub-agents changed, per
/// sub-agent and with the turn that started it; undoing that turn includes their changes
/// when asked (and leaves them when not), in one undo with its note.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_a_parents_turn_can_include_its_sub_agents_changes() {
    let (fx, parent, child) = helper_delegated().await;
    assert_eq!(fx.get("a.txt").as_deref(), Some("child\n"));
    let changes = fx.ok("turn_changes", json!({"session_id": parent})).await;
    let children = changes["children"].as_array().expect("children");
    assert_eq!(children.len(), 1, "{changes}");
    assert_eq!(children[0]["session_id"], child.as_str());
    assert_eq!(children[0]["title"], "helper");
    assert_eq!(children[0]["message_index"], 0);
    let files: Vec<&str> = children[0]["turns"][0]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["a.txt", "b.txt"], "{changes}");
    // Without the sub-agents, the parent's turn changed nothing to undo.
    let alone = fx
        .ok(
            "undo_turn",
            json!({"session_id": parent, "message_index": 0, "preview": true}),
        )
        .await;
    assert_eq!(alone["files"], json!([]), "{alone}");
    let with = fx
        .ok(
            "undo_turn",
            json!({"session_id": parent, "message_index": 0, "preview": true, "include_children": true}),
        )
        .await;
    let paths: Vec<(&str, &str)> = with["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["path"].as_str().unwrap(), f["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        paths,
        [("a.txt", "modified"), ("b.txt", "deleted")],
        "{with}"
    );
    assert_eq!(
        fx.get("b.txt").as_deref(),
        Some("new\n"),
        "a preview changes nothing"
    );
    fx.ok(
        "undo_turn",
        json!({"session_id": parent, "message_index": 0, "include_children": true}),
    )
    .await;
    assert_eq!(fx.get("a.txt").as_deref(), Some("one\n"));
    assert_eq!(fx.get("b.txt"), None);
    // The child's own Changes view says its turn is undone; the parent's note says so.
    let theirs = fx.ok("turn_changes", json!({"session_id": child})).await;
    assert_eq!(theirs["turns"][0]["undone"], true, "{theirs}");
    let child_history = fx.history(&child);
    let told = child_history.last().unwrap();
    assert!(
        told.is_note()
            && told
                .text()
                .contains("undid every file change of this conversation"),
        "{told:?}"
    );
    assert_message_order(&child_history);
    let history = fx.history(&parent);
    let note = history.last().unwrap();
    assert!(note.is_note(), "{note:?}");
    assert!(
        note.text()
            .contains("turn 1 and of the sub-agents started there: b.txt deleted; a.txt restored"),
        "{}",
        note.text()
    );
    assert_message_order(&history);
    fx.shutdown().await;
}

/// E7 from a sub-agent's tab: undoing the sub-agent's own turn notes it in the
/// sub-agent and in its parent, whose history holds the report of those changes; the
/// parent's next model request reads the note.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_in_a_sub_agents_tab_tells_its_parent_too() {
    let (fx, parent, child) = helper_delegated().await;
    let parent_before = fx.history(&parent).len();
    fx.ok(
        "undo_turn",
        json!({"session_id": child, "message_index": 0}),
    )
    .await;
    assert_eq!(fx.get("a.txt").as_deref(), Some("one\n"));
    assert_eq!(fx.get("b.txt"), None);
    let theirs = fx.history(&child);
    assert!(theirs.last().unwrap().is_note(), "{theirs:#?}");
    let history = fx.history(&parent);
    assert_eq!(history.len(), parent_before + 1, "one note: {history:#?}");
    let note = history.last().unwrap().clone();
    assert!(note.is_note() && !note.is_from_person(), "{note:?}");
    assert_eq!(
        note.text(),
        "Note: the person undid the file changes of sub-agent \"helper\" (its turn 1): \
         b.txt deleted; a.txt restored. Its report above may name changes that are no \
         longer in the files."
    );
    assert_message_order(&history);
    let sent = fx.mock.requests().len();
    submit_until_idle(&fx, &parent, "is b.txt there?").await;
    let (messages, at) = note_in_request(&fx, sent, note.text());
    assert_eq!(messages[at + 1]["content"], "is b.txt there?");
    fx.shutdown().await;
}

/// E6 for rewind: rewinding to before a parent's turn can take its sub-agents' changes
/// back too (the same path as undo); without `include_children` they stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_rewind_of_a_parents_turn_can_include_its_sub_agents_changes() {
    let (fx, parent, _child) = helper_delegated().await;
    assert_eq!(fx.get("a.txt").as_deref(), Some("child\n"));
    // Without the sub-agents the parent's own turn changed nothing: the files stay.
    let alone = fx
        .ok(
            "fork_session",
            json!({"session_id": parent, "message_index": 0, "rewind": true}),
        )
        .await;
    assert_eq!(alone["undo"]["files"], json!([]), "{alone}");
    assert_eq!(fx.get("a.txt").as_deref(), Some("child\n"));
    assert_eq!(fx.get("b.txt").as_deref(), Some("new\n"));
    let with = fx
        .ok(
            "fork_session",
            json!({"session_id": parent, "message_index": 0, "rewind": true, "include_children": true}),
        )
        .await;
    assert_eq!(with["undo"]["applied"], true, "{with}");
    assert_eq!(fx.get("a.txt").as_deref(), Some("one\n"));
    assert_eq!(fx.get("b.txt"), None);
    // The original conversation is kept, with the note that says what went back.
    let history = fx.history(&parent);
    let note = history.last().unwrap();
    assert!(
        note.is_note() && note.text().contains("b.txt deleted; a.txt restored"),
        "{note:?}"
    );
    assert_message_order(&history);
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_worktree_apply_with_a_conflict_applies_nothing_and_discard_removes_it() {
    let fx = Fx::new().await;
    repository(&fx);
    let (_parent, child) = delegate_isolated(&fx).await;
    let worktree = fx.service.session_info(&child).unwrap().worktree.unwrap();
    // The person changed a.txt meanwhile: the child's patch no longer applies.
    fx.put("a.txt", "person\n");
    let (code, message) = fx.err("apply_worktree", json!({"session_id": child})).await;
    assert_eq!(code, "conflict");
    assert!(
        message.contains("a.txt") && message.contains("nothing was applied"),
        "{message}"
    );
    assert_eq!(fx.get("a.txt").as_deref(), Some("person\n"));
    assert_eq!(fx.get("b.txt"), None, "nothing applied half-way");
    fx.ok("discard_worktree", json!({"session_id": child}))
        .await;
    assert!(!Path::new(&worktree.path).exists());
    assert_eq!(git(&fx.ws, &["branch", "--list", "bumblehive/*"]), "");
    assert!(fx.service.session_info(&child).unwrap().worktree.is_none());
    let (code, _) = fx
        .err("discard_worktree", json!({"session_id": child}))
        .await;
    assert_eq!(code, "invalid_argument");
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_worktree_isolation_in_a_plain_folder_is_a_clear_tool_error() {
    let fx = Fx::new().await;
    fx.put("a.txt", "one\n");
    isolated_script(&fx.mock, worktree_call());
    let (parent, mut events) = fx.session();
    fx.ok(
        "submit",
        json!({"session_id": parent, "content": "delegate"}),
    )
    .await;
    receive(&mut events, "result", Some(&parent), None).await;
    let history = fx.history(&parent);
    let result = history
        .iter()
        .find(|m| m.tool_call_id.as_deref() == Some("d1"))
        .unwrap();
    assert!(
        result.text().contains("needs a git repository") && result.text().contains("is not in one"),
        "{}",
        result.text()
    );
    // No child was created.
    let sessions = fx.ok("list_sessions", json!({})).await;
    assert_eq!(sessions.as_array().unwrap().len(), 1);
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_worktree_left_behind_is_listed_at_start() {
    let mut fx = Fx::new().await;
    repository(&fx);
    let (_parent, child) = delegate_isolated(&fx).await;
    let worktree = fx.service.session_info(&child).unwrap().worktree.unwrap();
    // The session's folder goes away without the clean-up (as after a crash mid-delete).
    fx.service.shutdown().await;
    std::fs::remove_dir_all(fx.dir.path().join("data/sessions").join(&child)).unwrap();
    fx.service = RuntimeService::new(ServiceOptions {
        data_dir: fx.dir.path().join("data"),
        config_path: None,
        config: Some(config(&fx.mock)),
        provider_factory: Arc::new(provider_from_config),
        tools: None,
    })
    .unwrap();
    let info = fx.ok("app_info", json!({})).await;
    assert_eq!(info["leftover_worktrees"], json!([worktree.path]));
    fx.shutdown().await;
}

/// What the checkpoints leave out is named in the Changes view and the undo preview: a
/// file over the size cap, a nested git repository; the rest of the turn is undone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_names_what_it_cannot_restore() {
    let fx = Fx::new().await;
    let (session, mut events) = fx.session();
    fx.turn(
        &session,
        &mut events,
        "make big things",
        &[(
            "c1",
            "run_command",
            json!({"command": "head -c 11000000 /dev/zero > big.bin && mkdir nested && git -C nested init -q && printf n > nested/n.txt && printf s > small.txt"}),
        )],
    )
    .await;
    let changes = fx.ok("turn_changes", json!({"session_id": session})).await;
    let skipped = changes["turns"][0]["skipped"].to_string();
    assert!(
        skipped.contains("big.bin (over the 10 MB cap)"),
        "{changes}"
    );
    assert!(
        skipped.contains("nested/ (a nested git repository)"),
        "{changes}"
    );
    assert_eq!(changes["turns"][0]["files"][0]["path"], "small.txt");
    let preview = fx
        .ok(
            "undo_turn",
            json!({"session_id": session, "message_index": 0, "preview": true}),
        )
        .await;
    assert!(
        preview["skipped"].to_string().contains("big.bin"),
        "{preview}"
    );
    fx.ok(
        "undo_turn",
        json!({"session_id": session, "message_index": 0}),
    )
    .await;
    assert_eq!(fx.get("small.txt"), None);
    // Not covered, so left as they are.
    assert!(fx.ws.join("big.bin").exists() && fx.ws.join("nested/n.txt").exists());
    fx.shutdown().await;
}

/// A profile with `isolation: worktree` gives its sub-agents a worktree even when the
/// call does not ask for one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_worktree_from_a_profile() {
    let fx = Fx::new().await;
    repository(&fx);
    fx.put(
        ".bumblehive/agents/isolated.md",
        "---\nname: isolated\ndescription: works apart\nisolation: worktree\n---\nWork carefully.\n",
    );
    let (_parent, child) = delegate_with(
        &fx,
        json!({"title": "iso", "task": "rewrite a.txt", "agent": "isolated"}),
    )
    .await;
    let worktree = fx.service.session_info(&child).unwrap().worktree;
    assert!(
        worktree.is_some(),
        "the profile's isolation was not applied"
    );
    assert_eq!(fx.get("a.txt").as_deref(), Some("one\n"));
    let agents = fx
        .ok(
            "list_agents",
            json!({"workspace": fx.ws.display().to_string()}),
        )
        .await;
    let isolated = agents["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "isolated")
        .unwrap()
        .clone();
    assert_eq!(isolated["isolation"], "worktree");
    fx.shutdown().await;
}

/// Incompressible bytes (xorshift), so the store really grows by what is written.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Review R8: a workspace's shadow store that passes its bound is pruned (oldest records
/// first); the kept records still undo, the pruned ones say so, and deleting the session
/// removes the refs that hold its trees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_the_store_is_pruned_to_its_bound_and_kept_turns_still_undo() {
    use bumblehive::checkpoints::{CallHook, Checkpoints, StoreLimits};
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let checkpoints = Checkpoints::new(&dir.path().join("data"));
    if checkpoints.off().is_some() {
        eprintln!("skipped: git is missing");
        return;
    }
    const BOUND: u64 = 2 * 1024 * 1024;
    checkpoints.set_limits(StoreLimits {
        max_bytes: BOUND,
        max_age: std::time::Duration::from_secs(30 * 24 * 3600),
    });
    let mut history = Vec::new();
    for turn in 0..12u64 {
        history.push(Message::user(format!("m{turn}"), format!("turn {turn}")));
        let hook = CallHook::for_run(&checkpoints, "s1", &history).unwrap();
        let before = hook.before(&ws).await.unwrap();
        // 512 KiB that do not compress, new each turn: three times the bound in all,
        // while the workspace itself stays at one such file.
        std::fs::write(ws.join("big.bin"), noise(512 * 1024, turn + 1)).unwrap();
        std::fs::write(ws.join("notes.txt"), format!("version {turn}")).unwrap();
        hook.after(&ws, before, "run_command", &format!("c{turn}"), &json!({}))
            .await;
    }
    // Maintenance runs in the background after a record: wait (bounded) for the bound.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while checkpoints.store_bytes(&ws).unwrap() > BOUND {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the store stayed at {} bytes",
            checkpoints.store_bytes(&ws).unwrap()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The oldest turns were pruned, and say so; the newest were kept.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    let changes = loop {
        let changes = checkpoints.turn_changes("s1").await.unwrap();
        if changes.turns[0].pruned || tokio::time::Instant::now() > deadline {
            break changes;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(changes.turns[0].pruned, "{changes:?}");
    assert!(changes.turns[0].files.is_empty());
    let last = changes.turns.last().unwrap();
    assert!(!last.pruned, "{changes:?}");
    assert!(last.files.iter().any(|f| f.path == "big.bin"), "{last:?}");
    let err = checkpoints.undo("s1", 0, false, false).await.unwrap_err();
    assert!(err.to_string().contains("cleared"), "{err}");
    // The newest turn still undoes, from the trees its refs kept.
    let undone = checkpoints.undo("s1", 11, false, false).await.unwrap();
    assert!(undone.applied, "{undone:?}");
    assert_eq!(
        std::fs::read(ws.join("big.bin")).unwrap(),
        noise(512 * 1024, 11)
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("notes.txt")).unwrap(),
        "version 10"
    );
    // Deleting the session drops its refs: nothing of it holds the store any more.
    let shadow = checkpoints.shadow(&ws);
    assert!(!shadow.refs("refs/bh/").unwrap().is_empty());
    checkpoints.forget_session("s1");
    assert!(shadow.refs("refs/bh/").unwrap().is_empty());
}

/// Security review 2, finding 4: a turn's commands remove a recorded folder and put a
/// symlink to an outside folder in its place (hidden with `.gitignore`); undoing the turn
/// writes nothing through the link (the outside file keeps its content), refuses, and
/// names the path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_writes_nothing_through_a_planted_symlink() {
    let fx = Fx::new().await;
    fx.put("conf/authorized_keys", "REPO-KEY\n");
    let outside = tempfile::tempdir().unwrap();
    let keys = outside.path().join("authorized_keys");
    std::fs::write(&keys, "MINE\n").unwrap();
    let (session, mut events) = fx.session();
    let link = format!(
        "ln -s {} conf && echo conf >> .gitignore",
        outside.path().display()
    );
    // Two steps of one turn, as the review's probe did: each call gets its own snapshots.
    fx.mock.push_sse(openai::tool_answer(
        &[("c1", "run_command", json!({"command": "rm -rf conf"}))],
        (10, 5),
    ));
    fx.turn(
        &session,
        &mut events,
        "tidy up",
        &[("c2", "run_command", json!({"command": link}))],
    )
    .await;
    let undo = dispatch(
        &fx.service,
        "undo_turn",
        json!({"session_id": session, "message_index": 0, "force": true}),
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(&keys).unwrap(),
        "MINE\n",
        "undo wrote through the symlink: {undo:?}"
    );
    let err = undo.expect_err("the undo must refuse");
    assert!(err.to_string().contains("conf"), "{err}");
    fx.shutdown().await;
}

/// Security review 2, finding 13: a command that turns a recorded folder into a symlink
/// does not stop later checkpoints: the next turn's write is recorded and undone. What
/// the checkpoint left out is said to the person: the Changes view of the turn and the
/// undo preview name the symlinked folder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_survives_a_symlinked_folder() {
    let fx = Fx::new().await;
    fx.put("conf/a.txt", "a\n");
    let elsewhere = tempfile::tempdir().unwrap();
    let (session, mut events) = fx.session();
    let link = format!("rm -rf conf && ln -s {} conf", elsewhere.path().display());
    fx.turn(
        &session,
        &mut events,
        "link it",
        &[("c1", "run_command", json!({"command": link}))],
    )
    .await;
    fx.turn(
        &session,
        &mut events,
        "write notes",
        &[(
            "c2",
            "write_file",
            json!({"path": "notes.txt", "content": "notes\n"}),
        )],
    )
    .await;
    assert_eq!(fx.get("notes.txt").as_deref(), Some("notes\n"));
    let first = fx
        .history(&session)
        .iter()
        .position(|m| m.role == bumblehive::protocol::Role::User)
        .unwrap();
    let note = "conf/ (a symlink now: nothing behind it is recorded)";
    let changes = fx.ok("turn_changes", json!({"session_id": session})).await;
    let turn = changes["turns"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["message_index"] == first)
        .unwrap_or_else(|| panic!("no change recorded for the first turn: {changes}"));
    assert!(
        turn["skipped"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == note),
        "{changes}"
    );
    let preview = fx
        .ok(
            "undo_turn",
            json!({"session_id": session, "message_index": first, "preview": true}),
        )
        .await;
    assert!(
        preview["skipped"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == note),
        "{preview}"
    );
    let second = fx
        .history(&session)
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == bumblehive::protocol::Role::User)
        .nth(1)
        .map(|(i, _)| i)
        .unwrap();
    let undone = fx
        .ok(
            "undo_turn",
            json!({"session_id": session, "message_index": second}),
        )
        .await;
    assert_eq!(fx.get("notes.txt"), None, "{undone}");
    fx.shutdown().await;
}

/// Issue 27: Settings shows a workspace's undo history against its bound, and "Clear"
/// empties it through the command table: the store shrinks, every earlier turn of every
/// session there says its history was cleared, undoing one is refused with that reason,
/// and the next turn is recorded (and undone) as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_history_is_shown_against_its_bound_and_clear_empties_it() {
    let fx = Fx::new().await;
    let ws = fx.ws.to_str().unwrap().to_string();
    let empty = fx.ok("undo_history", json!({"workspace": ws})).await;
    if empty["off"].is_string() {
        eprintln!("skipped: git is missing");
        return;
    }
    assert_eq!(empty["bytes"], 0, "{empty}");
    assert_eq!(empty["max_bytes"], 1024 * 1024 * 1024, "{empty}");
    assert_eq!(empty["max_age_days"], 30, "{empty}");
    let (a, mut events_a) = fx.session();
    let (b, mut events_b) = fx.session();
    for (session, events, turn) in [(&a, &mut events_a, 0), (&b, &mut events_b, 1)] {
        let content = format!("{turn}").repeat(2_000);
        fx.turn(
            session,
            events,
            &format!("write {turn}"),
            &[(
                "c1",
                "write_file",
                json!({"path": format!("f{turn}.txt"), "content": content}),
            )],
        )
        .await;
    }
    let before = fx.ok("undo_history", json!({"workspace": ws})).await;
    assert!(before["bytes"].as_u64().unwrap() > 0, "{before}");

    let after = fx.ok("clear_undo_history", json!({"workspace": ws})).await;
    assert!(
        after["bytes"].as_u64().unwrap() < before["bytes"].as_u64().unwrap(),
        "{before} → {after}"
    );
    for session in [&a, &b] {
        let changes = fx.ok("turn_changes", json!({"session_id": session})).await;
        let turn = &changes["turns"][0];
        assert_eq!(turn["pruned"], true, "{changes}");
        let (code, message) = fx
            .err(
                "undo_turn",
                json!({"session_id": session, "message_index": turn["message_index"]}),
            )
            .await;
        assert!(message.contains("cleared"), "{code}: {message}");
    }
    // What the workspace holds now stays; the next turn is recorded and undone as before.
    assert!(fx.get("f0.txt").is_some() && fx.get("f1.txt").is_some());
    fx.turn(
        &a,
        &mut events_a,
        "write again",
        &[(
            "c2",
            "write_file",
            json!({"path": "g.txt", "content": "new"}),
        )],
    )
    .await;
    let changes = fx.ok("turn_changes", json!({"session_id": a})).await;
    let last = changes["turns"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["pruned"], false, "{changes}");
    fx.ok(
        "undo_turn",
        json!({"session_id": a, "message_index": last["message_index"]}),
    )
    .await;
    assert_eq!(fx.get("g.txt"), None);
    assert!(fx.get("f0.txt").is_some(), "an earlier, cleared turn stays");
}

/// Issue 27, "one snapshot per changing call": a call's "before" is the previous call's
/// "after" while nothing changed in the workspace since (its inotify watch says so), so a
/// call walks the workspace once instead of twice. Whatever happens between calls makes
/// the next one walk again, and never shows up as the agent's change: a file the person
/// writes, a mode changed, a folder made and a file then put in it, a folder renamed and
/// a file then put in it, a write by a sandboxed command of another session (bubblewrap's
/// bind mount), a file removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_a_call_after_a_quiet_workspace_takes_one_snapshot() {
    use bumblehive::checkpoints::{CallHook, Checkpoints};
    use std::os::unix::fs::PermissionsExt;

    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    for (rel, text) in [
        ("README.md", "readme\n"),
        ("src/a.rs", "a\n"),
        ("src/deep/b.rs", "b\n"),
    ] {
        std::fs::create_dir_all(ws.join(rel).parent().unwrap()).unwrap();
        std::fs::write(ws.join(rel), text).unwrap();
    }
    let checkpoints = Checkpoints::new(&dir.path().join("data"));
    let hook = CallHook::for_run(&checkpoints, "s", &[Message::user("m0", "go")]).unwrap();
    let mut ctx = crate::tools::context(
        &ws,
        crate::tools::RecordingGate::new(|_| crate::tools::yes()),
    );
    ctx.checkpoints = Some(hook);
    let other = crate::tools::context(
        &ws,
        crate::tools::RecordingGate::new(|_| crate::tools::yes()),
    );
    let tools = crate::tools::with_command(bumblehive::sandbox::CommandSettings::default());
    let mut n = 0;
    // One changing call of the agent; returns how many walks it took.
    let mut call = async |tool: &str, args: Value| {
        n += 1;
        ctx.call_id = format!("c{n}");
        let walks = checkpoints.walks();
        tools
            .call(&ctx, tool, args)
            .await
            .unwrap_or_else(|err| panic!("{tool}: {err}"));
        checkpoints.walks() - walks
    };
    let write = |rel: &str| json!({"path": rel, "content": format!("{rel} by the agent\n")});

    assert_eq!(
        call("write_file", write("agent/1.txt")).await,
        2,
        "the first call walks twice"
    );
    assert_eq!(
        call("write_file", write("agent/2.txt")).await,
        1,
        "nothing changed since"
    );
    let made = call("run_command", json!({"command": "echo x > agent/3.txt"})).await;
    assert_eq!(made, 1, "a sandboxed command after a quiet workspace");

    std::fs::write(ws.join("src/a.rs"), "the person's a\n").unwrap();
    assert_eq!(
        call("write_file", write("agent/4.txt")).await,
        2,
        "a file written between"
    );
    std::fs::set_permissions(ws.join("README.md"), std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(
        call("write_file", write("agent/5.txt")).await,
        2,
        "a mode changed"
    );
    std::fs::create_dir(ws.join("new")).unwrap();
    assert_eq!(
        call("write_file", write("agent/6.txt")).await,
        2,
        "a folder made"
    );
    // The folder made between calls is watched from then on.
    std::fs::write(ws.join("new/inside.txt"), "the person's\n").unwrap();
    assert_eq!(
        call("write_file", write("agent/7.txt")).await,
        2,
        "a file in a new folder"
    );
    std::fs::rename(ws.join("src/deep"), ws.join("src/moved")).unwrap();
    assert_eq!(
        call("write_file", write("agent/8.txt")).await,
        2,
        "a folder renamed"
    );
    // A rename breaks the watch's paths; it is rebuilt, and sees into the moved folder.
    std::fs::write(ws.join("src/moved/c.rs"), "the person's c\n").unwrap();
    assert_eq!(
        call("write_file", write("agent/9.txt")).await,
        2,
        "a file in a moved folder"
    );
    // Another session's sandboxed command writes through bubblewrap's bind mount.
    let out = tools
        .call(
            &other,
            "run_command",
            json!({"command": "echo y > src/other.txt"}),
        )
        .await
        .unwrap();
    assert!(ws.join("src/other.txt").exists(), "{out}");
    assert_eq!(
        call("write_file", write("agent/10.txt")).await,
        2,
        "a sandboxed write between"
    );
    std::fs::remove_file(ws.join("src/a.rs")).unwrap();
    assert_eq!(
        call("write_file", write("agent/11.txt")).await,
        2,
        "a file removed"
    );
    assert_eq!(
        call("write_file", write("agent/12.txt")).await,
        1,
        "quiet again"
    );

    // What the agent changed is exactly its own calls' files, none of the others.
    let changes = checkpoints.turn_changes("s").await.unwrap();
    let mut files: Vec<String> = changes
        .turns
        .iter()
        .flat_map(|t| t.files.iter().map(|f| f.path.clone()))
        .collect();
    files.sort();
    let mut wanted: Vec<String> = (1..=12).map(|k| format!("agent/{k}.txt")).collect();
    wanted.sort();
    assert_eq!(files, wanted);
}
