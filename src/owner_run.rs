//! `bumblehive run` beside a running owner (ux review 2, E22): the process that owns the data folder runs the handed-over prompt in its own service, so its window lists the session at once, and streams the run back on the owner's socket; the later process prints it and answers the approvals.
//!
//! Why the owner runs it: one process owns a data folder (SPEC §12.7), so a second
//! process cannot run sessions there itself, and refusing `run` while the app is open
//! (as before) is not what a person expects of a CLI beside their editor's agent. The
//! run is the owner's like any other session's: it survives the later process only as
//! far as a Stop does (the connection closing stops it, as Ctrl+C stops a local run).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::controller::Received;
use crate::owner::{RunConnection, RunHandler};
use crate::protocol::{Event, OwnerRun, OwnerRunLine, SessionState, commands::DecideApproval};
use crate::service::RuntimeService;

/// The handler an owner passes to [`crate::owner::listen_with_runs`].
pub fn handler(service: RuntimeService) -> RunHandler {
    Arc::new(move |run, connection| Box::pin(serve(service.clone(), run, connection)))
}

async fn send(
    writer: &mut tokio::net::unix::OwnedWriteHalf,
    line: &OwnerRunLine,
) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec(line).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    writer.write_all(&bytes).await
}

/// Whether the session or anything below it still works: a run, or a sub-agent task
/// (waiting for a slot, running, reporting). Its reports wake it, so once nothing works
/// the run as `bumblehive run` means it is over.
fn tree_working(service: &RuntimeService, root: &str) -> bool {
    let mut stack = vec![root.to_string()];
    while let Some(id) = stack.pop() {
        if service
            .session_info(&id)
            .is_ok_and(|info| info.state == SessionState::Running)
            || !service.subagents().snapshot(&id).is_empty()
        {
            return true;
        }
        if let Ok(children) = service.store().children(&id) {
            stack.extend(children.into_iter().map(|meta| meta.session_id));
        }
    }
    false
}

async fn serve(service: RuntimeService, run: OwnerRun, connection: RunConnection) {
    let RunConnection { reader, mut writer } = connection;
    // Subscribed before the prompt goes in (no event of the run is missed), and the
    // prompt taken before the later process hears it started: a refusal is its first line.
    let started = crate::workspace::check_workspace(Path::new(&run.workspace)).and_then(|ws| {
        let info = service.create_session(&ws.display().to_string(), Some(run.title.clone()))?;
        let controller = service.controller(&info.session_id)?;
        let subscription = controller.subscribe();
        controller.submit(run.prompt, None)?;
        Ok((info.session_id, controller, subscription))
    });
    let (root, controller, (mut events, _)) = match started {
        Ok(started) => started,
        Err(err) => {
            let message = err.to_string();
            let _ = send(&mut writer, &OwnerRunLine::Refused { message }).await;
            return;
        }
    };
    let started = OwnerRunLine::Started {
        session_id: root.clone(),
    };
    if send(&mut writer, &started).await.is_err() {
        // Gone before it heard the start: its run stops, as after a Ctrl+C.
        let _ = service.cancel_session(&root).await;
        return;
    }
    let mut runs = service.shared().watch_runs();
    let mut tasks = service.subagents().watch_len();
    let mut decisions = reader.lines();
    let mut asked: HashSet<String> = HashSet::new();
    let mut failed = false;
    let mut gone = false;
    // Whether this event changes how the run ends, and whether it is an approval the
    // later process was already sent.
    let mut note = |event: &Event| match event {
        Event::Error { session_id, .. } if *session_id == root => {
            failed = true;
            true
        }
        Event::Result { session_id, .. } if *session_id == root => {
            failed = false;
            true
        }
        Event::ApprovalRequest(ask) => asked.insert(ask.approval_id.clone()),
        _ => true,
    };
    loop {
        tokio::select! {
            received = events.recv() => {
                let event = match received {
                    None => break,
                    Some(Received::Event(event)) => event,
                    // Fell behind: approval requests may be among what was missed, and
                    // nothing would answer them; the snapshot has every open one.
                    Some(Received::Lagged(_)) => {
                        for ask in controller.snapshot().approvals {
                            let event = Event::ApprovalRequest(ask);
                            if note(&event) && send(&mut writer, &OwnerRunLine::Event { event: Box::new(event) }).await.is_err() {
                                gone = true;
                            }
                        }
                        if gone { break }
                        continue;
                    }
                };
                if note(&event) && send(&mut writer, &OwnerRunLine::Event { event: Box::new(event) }).await.is_err() {
                    gone = true;
                    break;
                }
            }
            _ = runs.changed() => {}
            _ = tasks.changed() => {}
            line = decisions.next_line() => match line {
                Ok(Some(line)) => match serde_json::from_str::<DecideApproval>(&line) {
                    Ok(decision) => {
                        if let Err(err) = service.decide_approval(decision) {
                            tracing::warn!("a handed-over run's approval: {err}");
                        }
                    }
                    Err(err) => tracing::warn!("a handed-over run sent what is not a decision: {err}"),
                },
                // The later process ended (Ctrl+C, a closed terminal): its run stops.
                Ok(None) | Err(_) => {
                    gone = true;
                    break;
                }
            },
        }
        if !tree_working(&service, &root) {
            break;
        }
    }
    if gone {
        tracing::info!(session = %root, "the later `bumblehive run` went away: its run stops");
        if let Err(err) = service.cancel_session(&root).await {
            tracing::warn!("stopping a handed-over run: {err}");
        }
        return;
    }
    // A run's last events are sent under its controller's lock just after it stops
    // counting (as `RuntimeService::wait_idle` knows): taking the lock once means they
    // are all in the subscription; send what is there, then the end.
    let _ = controller.state();
    loop {
        tokio::select! {
            biased;
            received = events.recv() => match received {
                Some(Received::Event(event)) => {
                    if note(&event) && send(&mut writer, &OwnerRunLine::Event { event: Box::new(event) }).await.is_err() {
                        return;
                    }
                }
                Some(Received::Lagged(_)) => {}
                None => break,
            },
            () = std::future::ready(()) => break,
        }
    }
    let failed = failed || controller.is_paused();
    let _ = send(&mut writer, &OwnerRunLine::End { failed }).await;
}
