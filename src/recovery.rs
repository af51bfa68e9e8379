//! Start-up recovery (durability): repairs what a crash left behind before any controller exists.
//!
//! - a run found "running" gets synthetic results for its unanswered calls and is paused;
//! - a child that was working is marked interrupted (resume or cancel it);
//! - a child that finished but whose report was never recorded gets it recorded;
//! - recorded reports that never reached their parent's history (and were not discarded,
//!   and whose child still exists) go to its pending queue.
//!
//! It runs only in the process that owns the data folder (`owner`), so every session it
//! finds "running" was cut off: no live process runs it.

use std::collections::HashMap;

use crate::controller::interrupted_results;
use crate::error::RuntimeError;
use crate::protocol::{RunConfig, SessionId, SessionState, nth_report_message_id, report_text};
use crate::store::{ReportRecord, SessionMeta, SessionStore};

/// Counts of what start-up recovery repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryStats {
    pub interrupted_runs: usize,
    pub interrupted_children: usize,
    pub recorded_reports: usize,
    pub requeued_reports: usize,
}

/// The final answer, if the history ends with one.
fn final_answer(messages: &[crate::protocol::Message]) -> Option<String> {
    // An undo's note after the answer is the person's doing, not the run's (UX review E7).
    let last = messages.iter().rev().find(|m| !m.is_note())?;
    // A stopped answer (what had streamed when Stop or a quit cut it off) is not an
    // answer: the child did not finish, it was interrupted.
    (last.role == crate::protocol::Role::Assistant && last.tool_calls.is_empty() && !last.stopped)
        .then(|| last.text().to_string())
}

/// The answer of the run a child owes a report for: the history's final answer, if that
/// run began (its first message is in the history). A follow-up that was still waiting
/// for its slot has no answer yet: an older one is never re-sent (runtime review R1b).
fn owed_answer(meta: &SessionMeta, messages: &[crate::protocol::Message]) -> Option<String> {
    if let Some(id) = &meta.run_message {
        if !messages
            .iter()
            .any(|m| m.id.as_deref() == Some(id.as_str()))
        {
            return None;
        }
    }
    final_answer(messages)
}

