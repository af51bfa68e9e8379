//! The controller's delivery table (SPEC §4) state by state, steer/discard errors, submit after Stop, and subscriber lag.

use std::sync::Arc;

use async_trait::async_trait;
use bumblehive::controller::{QueuedMessage, Received};
use bumblehive::protocol::{Message, MessageStatus, Role, SubagentState};
use bumblehive::provider::{
    ModelProvider, ModelRequest, ModelResponse, ProviderError, ProviderSink, fixed_provider,
};
use bumblehive::service::{RuntimeService, ServiceOptions};
use serde_json::json;

use crate::support::*;

/// Answers `echo:<last user text>` once `release` is set.
struct GatedEcho {
    release: Flag,
}

#[async_trait]
impl ModelProvider for GatedEcho {
    async fn generate(
        &self,
        request: ModelRequest,
        _sink: ProviderSink<'_>,
    ) -> Result<ModelResponse, ProviderError> {
        self.release.wait().await;
        let last = request
            .messages
            .iter()
            .rev()
            .find(|m| m.role == Role::User)
            .map(|m| m.text().to_string())
            .unwrap_or_default();
        Ok(ModelResponse::text(format!("echo:{last}")))
    }
}

struct Fixture {
    service: RuntimeService,
    release: Flag,
    _dir: tempfile::TempDir,
    workspace: String,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let release = Flag::new(false);
    let service = RuntimeService::new(ServiceOptions {
        data_dir: dir.path().join("data"),
        config_path: None,
        config: None,
        provider_factory: fixed_provider(Arc::new(GatedEcho {
            release: release.clone(),
        })),
        tools: None,
    })
    .unwrap();
    let workspace = dir.path().display().to_string();
    Fixture {
        service,
        release,
        _dir: dir,
        workspace,
    }
}

