//! Durability: recovery after an unclean stop or a restart, the report ledger's exactly-once delivery, interrupted children, read-only damaged sessions.

use bumblehive::protocol::SessionState;
use bumblehive::protocol::{Message, MessageStatus, ToolCall};
use bumblehive::store::{NewSession, ReportRecord};
use std::sync::Arc;

use serde_json::json;

use crate::support::*;

fn call(id: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: "read_file".into(),
        arguments: json!({"path": "data.txt"}),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_repairs_a_run_cut_off_mid_batch() {
    let mut fx = Delegation::new();
    let store = fx.service.store();
    let mut meta = store
        .create(NewSession {
            workspace: fx.path().display().to_string(),
            ..NewSession::default()
        })
        .unwrap();
    store
        .append(
            &meta.session_id,
            &[
                Message::user("u1", "ROOT:crash"),
                Message::assistant(None, vec![call("a"), call("b")]),
                Message::tool("a", "done"),
            ],
        )
        .unwrap();
    meta.state = SessionState::Running;
    store.write_meta(&meta).unwrap();
    fx.restart().await;
    assert_eq!(fx.service.recovery().interrupted_runs, 1);
    let history = fx.history(&meta.session_id);
    assert_message_order(&history);
    assert_eq!(history.len(), 4);
    assert!(history[3].text().starts_with("Interrupted"));
    let info = fx.service.session_info(&meta.session_id).unwrap();
    assert_eq!(info.state, SessionState::Paused);
    // A second start finds nothing left to repair.
    fx.restart().await;
    assert_eq!(fx.service.recovery().interrupted_runs, 0);
    assert_eq!(fx.history(&meta.session_id).len(), 4);
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_report_reaches_its_parent_exactly_once_across_restarts() {
    let mut fx = Delegation::new();
    let store = fx.service.store();
    let parent = store
        .create(NewSession {
            workspace: fx.path().display().to_string(),
            ..NewSession::default()
        })
        .unwrap();
    let child = store
        .create(NewSession {
            workspace: fx.path().display().to_string(),
            parent_session_id: Some(parent.session_id.clone()),
            task_id: Some("t1".into()),
            ..NewSession::default()
        })
        .unwrap();
    store
        .record_report(
            &parent.session_id,
            &ReportRecord {
                task_id: "t1".into(),
                child_session_id: child.session_id.clone(),
                message_id: "subagent:t1".into(),
                content: "[Background tool result]\nTask ID: t1\n\nREPORT".into(),
                config: Default::default(),
            },
        )
        .unwrap();
    fx.restart().await;
    assert_eq!(fx.service.recovery().requeued_reports, 1);
    fx.restart().await;
    assert_eq!(fx.service.recovery().requeued_reports, 0);
    let ctl = fx.service.controller(&parent.session_id).unwrap();
    let pending = ctl.pending();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].message_id, "subagent:t1");
    assert_eq!(pending[0].status, MessageStatus::Queued);
    assert!(ctl.is_paused());
    // Delivering it again (a late duplicate) is refused.
    let duplicate = bumblehive::controller::QueuedMessage {
        message_id: "subagent:t1".into(),
        content: "again".into(),
        config: Default::default(),
        images: Vec::new(),
    };
    assert_eq!(ctl.deliver(duplicate), None);
    fx.restart().await;
    let ctl = fx.service.controller(&parent.session_id).unwrap();
    let reports = ctl.pending();
    assert_eq!(reports.len(), 1);
    fx.shutdown().await;
}