/// Repairs what a crash left behind (issue: durability). Runs once, at start:
/// - a run found "running" gets synthetic results for its unanswered calls and is paused;
/// - a child that was working is marked interrupted (resume or cancel it);
/// - a child that finished but whose report was never recorded gets it recorded;
/// - recorded reports that never reached their parent's history go to its pending queue.
pub(crate) fn recover(
    store: &SessionStore,
) -> Result<(RecoveryStats, Vec<SessionMeta>), RuntimeError> {
    let mut stats = RecoveryStats::default();
    let mut metas = store.list(None)?;
    for meta in metas
        .iter_mut()
        .filter(|m| m.state == SessionState::Running)
    {
        let loaded = store.load(&meta.session_id)?;
        let results = interrupted_results(&loaded.messages);
        if !results.is_empty() && !loaded.damaged {
            store.append(&meta.session_id, &results)?;
            store.sync(&meta.session_id)?;
        }
        let finished_child = meta.task_id.is_some()
            && !meta.reported
            && owed_answer(meta, &loaded.messages).is_some()
            && results.is_empty();
        if meta.task_id.is_some() && !meta.reported && !finished_child {
            meta.interrupted = true;
            stats.interrupted_children += 1;
        }
        meta.state = SessionState::Paused;
        store.write_meta(meta)?;
        stats.interrupted_runs += 1;
    }
    let mut ledgers: HashMap<SessionId, crate::store::Ledger> = HashMap::new();
    for meta in metas.iter_mut() {
        let (Some(task_id), Some(parent)) = (meta.task_id.clone(), meta.parent_session_id.clone())
        else {
            continue;
        };
        if meta.reported || !store.exists(&parent) {
            continue;
        }
        let ledger = match ledgers.get(&parent) {
            Some(ledger) => ledger,
            None => ledgers
                .entry(parent.clone())
                .or_insert(store.ledger(&parent)?),
        };
        if meta.interrupted {
            // Its run never answered, so every report recorded for it belongs to an earlier
            // run: one recorded just before the crash whose count never reached the meta
            // must not have its number taken again by the report this run still owes (a
            // follow-up that waited for its slot owes number n + 1, not n).
            let recorded = ledger
                .records
                .iter()
                .filter(|r| r.child_session_id == meta.session_id)
                .count() as u32;
            if recorded > meta.reports {
                meta.reports = recorded;
                store.write_meta(meta)?;
            }
            continue;
        }
        // The report this child owes: its first, or a follow-up's.
        let owed = nth_report_message_id(&task_id, meta.reports + 1);
        if !ledger.records.iter().any(|r| r.message_id == owed) {
            let history = store.load(&meta.session_id)?.messages;
            let Some(answer) = owed_answer(meta, &history) else {
                meta.interrupted = true;
                store.write_meta(meta)?;
                stats.interrupted_children += 1;
                continue;
            };
            let record = ReportRecord {
                task_id: task_id.clone(),
                child_session_id: meta.session_id.clone(),
                message_id: owed,
                content: report_text(&task_id, &Ok(answer)),
                config: RunConfig::default(),
            };
            store.record_report(&parent, &record)?;
            ledgers
                .entry(parent.clone())
                .or_default()
                .records
                .push(record);
            stats.recorded_reports += 1;
        }
        meta.reported = true;
        meta.reports += 1;
        meta.run_message = None;
        store.write_meta(meta)?;
    }
    for meta in metas.iter_mut() {
        let id = meta.session_id.clone();
        let ledger = match ledgers.remove(&id) {
            Some(ledger) => ledger,
            None if store.has_ledger(&id) => store.ledger(&id)?,
            None => continue,
        };
        if ledger.undelivered().next().is_none() {
            continue;
        }
        let history_ids: std::collections::HashSet<String> = store
            .load(&id)?
            .messages
            .into_iter()
            .filter_map(|m| m.id)
            .collect();
        let mut pending = store.read_pending(&id).unwrap_or_else(|err| {
            tracing::warn!(session = %id, "pending queue unreadable, starting empty: {err}");
            Vec::new()
        });
        let mut added = false;
        for record in ledger.undelivered() {
            // A deleted child reports nothing (SPEC §3), whatever its ledger line says
            // (runtime review R11).
            if !store.exists(&record.child_session_id) {
                continue;
            }
            if history_ids.contains(&record.message_id)
                || pending.iter().any(|p| p.message_id == record.message_id)
            {
                continue;
            }
            pending.push(crate::protocol::PendingMessage {
                message_id: record.message_id.clone(),
                content: record.content.clone(),
                status: crate::protocol::MessageStatus::Queued,
                config: record.config.clone(),
                images: Vec::new(),
            });
            added = true;
            stats.requeued_reports += 1;
        }
        if added {
            store.write_pending(&id, &pending)?;
            // Queued reports wait for the person after a crash: nothing starts by itself.
            meta.state = SessionState::Paused;
            store.write_meta(meta)?;
        }
    }
    if stats != RecoveryStats::default() {
        tracing::warn!(?stats, "recovered from an unclean stop");
    }
    Ok((stats, metas))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Message, NOTE_ID_PREFIX};

    #[test]
    fn recovery_an_undos_note_after_a_childs_answer_leaves_it_its_answer() {
        let answer = Message::assistant(Some("done".into()), Vec::new());
        let note = Message::user(format!("{NOTE_ID_PREFIX}1"), "Note: the person undid …");
        assert_eq!(
            final_answer(&[answer.clone(), note]).as_deref(),
            Some("done")
        );
        // A person's message after it is a new run's start: no answer yet.
        let person = Message::user("m2", "go on");
        assert_eq!(final_answer(&[answer, person]), None);
    }
}