fn message(id: &str) -> QueuedMessage {
    QueuedMessage {
        message_id: id.into(),
        content: format!("content of {id}"),
        config: Default::default(),
        images: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_table_idle_running_paused() {
    let fx = fixture();
    let info = fx.service.create_session(&fx.workspace, None).unwrap();
    let ctl = fx.service.controller(&info.session_id).unwrap();
    let (mut events, _) = ctl.subscribe();

    // idle → a run starts with it
    assert_eq!(ctl.deliver(message("a")), Some(MessageStatus::Started));
    let status = receive(&mut events, "message_status", None, None).await;
    assert_eq!(status["status"], "started");
    assert!(ctl.is_running());

    // running → steered into the inbox, visible in the snapshot as steered
    assert_eq!(ctl.deliver(message("b")), Some(MessageStatus::Steered));
    let snapshot = ctl.snapshot();
    assert_eq!(snapshot.pending.len(), 1);
    assert_eq!(snapshot.pending[0].status, MessageStatus::Steered);

    // Stop: the unconsumed steered message goes back to pending, the session is paused
    ctl.cancel().await;
    assert!(ctl.is_paused() && !ctl.is_running());
    assert_eq!(
        ctl.pending()
            .iter()
            .map(|m| m.message_id.clone())
            .collect::<Vec<_>>(),
        ["b"]
    );

    // paused → queued, nothing starts
    assert_eq!(ctl.deliver(message("c")), Some(MessageStatus::Queued));
    assert!(!ctl.is_running());
    assert_eq!(ctl.pending().len(), 2);

    // the same id is never delivered twice
    assert_eq!(ctl.deliver(message("c")), None);

    // steer starts a run with it and clears paused; the other stays pending
    fx.release.set();
    assert_eq!(ctl.steer("c").unwrap(), MessageStatus::Started);
    let result = receive(&mut events, "result", Some(&info.session_id), None).await;
    assert_eq!(result["content"], "echo:content of c");
    assert!(!ctl.is_paused());
    assert_eq!(ctl.pending().len(), 1);
    ctl.discard("b").unwrap();
    assert!(ctl.pending().is_empty());
    fx.service.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steer_and_discard_of_unknown_message_give_a_clear_error() {
    let fx = fixture();
    let info = fx.service.create_session(&fx.workspace, None).unwrap();
    let ctl = fx.service.controller(&info.session_id).unwrap();
    let err = ctl.steer("nope").unwrap_err();
    assert_eq!(err.code(), "not_found");
    assert!(err.to_string().contains("pending message nope"), "{err}");
    let err = ctl.discard("nope").unwrap_err();
    assert_eq!(err.code(), "not_found");
    assert!(err.to_string().contains("nope"), "{err}");
    fx.service.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persons_message_after_stop_resumes_the_session() {
    let fx = fixture();
    let info = fx.service.create_session(&fx.workspace, None).unwrap();
    let ctl = fx.service.controller(&info.session_id).unwrap();
    let (mut events, _) = ctl.subscribe();
    ctl.submit("first".into(), None).unwrap();
    ctl.cancel().await;
    assert!(ctl.is_paused());
    assert_eq!(ctl.deliver(message("report")), Some(MessageStatus::Queued));
    fx.release.set();
    let (_, status) = ctl.submit("second".into(), None).unwrap();
    assert_eq!(status, MessageStatus::Started);
    let result = receive(&mut events, "result", Some(&info.session_id), None).await;
    assert_eq!(result["content"], "echo:second");
    // The queued report still waits for the person.
    assert_eq!(ctl.pending()[0].message_id, "report");
    let history = fx.service.store().load(&info.session_id).unwrap().messages;
    assert_message_order(&history);
    assert!(ctl.submit("   ".into(), None).is_err());
    fx.service.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_subscriber_is_told_to_resync() {
    let fx = fixture();
    let info = fx.service.create_session(&fx.workspace, None).unwrap();
    let ctl = fx.service.controller(&info.session_id).unwrap();
    let (mut slow, _) = ctl.subscribe();
    // More messages than the event buffer holds, steered into a run that waits on its
    // model: each emits one status event.
    ctl.submit("x".into(), None).unwrap();
    for i in 0..5000 {
        assert_eq!(
            ctl.deliver(message(&format!("m{i}"))),
            Some(MessageStatus::Steered)
        );
    }
    let mut lagged = false;
    while let Ok(Some(item)) =
        tokio::time::timeout(std::time::Duration::from_millis(0), slow.recv()).await
    {
        if let Received::Lagged(missed) = item {
            assert!(missed > 0);
            lagged = true;
            break;
        }
    }
    assert!(lagged, "a subscriber that fell behind must be told");
    assert_eq!(ctl.snapshot().pending.len(), 5000);
    ctl.cancel().await;
    assert_eq!(ctl.pending().len(), 5000);
    fx.service.shutdown().await;
}

/// A stop during the approval of a batch reports each call finished exactly once: the
/// `sub_agent` call that already returned keeps its result (no synthetic "cancelled" for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_mid_batch_reports_each_call_finished_once() {
    let fx = Delegation::new();
    let mut begun = fx.begin("once", 1, true, None).await;
    let parent = begun.session_id.clone();
    let mut finished: Vec<(String, bool)> = Vec::new();
    let mut asked = false;
    let mut stopped = false;
    loop {
        let event = tokio::time::timeout(WAIT, begun.events.next_event())
            .await
            .expect("timed out waiting for the stop")
            .expect("event stream closed");
        let value = serde_json::to_value(&event).unwrap();
        if value["session_id"] != parent.as_str() {
            continue;
        }
        asked |= value["type"] == "approval_request";
        if value["type"] == "event" && value["kind"] == "tool.call.finished" {
            let data = &value["data"];
            finished.push((
                data["call_id"].as_str().unwrap().to_string(),
                data["is_error"].as_bool().unwrap(),
            ));
        }
        // Stop once the sub_agent call has returned and the write waits for its approval.
        if asked && !finished.is_empty() && !stopped {
            stopped = true;
            begun.controller.cancel().await;
        }
        if value["type"] == "event" && value["kind"] == "run.cancelled" {
            break;
        }
    }
    assert_eq!(
        finished,
        vec![
            ("delegate-0".to_string(), false),
            ("write-parent".to_string(), true)
        ]
    );
    assert_message_order(&fx.history(&parent));
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_child_waiting_for_a_slot_reports_that_once() {
    let fx = Delegation::new();
    fx.service
        .update_config(&json!({"subagents": {"max_concurrent": 1}}))
        .unwrap();
    let mut begun = fx.begin("slot", 2, false, None).await;
    let parent = begun.session_id.clone();
    let ids: Vec<String> = begun
        .children
        .iter()
        .map(|c| c["session_id"].as_str().unwrap().to_string())
        .collect();
    // Wait (on events) until one child holds the only slot and the other waits for it,
    // both read in one look: two looks could see the first child waiting, then the same
    // child running with the other not yet waiting.
    let states = |fx: &Delegation| -> Vec<Option<SubagentState>> {
        ids.iter()
            .map(|id| fx.service.subagents().state_of(id))
            .collect()
    };
    let index = loop {
        let now = states(&fx);
        let waiting = now
            .iter()
            .position(|s| *s == Some(SubagentState::WaitingForSlot));
        match waiting {
            Some(index) if now.contains(&Some(SubagentState::Running)) => break index,
            _ => {
                receive(&mut begun.events, "event", None, None).await;
            }
        }
    };
    let (waiting, running) = (index, 1 - index);
    fx.service.cancel_session(&ids[waiting]).await.unwrap();
    receive(&mut begun.events, "result", Some(&parent), None).await;
    fx.provider.gate(&format!("slot-{running}")).set();
    fx.wait_idle().await;
    let history = fx.history(&parent);
    // The call had answered `pending` at once: the waiting child is the parent's to hear
    // of, so Stop ends in its one report, "stopped", and nothing more (SPEC §3, issue 25).
    let answered = history
        .iter()
        .find(|m| m.tool_call_id.as_deref() == Some(format!("delegate-{waiting}").as_str()))
        .unwrap();
    assert!(
        answered.text().contains("\"pending\""),
        "{}",
        answered.text()
    );
    let reports: Vec<&Message> = history.iter().filter(|m| is_report(m)).collect();
    assert_eq!(reports.len(), 2, "{history:#?}");
    let stopped = reports
        .iter()
        .find(|m| m.text().contains(&format!("Task ID: delegate-{waiting}")))
        .unwrap();
    assert!(
        stopped.text().contains("stopped by the user"),
        "{}",
        stopped.text()
    );
    assert!(
        reports
            .iter()
            .any(|m| m.text().contains(&format!("Task ID: delegate-{running}")))
    );
    assert_message_order(&history);
    fx.shutdown().await;
}