/// A parent whose one child is still working (its gate closed) when the app restarts.
/// Returns the parent's and the child's session ids, after the restart.
async fn child_interrupted_by_a_restart(fx: &mut Delegation, root: &str) -> (String, String) {
    let mut begun = fx.begin(root, 1, false, None).await;
    let parent = begun.session_id.clone();
    receive(&mut begun.events, "result", Some(&parent), None).await;
    let child = begun.children[0]["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    drop(begun);
    fx.restart().await;
    (parent, child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_stopped_by_a_restart_is_interrupted_and_resumes_to_one_report() {
    let mut fx = Delegation::new();
    let (parent, child) = child_interrupted_by_a_restart(&mut fx, "resume").await;
    assert_eq!(fx.service.recovery().interrupted_children, 1);
    let info = fx.service.session_info(&child).unwrap();
    assert!(info.interrupted);
    let parent_ctl = fx.service.controller(&parent).unwrap();
    let (mut events, _) = parent_ctl.subscribe();
    fx.provider.gate("resume-0").set();
    fx.service.resume_subagent(&child).await.unwrap();
    assert!(!fx.service.session_info(&child).unwrap().interrupted);
    receive(&mut events, "result", Some(&child), None).await;
    receive(&mut events, "result", Some(&parent), None).await;
    fx.wait_idle().await;
    let history = fx.history(&parent);
    assert_eq!(history.iter().filter(|m| is_report(m)).count(), 1);
    assert!(format!("{history:?}").contains("REPORT:resume-0: DATA:resume"));
    assert_message_order(&history);
    assert_message_order(&fx.history(&child));
    // Resuming what is not interrupted is a clear error.
    let err = fx.service.resume_subagent(&child).await.unwrap_err();
    assert!(err.to_string().contains("not interrupted"), "{err}");
    fx.restart().await;
    assert_eq!(fx.service.recovery(), &Default::default());
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_an_interrupted_child_tells_the_parent() {
    let mut fx = Delegation::new();
    let (parent, child) = child_interrupted_by_a_restart(&mut fx, "gone").await;
    let parent_ctl = fx.service.controller(&parent).unwrap();
    let (mut events, _) = parent_ctl.subscribe();
    fx.service.cancel_session(&child).await.unwrap();
    receive(
        &mut events,
        "message_status",
        Some(&parent),
        Some("started"),
    )
    .await;
    receive(&mut events, "result", Some(&parent), None).await;
    let reports: Vec<Message> = fx.history(&parent).into_iter().filter(is_report).collect();
    assert_eq!(reports.len(), 1);
    assert!(
        reports[0]
            .text()
            .contains("Error:\nthe sub-agent was interrupted")
    );
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_and_paused_survive_a_restart() {
    let mut fx = Delegation::new();
    let mut begun = fx.begin("keep", 1, true, None).await;
    let parent = begun.session_id.clone();
    receive(&mut begun.events, "approval_request", Some(&parent), None).await;
    fx.provider.gate("keep-0").set();
    receive(
        &mut begun.events,
        "message_status",
        Some(&parent),
        Some("steered"),
    )
    .await;
    begun.controller.cancel().await;
    drop(begun);
    fx.restart().await;
    let ctl = fx.service.controller(&parent).unwrap();
    assert!(ctl.is_paused());
    assert_eq!(ctl.pending()[0].message_id, "subagent:delegate-0");
    let (mut events, _) = ctl.subscribe();
    ctl.steer("subagent:delegate-0").unwrap();
    receive(&mut events, "result", Some(&parent), None).await;
    let history = fx.history(&parent);
    assert_eq!(history.iter().filter(|m| is_report(m)).count(), 1);
    assert_message_order(&history);
    fx.restart().await;
    assert_eq!(fx.service.recovery(), &Default::default());
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_session_opens_read_only_and_the_list_still_works() {
    let mut fx = Delegation::new();
    let info = fx
        .service
        .create_session(fx.path().to_str().unwrap(), Some("damaged".into()))
        .unwrap();
    fx.service
        .store()
        .append(&info.session_id, &[Message::user("u1", "hello")])
        .unwrap();
    let path = fx
        .path()
        .join("data/sessions")
        .join(&info.session_id)
        .join("messages.jsonl");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("{garbage\n");
    text.push_str(&serde_json::to_string(&Message::user("u2", "after")).unwrap());
    text.push('\n');
    std::fs::write(&path, text).unwrap();
    fx.restart().await;
    let loaded = fx.service.get_session(&info.session_id).unwrap();
    assert_eq!(loaded.messages.len(), 2);
    assert!(loaded.notice.unwrap().contains("read-only"));
    let ctl = fx.service.controller(&info.session_id).unwrap();
    let err = ctl.submit("more".into(), None).unwrap_err();
    assert!(err.to_string().contains("read-only"), "{err}");
    assert_eq!(fx.service.list_sessions(None).unwrap().len(), 1);
    // Nothing was written to it.
    assert!(std::fs::read_to_string(&path).unwrap().contains("{garbage"));
    fx.shutdown().await;
}

/// Records what the store's flusher had done when the tool ran.
struct FlushWitness {
    name: &'static str,
    changes: bool,
    service: Arc<std::sync::OnceLock<bumblehive::service::RuntimeService>>,
    seen: Arc<std::sync::Mutex<Vec<bumblehive::flush::FlushStats>>>,
}

#[async_trait::async_trait]
impl bumblehive::tools::Tool for FlushWitness {
    fn name(&self) -> &str {
        self.name
    }
    fn description(&self) -> &str {
        "records the flusher's counters"
    }
    fn parameters(&self) -> serde_json::Value {
        json!({"type": "object"})
    }
    fn changes_workspace(&self) -> bool {
        self.changes
    }
    async fn call(
        &self,
        _ctx: &bumblehive::tools::ToolContext,
        _arguments: serde_json::Value,
    ) -> Result<String, bumblehive::tools::ToolError> {
        let stats = self.service.get().expect("service").store().flush_stats();
        self.seen.lock().unwrap().push(stats);
        Ok("ok".into())
    }
}

/// Group commit's ordering (issue 19): a read-only step's flush may overlap the next model
/// call (not asserted: that is a matter of timing), but a tool that changes the workspace
/// runs only once the history that asked for it (its own call included) was flushed, and
/// the run's end waits for its last flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changing_tool_runs_only_once_its_call_is_flushed_and_the_end_waits_for_the_last_flush() {
    // On the disk the build is on: a memory filesystem needs no flush, so nothing to see.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let provider = crate::review::Scripted::new(|request| {
        let assistants = request
            .messages
            .iter()
            .filter(|m| m.role == bumblehive::protocol::Role::Assistant)
            .count();
        match assistants {
            0 => bumblehive::provider::ModelResponse::tool_calls(vec![crate::review::call(
                "r",
                "reads",
                json!({}),
            )]),
            1 => bumblehive::provider::ModelResponse::tool_calls(vec![crate::review::call(
                "w",
                "writes",
                json!({}),
            )]),
            _ => bumblehive::provider::ModelResponse::text("done"),
        }
    });
    let cell = Arc::new(std::sync::OnceLock::new());
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tools = bumblehive::tools::ToolRegistry::default();
    for (name, changes) in [("reads", false), ("writes", true)] {
        tools.register(Arc::new(FlushWitness {
            name,
            changes,
            service: cell.clone(),
            seen: seen.clone(),
        }));
    }
    let service = crate::review::service(
        dir.path(),
        provider,
        bumblehive::config::Config::default(),
        Some(tools),
    );
    let _ = cell.set(service.clone());
    let info = service
        .create_session(dir.path().to_str().unwrap(), None)
        .unwrap();
    let ctl = service.controller(&info.session_id).unwrap();
    ctl.submit("go".into(), None).unwrap();
    crate::review::wait_idle(&service).await;
    let end = service.store().flush_stats();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    if end.requests == 0 {
        // CARGO_TARGET_TMPDIR on a memory filesystem: the flusher is never needed.
        return;
    }
    // The reading tool of the first step: nothing was flushed yet.
    assert_eq!(seen[0].requests, 0, "{seen:?}");
    // The writing tool: the first step's flush (asked when it ended) and the one for its
    // own call were answered before it ran.
    assert!(seen[1].requests >= 2, "{seen:?}");
    assert!(seen[1].syncs >= 1, "{seen:?}");
    // The run's end waited for one more.
    assert!(end.requests > seen[1].requests, "{seen:?} {end:?}");
    service.shutdown().await;
}

/// The disk a process killed now leaves: every later write of `fx`'s data folder is
/// refused (what passed before is there, as the page cache keeps it), the folder is
/// copied, and a new service recovers from the copy. The old service is shut down after.
async fn killed_here(fx: Delegation) -> (tempfile::TempDir, bumblehive::service::RuntimeService) {
    fx.service.store().write_gate().kill();
    let copy = tempfile::tempdir().unwrap();
    crate::lifecycle::copy_dir(&fx.path().join("data"), &copy.path().join("data"));
    let provider = fx.provider.clone();
    provider.parent_release.set();
    // The old service's runs end, so that its shutdown does not wait on them.
    provider.gate("p-0").set();
    let _ = tokio::time::timeout(WAIT, fx.service.shutdown()).await;
    let service = Delegation::open(copy.path(), provider);
    (copy, service)
}

/// How many times `message_id` is in `session`'s history and in its stored queue.
fn stored(
    service: &bumblehive::service::RuntimeService,
    session: &str,
    message_id: &str,
) -> (usize, usize) {
    let history = service
        .store()
        .load(session)
        .unwrap()
        .messages
        .iter()
        .filter(|m| m.id.as_deref() == Some(message_id))
        .count();
    let queued = service
        .controller(session)
        .unwrap()
        .pending()
        .iter()
        .filter(|p| p.message_id == message_id)
        .count();
    (history, queued)
}

/// The process killed after `writes` more writes of `fx`'s data folder.
fn kill_after(fx: &Delegation, writes: u64) {
    fx.service
        .store()
        .write_gate()
        .kill_after(writes, std::time::Duration::ZERO);
}

/// `message_id` is on the recovered disk exactly once, in `session`'s history or queue.
fn assert_stored_once(
    service: &bumblehive::service::RuntimeService,
    session: &str,
    message_id: &str,
    context: &str,
) {
    let (history, queue) = stored(service, session, message_id);
    assert_eq!(
        history + queue,
        1,
        "{context}: the message is in the history {history} times and queued {queue} times"
    );
}

/// A parent `p` held running (its next model call waits, after its `sub_agent` call was
/// answered) with one child waiting at its gate `p-0`.
async fn running_parent() -> (Delegation, Begun) {
    let fx = Delegation::new();
    fx.provider.parent_release.clear();
    let begun = fx.begin("p", 1, false, None).await;
    fx.provider
        .wait_request(|r| r.iter().any(|m| m.role == bumblehive::protocol::Role::Tool))
        .await;
    (fx, begun)
}

/// The running parent of [`running_parent`] with the person's message `queued` in its
/// stored queue: sent while it ran, then the person pressed Stop before the run took it.
async fn paused_with_a_queued_message() -> (Delegation, Begun, String) {
    let (fx, begun) = running_parent().await;
    let (queued, status) = begun
        .controller
        .submit("a note while it works".into(), None)
        .unwrap();
    assert_eq!(status, MessageStatus::Steered);
    fx.service.cancel_session(&begun.session_id).await.unwrap();
    assert!(
        begun
            .controller
            .pending()
            .iter()
            .any(|p| p.message_id == queued),
        "Stop puts the message the run did not take back in the queue"
    );
    (fx, begun, queued)
}

/// SPEC §12.2 at every write: the person steers a queued message into a stopped parent,
/// and the process is killed after each number of writes in turn. The message is on the
/// disk exactly once whatever the kill cuts short, whether the call answered or not.
/// Before, steering wrote the queue without the message first and the new run's history
/// with it second: killed between the two, the message was nowhere (found by the
/// simulation's kill at a write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_steered_is_on_disk_at_every_write() {
    for writes in 0..4 {
        let (fx, begun, queued) = paused_with_a_queued_message().await;
        kill_after(&fx, writes);
        let steered = begun.controller.steer(&queued);
        let (_copy, service) = killed_here(fx).await;
        assert_stored_once(
            &service,
            &begun.session_id,
            &queued,
            &format!("killed after {writes} writes (the steer answered {steered:?})"),
        );
        service.shutdown().await;
    }
}

/// A message the run took from its inbox at a safe point stays in the stored queue until
/// the history has it: another message steered in at that moment writes the queue again,
/// and the process is killed before the run's history write. Before, that queue was
/// written without the taken message, which was then on the disk nowhere though the person
/// had been told it was taken (found by the simulation, seed 520018 of 520000..520160).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_run_took_stays_queued_on_disk_until_its_history_has_it() {
    let (fx, begun) = running_parent().await;
    let (first, status) = begun
        .controller
        .submit("a first note".into(), None)
        .unwrap();
    assert_eq!(status, MessageStatus::Steered);
    // What a safe point does first; its history write would follow.
    assert_eq!(
        begun.controller.take_inbox_now(),
        std::slice::from_ref(&first)
    );
    let (second, status) = begun
        .controller
        .submit("a second note".into(), None)
        .unwrap();
    assert_eq!(status, MessageStatus::Steered);
    let (_copy, service) = killed_here(fx).await;
    assert_stored_once(&service, &begun.session_id, &first, "taken by the run");
    assert_stored_once(&service, &begun.session_id, &second, "steered after it");
    service.shutdown().await;
}

/// A person's message is acknowledged only once the disk has it: to a running parent,
/// with the process killed (or the disk full) after each number of writes in turn, a
/// message the call answered "steered" for is on the disk the kill leaves. Before, a
/// failed write of the queue was logged and the call answered "steered" for a message
/// only memory held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_person_is_told_was_taken_is_on_disk() {
    for writes in 0..3 {
        let (fx, begun) = running_parent().await;
        kill_after(&fx, writes);
        let sent = begun
            .controller
            .submit("a note while it works".into(), None);
        if let Err(err) = &sent {
            // Refused: nothing of it is left to run either.
            let snapshot = begun.controller.snapshot();
            assert!(snapshot.pending.is_empty(), "{err}: {:?}", snapshot.pending);
        }
        let (_copy, service) = killed_here(fx).await;
        if let Ok((id, status)) = &sent {
            assert_stored_once(
                &service,
                &begun.session_id,
                id,
                &format!("killed after {writes} writes, the call answered {status:?}"),
            );
        }
        service.shutdown().await;
    }
}

