//! The founding scenarios of ../shared/seed/test_background_delegation.py, one test each, same names without `test_`, same assertions.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bumblehive::protocol::{Message, Role, SubagentState};
use bumblehive::subagents::{
    ChildOutcome, ChildStart, LeaseFn, NotifyFn, Report, RunnerFn, SubagentObserver, SubagentTasks,
};
use futures::FutureExt;
use serde_json::{Value, json};

use crate::support::*;

async fn background_returns_then_wakes_idle_parent_and_preserves_order(count: usize) {
    let fx = Delegation::new();
    let mut begun = fx.begin("idle", count, false, None).await;
    let parent = begun.session_id.clone();
    assert!(begun.children.iter().all(|c| c.get("background").is_none()));
    receive(&mut begun.events, "result", Some(&parent), None).await;
    let history = fx.history(&parent);
    let tool_results: Vec<Value> = history
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| serde_json::from_str(m.text()).unwrap())
        .collect();
    let expected: Vec<Value> = (0..count)
        .map(|i| json!({"status": "pending", "task_id": format!("delegate-{i}")}))
        .collect();
    assert_eq!(tool_results, expected);
    assert_eq!(fx.service.active_runs(), count);
    let busy = fx
        .service
        .update_config(&json!({"provider": {"model": "other"}}));
    assert_eq!(busy.unwrap_err().code(), "busy");
    assert_eq!(fx.service.subagents().snapshot(&parent).len(), count);
    for i in 0..count {
        fx.provider.gate(&format!("idle-{i}")).set();
    }
    let mut unfinished: std::collections::HashSet<String> = begun
        .children
        .iter()
        .map(|c| c["session_id"].as_str().unwrap().to_string())
        .collect();
    while !unfinished.is_empty() {
        let ended = receive(&mut begun.events, "result", None, None).await;
        unfinished.remove(ended["session_id"].as_str().unwrap());
    }
    fx.wait_idle().await;
    assert!(!begun.controller.is_running());
    assert_eq!(fx.service.subagents().snapshot(&parent), vec![]);
    let history = fx.history(&parent);
    let reports: Vec<&Message> = history.iter().filter(|m| is_report(m)).collect();
    assert_eq!(reports.len(), count);
    let ids: std::collections::HashSet<String> = reports
        .iter()
        .map(|m| {
            m.text()
                .split_once("Task ID: ")
                .unwrap()
                .1
                .split_once('\n')
                .unwrap()
                .0
                .to_string()
        })
        .collect();
    assert_eq!(ids, (0..count).map(|i| format!("delegate-{i}")).collect());
    assert!(reports.iter().all(|m| m.role == Role::User));
    assert!(reports.iter().all(|m| {
        m.text()
            .split_once("\n\n")
            .unwrap()
            .1
            .starts_with("REPORT:idle-")
    }));
    for child in &begun.children {
        assert!(!fx.history(child["session_id"].as_str().unwrap()).is_empty());
    }
    assert_message_order(&history);
    for request in fx.provider.requests() {
        assert_message_order(&request);
    }
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_returns_then_wakes_idle_parent_and_preserves_order_1() {
    background_returns_then_wakes_idle_parent_and_preserves_order(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_returns_then_wakes_idle_parent_and_preserves_order_3() {
    background_returns_then_wakes_idle_parent_and_preserves_order(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_parent_sessions_keep_results_and_workspaces_separate() {
    let fx = Delegation::new();
    let (one, two) = tokio::join!(
        fx.begin("one", 2, false, None),
        fx.begin("two", 1, false, None)
    );
    let mut parents = [one, two];
    for begun in parents.iter_mut() {
        let id = begun.session_id.clone();
        receive(&mut begun.events, "result", Some(&id), None).await;
    }
    for name in ["two-0", "one-1", "one-0"] {
        fx.provider.gate(name).set();
    }
    fx.wait_idle().await;
    assert!(parents.iter().all(|p| !p.controller.is_running()));
    for (root, begun) in ["one", "two"].into_iter().zip(parents.iter()) {
        let history = fx.history(&begun.session_id);
        let text = format!("{history:?}");
        let other = if root == "one" { "two" } else { "one" };
        assert!(text.contains(&format!("REPORT:{root}-")));
        assert!(!text.contains(&format!("REPORT:{other}-")));
        assert!(text.contains(&format!("DATA:{root}")));
        assert!(!text.contains(&format!("DATA:{other}")));
        assert_message_order(&history);
    }
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_during_approval_is_steered_then_restored_on_stop() {
    let fx = Delegation::new();
    let mut begun = fx.begin("stop", 1, true, None).await;
    let parent = begun.session_id.clone();
    receive(&mut begun.events, "approval_request", Some(&parent), None).await;
    fx.provider.gate("stop-0").set();
    receive(
        &mut begun.events,
        "message_status",
        Some(&parent),
        Some("steered"),
    )
    .await;
    begun.controller.cancel().await;
    let pending = begun.controller.pending();
    assert_eq!(pending.len(), 1);
    let report_id = pending[0].message_id.clone();
    assert_eq!(report_id, "subagent:delegate-0");
    let (_again, snapshot) = begun.controller.subscribe();
    assert_eq!(snapshot.pending[0].message_id, report_id);
    assert!(!snapshot.running);
    assert!(!fx.path().join("approval.txt").exists());
    begun.controller.steer(&report_id).unwrap();
    receive(&mut begun.events, "result", Some(&parent), None).await;
    let history = fx.history(&parent);
    assert_eq!(history.iter().filter(|m| is_report(m)).count(), 1);
    assert_message_order(&history);
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_report_after_stop_stays_queued_until_manual_resume() {
    let fx = Delegation::new();
    fx.provider.parent_release.clear();
    let mut begun = fx.begin("late", 1, false, None).await;
    let parent = begun.session_id.clone();
    while receive(&mut begun.events, "event", None, None).await["kind"] != "tool.call.finished" {}
    begun.controller.cancel().await;
    fx.provider.gate("late-0").set();
    receive(
        &mut begun.events,
        "message_status",
        Some(&parent),
        Some("queued"),
    )
    .await;
    tokio::time::timeout(WAIT, fx.service.subagents().wait_empty())
        .await
        .unwrap();
    assert!(!begun.controller.is_running());
    let pending = begun.controller.pending();
    assert_eq!(pending.len(), 1);
    assert!(
        pending[0]
            .config
            .runtime
            .workspace
            .as_deref()
            .unwrap()
            .ends_with("late")
    );
    fx.provider.parent_release.set();
    begun.controller.steer(&pending[0].message_id).unwrap();
    receive(&mut begun.events, "result", Some(&parent), None).await;
    assert!(format!("{:?}", fx.history(&parent)).contains("REPORT:late-0"));
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_does_not_cancel_background_and_snapshot_is_authoritative() {
    let fx = Delegation::new();
    let mut begun = fx.begin("reconnect", 1, false, None).await;
    let parent = begun.session_id.clone();
    receive(&mut begun.events, "result", Some(&parent), None).await;
    begun.controller.unsubscribe(begun.events);
    let (again, snapshot) = begun.controller.subscribe();
    assert!(!snapshot.running);
    assert_eq!(
        fx.service.subagents().snapshot(&parent)[0].session_id,
        begun.children[0]["session_id"].as_str().unwrap()
    );
    begun.controller.unsubscribe(again);
    fx.provider.gate("reconnect-0").set();
    fx.wait_idle().await;
    assert!(!begun.controller.is_running());
    let (_final_events, final_snapshot) = begun.controller.subscribe();
    assert!(!final_snapshot.running);
    assert_eq!(fx.service.subagents().snapshot(&parent), vec![]);
    assert!(format!("{:?}", fx.history(&parent)).contains("REPORT:reconnect-0"));
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_reports_once_and_delete_cancels_without_waking_parent() {
    let fx = Delegation::new();
    fx.provider.child_error.store(true, Ordering::SeqCst);
    let mut begun = fx.begin("error", 1, false, None).await;
    let parent = begun.session_id.clone();
    receive(&mut begun.events, "result", Some(&parent), None).await;
    fx.provider.gate("error-0").set();
    receive(
        &mut begun.events,
        "message_status",
        Some(&parent),
        Some("started"),
    )
    .await;
    receive(&mut begun.events, "result", Some(&parent), None).await;
    let reports: Vec<Message> = fx.history(&parent).into_iter().filter(is_report).collect();
    assert_eq!(reports.len(), 1);
    assert_eq!(
        reports[0].text(),
        "[Background tool result]\nTask ID: delegate-0\n\nError:\nchild execution failed"
    );
    fx.provider.child_error.store(false, Ordering::SeqCst);
    let mut second = fx.begin("delete", 1, false, None).await;
    let parent2 = second.session_id.clone();
    receive(&mut second.events, "result", Some(&parent2), None).await;
    let child = second.children[0]["session_id"].as_str().unwrap();
    fx.service.delete_session(child).await.unwrap();
    assert!(!second.controller.is_running() && second.controller.pending().is_empty());
    assert!(fx.service.subagents().snapshot(&parent2).is_empty());
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_arriving_during_final_model_response_follows_assistant() {
    let fx = Delegation::new();
    fx.provider.parent_release.clear();
    let mut begun = fx.begin("final", 1, false, None).await;
    let parent = begun.session_id.clone();
    // Wait until the parent has requested its answer with the delegation result.
    fx.provider
        .wait_request(|messages| {
            messages.last().unwrap().role == Role::Tool
                && messages[1].text().starts_with("ROOT:final")
        })
        .await;
    fx.provider.gate("final-0").set();
    receive(
        &mut begun.events,
        "message_status",
        Some(&parent),
        Some("steered"),
    )
    .await;
    fx.provider.parent_release.set();
    receive(&mut begun.events, "result", Some(&parent), None).await;
    let history = fx.history(&parent);
    let index = history.iter().position(is_report).unwrap();
    assert_eq!(history[index - 1].role, Role::Assistant);
    assert!(history[index - 1].tool_calls.is_empty());
    assert_message_order(&history);
    begun.controller.cancel().await;
    assert!(
        begun.controller.pending().is_empty(),
        "a consumed report must not be restored"
    );
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_during_approval_is_consumed_after_complete_tool_batch() {
    let fx = Delegation::new();
    let mut begun = fx.begin("approve", 1, true, None).await;
    let parent = begun.session_id.clone();
    let approval = receive(&mut begun.events, "approval_request", Some(&parent), None).await;
    fx.provider.gate("approve-0").set();
    receive(
        &mut begun.events,
        "message_status",
        Some(&parent),
        Some("steered"),
    )
    .await;
    assert!(begun.controller.pending().is_empty());
    begun
        .controller
        .decide_approval(approval["approval_id"].as_str().unwrap(), false)
        .unwrap();
    receive(&mut begun.events, "result", Some(&parent), None).await;
    let history = fx.history(&parent);
    let index = history.iter().position(is_report).unwrap();
    assert_eq!(history[index - 1].role, Role::Tool);
    assert_message_order(&history);
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extremely_fast_children_still_report_after_the_tool_batch() {
    let fx = Delegation::new();
    for i in 0..3 {
        fx.provider.gate(&format!("fast-{i}")).set();
    }
    let begun = fx.begin("fast", 3, false, None).await;
    fx.wait_idle().await;
    assert!(!begun.controller.is_running());
    let history = fx.history(&begun.session_id);
    let notices: Vec<&Message> = history.iter().filter(|m| is_report(m)).collect();
    assert_eq!(notices.len(), 3);
    assert!(notices.iter().all(|m| m.text().contains("REPORT:fast-")));
    assert_message_order(&history);
    fx.shutdown().await;
}

/// The seed's RecordingSubagentObserver.
#[derive(Default)]
struct RecordingObserver {
    cancelled: Mutex<Vec<String>>,
    errors: Mutex<Vec<Value>>,
}

impl SubagentObserver for RecordingObserver {
    fn state(&self, _session_id: &str, _state: SubagentState) {}
    fn cancelled(&self, session_id: &str) {
        self.cancelled.lock().unwrap().push(session_id.to_string());
    }
    fn error(&self, session_id: &str, message: &str) {
        self.errors
            .lock()
            .unwrap()
            .push(json!({"session_id": session_id, "message": message}));
    }
}

fn recording_notify() -> (NotifyFn, Arc<Mutex<Vec<Report>>>) {
    let reports = Arc::new(Mutex::new(Vec::new()));
    let sink = reports.clone();
    let notify: NotifyFn = Arc::new(move |report| {
        sink.lock().unwrap().push(report);
        async {}.boxed()
    });
    (notify, reports)
}

/// These tests never get a lease, so the runner must never be reached.
fn unreachable_runner() -> RunnerFn {
    Arc::new(|_, _| async { ChildOutcome::Failed("the runner must not start".into()) }.boxed())
}

fn child_start(task_id: &str, title: &str) -> ChildStart {
    ChildStart {
        task_id: task_id.into(),
        session_id: "child".into(),
        parent_session_id: "parent".into(),
        title: title.into(),
        workspace: "/tmp".into(),
        config: Default::default(),
        depth: 1,
        server: None,
        run: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_cancel_before_lease_does_not_leave_startup_waiting() {
    let blocked_lease: LeaseFn = Arc::new(|_: &ChildStart| futures::future::pending().boxed());
    let (notify, reports) = recording_notify();
    let observer = Arc::new(RecordingObserver::default());
    let tasks = SubagentTasks::new(blocked_lease, unreachable_runner(), notify);
    let startup = tokio::spawn({
        let tasks = tasks.clone();
        let observer = observer.clone();
        async move {
            tasks
                .start(child_start("delegate-blocked", "Waiting"), observer)
                .await
        }
    });
    // Cancel before the worker can acquire its lease (it never could: the lease blocks).
    let mut registered = tasks.watch_len();
    tokio::time::timeout(WAIT, registered.wait_for(|n| *n == 1))
        .await
        .unwrap()
        .unwrap();
    tasks.cancel("child").await;
    let err = tokio::time::timeout(Duration::from_secs(1), startup)
        .await
        .expect("startup left waiting")
        .unwrap()
        .unwrap_err();
    assert!(err.to_string().contains("stopped before startup"), "{err}");
    assert_eq!(
        *observer.cancelled.lock().unwrap(),
        vec!["child".to_string()]
    );
    assert!(reports.lock().unwrap().is_empty() && tasks.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_startup_failure_is_one_tool_error_without_completion_notice() {
    let failed_lease: LeaseFn =
        Arc::new(|_: &ChildStart| async { Err("runtime unavailable".to_string()) }.boxed());
    let (notify, reports) = recording_notify();
    let observer = Arc::new(RecordingObserver::default());
    let tasks = SubagentTasks::new(failed_lease, unreachable_runner(), notify);
    let err = tasks
        .start(child_start("delegate-failed", "Start"), observer.clone())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("runtime unavailable"), "{err}");
    assert_eq!(
        *observer.errors.lock().unwrap(),
        vec![json!({"session_id": "child", "message": "runtime unavailable"})]
    );
    assert!(observer.cancelled.lock().unwrap().is_empty());
    assert!(reports.lock().unwrap().is_empty() && tasks.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parent_failure_does_not_auto_resume_for_late_report() {
    let fx = Delegation::new();
    fx.provider.parent_error.store(true, Ordering::SeqCst);
    let mut begun = fx.begin("parent-error", 1, false, None).await;
    let parent = begun.session_id.clone();
    receive(&mut begun.events, "error", Some(&parent), None).await;
    fx.provider.gate("parent-error-0").set();
    receive(
        &mut begun.events,
        "message_status",
        Some(&parent),
        Some("queued"),
    )
    .await;
    tokio::time::timeout(WAIT, fx.service.subagents().wait_empty())
        .await
        .unwrap();
    assert!(!begun.controller.is_running() && begun.controller.is_paused());
    let pending = begun.controller.pending();
    assert_eq!(pending.len(), 1);
    fx.provider.parent_error.store(false, Ordering::SeqCst);
    begun.controller.steer(&pending[0].message_id).unwrap();
    receive(&mut begun.events, "result", Some(&parent), None).await;
    assert!(format!("{:?}", fx.history(&parent)).contains("REPORT:parent-error-0"));
    fx.shutdown().await;
}