/// The same for a follow-up that starts an idle child's next run: answered "started", it
/// is on the disk the kill leaves, after each number of writes in turn. Before, the
/// child's stored queue was written by the start, whose failure was logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_the_person_is_told_started_is_on_disk() {
    for writes in 0..4 {
        let fx = Delegation::new();
        let begun = fx.begin("p", 1, false, None).await;
        let child = begun.children[0]["session_id"]
            .as_str()
            .unwrap()
            .to_string();
        fx.provider.gate("p-0").set();
        fx.wait_idle().await;
        kill_after(&fx, writes);
        let sent = fx
            .service
            .submit_message(&child, "one more thing".into(), None)
            .await;
        let (_copy, service) = killed_here(fx).await;
        if let Ok((id, status)) = &sent {
            assert_stored_once(
                &service,
                &child,
                id,
                &format!("killed after {writes} writes, the follow-up's call answered {status:?}"),
            );
        }
        service.shutdown().await;
    }
}

/// A discard the disk did not take is refused, not answered: the message would come back
/// at the next start. Killed after each number of writes in turn: a discard that answered
/// leaves the message out of the recovered queue, a refused one leaves it queued, in
/// memory and on the disk alike. Before, the failed write was logged, the call answered,
/// and the message came back after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discard_is_answered_only_once_the_disk_has_it() {
    for writes in 0..2 {
        let (fx, begun, queued) = paused_with_a_queued_message().await;
        kill_after(&fx, writes);
        let discarded = begun.controller.discard(&queued);
        let still_pending = begun
            .controller
            .pending()
            .iter()
            .any(|p| p.message_id == queued);
        assert_eq!(
            still_pending,
            discarded.is_err(),
            "killed after {writes} writes, the discard answered {discarded:?}"
        );
        let (_copy, service) = killed_here(fx).await;
        let (history, queue) = stored(&service, &begun.session_id, &queued);
        assert_eq!(
            (history, queue),
            (0, usize::from(discarded.is_err())),
            "killed after {writes} writes, the discard answered {discarded:?}"
        );
        service.shutdown().await;
    }
}

/// A rename, a model change or an archive is answered only once the disk has it: with the
/// process killed (or the disk full) after each number of writes in turn, a change the
/// call answered for is what the recovered session says, and a refused one leaves the
/// session as it was, in memory, in the session list and on the disk. Before, a failed
/// meta write was logged and the call answered with a change a restart lost (the list
/// even showed it, from the index line written first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_or_a_model_change_is_answered_only_once_the_disk_has_it() {
    type Edit = fn(&bumblehive::service::RuntimeService, &str) -> Result<(), String>;
    type Read = fn(&bumblehive::store::SessionMeta) -> String;
    let edits: [(&str, Edit, Read); 3] = [
        (
            "rename",
            |service, id| {
                service
                    .rename_session(id, "Renamed")
                    .map(drop)
                    .map_err(|e| e.to_string())
            },
            |info| info.title.clone(),
        ),
        (
            "model",
            |service, id| {
                service
                    .set_model(id, None, Some("another-model".into()))
                    .map(drop)
                    .map_err(|e| e.to_string())
            },
            |info| format!("{:?}", info.model),
        ),
        (
            "archive",
            |service, id| {
                service
                    .archive_session(id, true)
                    .map(drop)
                    .map_err(|e| e.to_string())
            },
            |info| info.archived.to_string(),
        ),
    ];
    let mut refused = 0;
    for (name, edit, read) in edits {
        for writes in 0..3 {
            let fx = Delegation::new();
            let workspace = fx.path().join("w");
            std::fs::create_dir_all(&workspace).unwrap();
            let id = fx
                .service
                .create_session(workspace.to_str().unwrap(), None)
                .unwrap()
                .session_id;
            let controller = fx.service.controller(&id).unwrap();
            let before = read(&controller.current_meta());
            kill_after(&fx, writes);
            let answered = edit(&fx.service, &id);
            let context = format!("{name}, killed after {writes} writes, answered {answered:?}");
            if answered.is_err() {
                refused += 1;
                let kept = read(&controller.current_meta());
                assert_eq!(
                    kept, before,
                    "{context}: the session holds the refused change"
                );
            }
            let (_copy, service) = killed_here(fx).await;
            let listed = service
                .list_sessions(None)
                .unwrap()
                .into_iter()
                .find(|s| s.session_id == id)
                .expect("the session is listed");
            let stored = service.store().meta(&id).unwrap();
            let recovered = read(&stored);
            if answered.is_ok() {
                assert_ne!(recovered, before, "{context}: a restart lost the change");
            } else {
                assert_eq!(recovered, before, "{context}");
            }
            assert_eq!(
                (&listed.title, &listed.model, listed.archived),
                (&stored.title, &stored.model, stored.archived),
                "{context}: the list and the session disagree"
            );
            service.shutdown().await;
        }
    }
    assert!(
        refused >= 3,
        "no kill refused a change: the test did not test"
    );
}
