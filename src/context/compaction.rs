//! Compaction of a history that outgrows the model's window: when to compact and what stays verbatim ([`plan`]), the handoff summary ([`handoff_prompt`], [`summarize`]), the stored marker ([`Compaction`]), the request rebuilt from history + marker ([`build_messages`]), and the fallback that drops the oldest turns when no summary can be made ([`compact`]).
//!
//! The stored history is never rewritten: a compaction is a marker kept beside it, and
//! [`build_messages`] turns the same history and marker into the same request after a
//! reload. Every request it builds keeps SPEC §2's shape: one system message, the
//! session's first user message right after it, and no cut between an assistant's tool
//! calls and their results.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::window::{message_tokens, serialized_len};
use crate::config::ContextConfig;
pub use crate::protocol::{Compaction, CompactionKind};
use crate::protocol::{Message, Role};
use crate::provider::{
    ModelProvider, ModelRequest, ModelSettings, ProviderError, ProviderSink, RequestMessages,
};

/// The first line of the message that stands for the summarised part of a conversation
/// (the UI shows it as the divider "Earlier conversation summarised").
pub const SUMMARY_HEADER: &str = "[Earlier conversation summarised]";

/// The message id of the summary message: `compaction:<marker id>`.
pub const SUMMARY_ID_PREFIX: &str = "compaction:";

/// How a report starts (SPEC §3): reports are background results, not the person's words.
const REPORT_PREFIX: &str = "[Background tool result]";

/// The knobs of compaction, as fractions of the window.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Compact when the request reaches this share of the window (config `context.compact_at`).
    pub compact_at: f64,
    /// The most recent turns kept verbatim, all roles (a share of the window).
    pub keep_recent: f64,
    /// Earlier messages of the person kept verbatim next to the summary (a share of the window).
    pub keep_user: f64,
    /// The most the summary may take (a share of the window); longer summaries are cut.
    pub summary: f64,
    /// A tool result above this share of the window is "oversized": old ones are sent as
    /// a short stub before anything is summarised.
    pub oversized_tool_result: f64,
    /// The request size to aim for after an elision-only compaction (a share of the window).
    pub target: f64,
    /// Tokens the answer may take (the provider's `max_tokens`): servers that count the
    /// answer against the window reject a request above `window - reserve_output`, so
    /// compaction starts there if that comes before `compact_at`. At most half the window
    /// counts, so a `max_tokens` near the window cannot make every call compact.
    pub reserve_output: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            compact_at: ContextConfig::DEFAULT_COMPACT_AT,
            keep_recent: 0.25,
            keep_user: 0.10,
            summary: 0.10,
            oversized_tool_result: 0.05,
            target: 0.60,
            reserve_output: 0,
        }
    }
}

impl Policy {
    /// The defaults with the configured threshold (clamped to at most 0.95, as the config
    /// checks, so a hand-built config cannot make the summary call overflow).
    pub fn from_config(config: &ContextConfig) -> Self {
        Policy {
            compact_at: config.compact_at.clamp(0.05, ContextConfig::MAX_COMPACT_AT),
            ..Policy::default()
        }
    }

    /// The same with the answer's room reserved (`provider.max_tokens`).
    pub fn with_reserve_output(mut self, max_tokens: Option<u32>) -> Self {
        self.reserve_output = max_tokens.map_or(0, |m| m as usize);
        self
    }

    /// The room a request has: the window less the answer's reserve.
    pub fn room(&self, window: usize) -> usize {
        window - self.reserve_output.min(window / 2)
    }

    /// The request size at which compaction starts.
    pub fn threshold(&self, window: usize) -> usize {
        Self::share(window, self.compact_at).min(self.room(window))
    }

    fn share(window: usize, fraction: f64) -> usize {
        (window as f64 * fraction) as usize
    }
}

/// What a compaction will do, decided from the history alone.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Whether a summary is needed (false: eliding old tool results is enough).
    pub summarize: bool,
    /// Messages before the latest marker's `first_kept` are already in its summary; the
    /// summary call covers `from..first_kept` plus that summary.
    pub from: usize,
    pub first_kept: usize,
    pub kept_user: Vec<usize>,
    pub elided: Vec<usize>,
    /// The request size the plan was made for.
    pub tokens_before: usize,
    /// The estimated size of the request without the summary.
    pub tokens_after: usize,
    /// The tokens the summary may take.
    pub summary_budget: usize,
}

/// A sub-agent that is still working: the summary must say what it was asked, since its
/// report will arrive after the conversation that started it is summarised.
#[derive(Debug, Clone, PartialEq)]
pub struct RunningChild {
    pub task_id: String,
    pub title: String,
    pub task: String,
}

/// The sub-agents a history started whose report has not arrived yet, read from the
/// history alone: each `sub_agent` call's pending result names its task id (SPEC §3), and
/// a report carries the id `subagent:<task_id>`. The run loop may pass the task
/// registry's list instead; this one also works for a history loaded from disk.
pub fn running_children(history: &[Message]) -> Vec<RunningChild> {
    let reports: Vec<&str> = history
        .iter()
        .filter(|m| m.role == Role::User)
        .filter_map(|m| m.id.as_deref())
        .collect();
    let mut children = Vec::new();
    for (index, message) in history.iter().enumerate() {
        for (position, call) in message.tool_calls.iter().enumerate() {
            if call.name != "sub_agent" {
                continue;
            }
            // The pending result names the task id (a fresh one when the call id was
            // reused, as some servers do): the n-th call with an id has the n-th result.
            let nth = message.tool_calls[..position]
                .iter()
                .filter(|c| c.id == call.id)
                .count();
            let task_id = history[index + 1..]
                .iter()
                .take_while(|m| m.role == Role::Tool)
                .filter(|m| m.tool_call_id.as_deref() == Some(call.id.as_str()))
                .nth(nth)
                .and_then(|m| serde_json::from_str::<serde_json::Value>(m.text()).ok())
                .and_then(|v| v.get("task_id")?.as_str().map(str::to_string))
                .unwrap_or_else(|| call.id.clone());
            if reports
                .iter()
                .any(|id| crate::protocol::is_report_of(id, &task_id))
            {
                continue;
            }
            let field = |name: &str| {
                call.arguments
                    .get(name)
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_string()
            };
            children.push(RunningChild {
                task_id,
                title: field("title"),
                task: field("task"),
            });
        }
    }
    children
}

/// Failures of the summary call; none of them touches the history.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CompactionError {
    #[error("the summary call failed: {0}")]
    Provider(#[from] ProviderError),
    #[error("the model answered the summary request without any text")]
    EmptySummary,
}

fn is_person(message: &Message) -> bool {
    message.is_from_person() && !message.text().starts_with(REPORT_PREFIX)
}

/// A request may resume at any message but a tool result: cutting before an assistant
/// message keeps its whole batch, and the summary message in front keeps a user message
/// right after the system one.
fn is_cut_point(message: &Message) -> bool {
    matches!(message.role, Role::User | Role::Assistant)
}

fn first_cut_at_or_after(history: &[Message], index: usize) -> usize {
    (index.min(history.len())..history.len())
        .find(|&i| is_cut_point(&history[i]))
        .unwrap_or(history.len())
}

/// The stub that stands for an elided tool result; it says how much was left out so the
/// model can ask again for what it needs.
pub fn elided_text(original: &Message) -> String {
    format!(
        "[Output elided to save context: {} bytes. Call the tool again if you need it.]",
        original.text().len()
    )
}

fn summary_message(marker: &Compaction) -> Message {
    let body = match (marker.kind, marker.summary.as_deref()) {
        (CompactionKind::Dropped, summary) => {
            let mut text = String::from(
                "The earliest part of this conversation was dropped to fit the model's context window; no summary of it could be made.",
            );
            if let Some(summary) = summary {
                text.push_str("\nA summary of what came before that:\n\n");
                text.push_str(summary);
            }
            text
        }
        (_, Some(summary)) => format!(
            "The earlier part of this conversation was replaced by this summary to fit the model's context window (the person's own messages above are kept word for word):\n\n{summary}"
        ),
        (_, None) => String::from(
            "The earlier part of this conversation was left out to fit the model's context window.",
        ),
    };
    Message::user(
        format!("{SUMMARY_ID_PREFIX}{}", marker.id),
        format!("{SUMMARY_HEADER}\n{body}"),
    )
}

/// The request's messages for this history: `system`, then the history as it is, or,
/// after a compaction, the kept messages of the person, the summary and the history from
/// `first_kept` on with elided tool results as stubs. The same history and marker always
/// give the same messages. A marker that does not fit the history (an index past its end,
/// a cut inside a tool batch) is read in the safe direction: a cut moves forward to the
/// next message a request may start at, and indices that name no such message are skipped.
pub fn build_messages(
    system: Message,
    history: &Arc<Vec<Message>>,
    marker: Option<&Compaction>,
) -> RequestMessages {
    let Some(marker) = marker else {
        return RequestMessages::new(vec![system], history.clone(), 0, Vec::new());
    };
    let first_kept = first_cut_at_or_after(history, marker.first_kept);
    let mut head = Vec::with_capacity(marker.kept_user.len() + 2);
    head.push(system);
    if first_kept > 0 {
        let mut last = None;
        for &index in &marker.kept_user {
            // Ascending and unique, so a hand-edited marker cannot reorder or repeat.
            if index < first_kept
                && last.is_none_or(|l| index > l)
                && history[index].role == Role::User
            {
                head.push(history[index].clone());
                last = Some(index);
            }
        }
        head.push(summary_message(marker));
    }
    let stubs = history[first_kept..]
        .iter()
        .enumerate()
        .map(|(offset, message)| (first_kept + offset, message))
        .filter(|(index, message)| {
            message.role == Role::Tool && marker.elided.binary_search(index).is_ok()
        })
        .map(|(index, message)| {
            let mut stub = message.clone();
            stub.content = Some(elided_text(message));
            stub.images.clear();
            (index, stub)
        })
        .collect();
    RequestMessages::new(head, history.clone(), first_kept, stubs)
}

/// Decides whether to compact before a model call and what the result keeps.
///
/// `used` is the size of the request about to be sent (reported or estimated, see
/// [`super::window::used_tokens`]); `force` compacts below the threshold too (the
/// `compact` command, and a provider's "context too long"). Returns `None` when the
/// request is below the threshold, or when nothing could be made smaller.
///
/// Order of measures: oversized old tool results are elided first; if that is not enough
/// (or `force`), everything before a recent tail (`keep_recent` of the window, whole steps)
/// is summarised, with the session's first user message and the most recent other
/// messages of the person (`keep_user` of the window) kept verbatim.
pub fn plan(
    history: &[Message],
    previous: Option<&Compaction>,
    window: usize,
    used: usize,
    policy: &Policy,
    force: bool,
) -> Option<Plan> {
    let window = window.max(1);
    if !force && used < policy.threshold(window) {
        return None;
    }
    // Threshold apart, every budget below is a share of the room the input has, so what
    // remains after a compaction is well under the threshold even with a large reserve.
    let threshold = policy.threshold(window);
    let window = policy.room(window);
    let from = previous
        .map(|p| first_cut_at_or_after(history, p.first_kept))
        .unwrap_or(0);
    let tokens: Vec<usize> = history[from..].iter().map(message_tokens).collect();
    let tok = |i: usize| tokens[i - from];
    let mut elided: BTreeSet<usize> = previous
        .map(|p| p.elided.iter().copied().filter(|&i| i >= from).collect())
        .unwrap_or_default();
    let stub_tokens = |i: usize| (elided_text(&history[i]).len() + 64).div_ceil(4);
    let view_tokens = |elided: &BTreeSet<usize>, first_kept: usize| -> usize {
        (first_kept..history.len())
            .map(|i| {
                if elided.contains(&i) {
                    stub_tokens(i)
                } else {
                    tok(i)
                }
            })
            .sum()
    };
    // What the request holds besides this part of the history: the system prompt, the
    // tools, the earlier summary, and the estimate's error against a reported count.
    let overhead = used.saturating_sub(view_tokens(&elided, from));

    // The last batch is what the model answers next: it is elided only as a last resort.
    let last_step = (from..history.len())
        .rev()
        .find(|&i| history[i].role == Role::Assistant)
        .unwrap_or(from);
    let oversized = Policy::share(window, policy.oversized_tool_result).max(64);
    let old_oversized: Vec<usize> = (from..last_step)
        .filter(|&i| history[i].role == Role::Tool && tok(i) > oversized && !elided.contains(&i))
        .collect();

    // 1. Eliding oversized old tool results may be enough.
    if !force {
        let target = Policy::share(window, policy.target).min(threshold);
        let mut trial = elided.clone();
        let mut size = overhead + view_tokens(&trial, from);
        for &i in &old_oversized {
            if size <= target {
                break;
            }
            trial.insert(i);
            size = size - tok(i) + stub_tokens(i);
        }
        if size <= target && trial.len() > elided.len() {
            return Some(Plan {
                summarize: false,
                from,
                first_kept: previous.map_or(0, |p| p.first_kept),
                kept_user: previous.map(|p| p.kept_user.clone()).unwrap_or_default(),
                elided: trial.into_iter().collect(),
                tokens_before: used,
                tokens_after: size,
                summary_budget: 0,
            });
        }
    }

    // 2. Summarise everything before a recent tail of whole steps.
    elided.extend(old_oversized.iter().copied());
    let keep_recent = Policy::share(window, policy.keep_recent);
    let mut first_kept = history.len();
    let mut tail = 0;
    for i in (from..history.len()).rev() {
        tail += if elided.contains(&i) {
            stub_tokens(i)
        } else {
            tok(i)
        };
        if tail > keep_recent {
            break;
        }
        if is_cut_point(&history[i]) {
            first_kept = i;
        }
    }
    // One step larger than the tail budget: keep that step whole rather than nothing.
    if first_kept >= history.len() || first_kept <= from {
        first_kept = (from + 1..history.len())
            .rev()
            .find(|&i| is_cut_point(&history[i]) && i <= last_step)
            .unwrap_or(first_kept);
    }
    let summary_budget = Policy::share(window, policy.summary).max(64);
    let fits = overhead + summary_budget + Policy::share(window, policy.keep_user);
    // A last batch that alone would overflow the window is elided too, so the run can go on
    // (the stub tells the model how large the output was).
    let mut tail_size = view_tokens(&elided, first_kept.min(history.len()));
    for (i, message) in history.iter().enumerate().skip(last_step) {
        if tail_size + fits <= window {
            break;
        }
        if message.role == Role::Tool && tok(i) > oversized && !elided.contains(&i) {
            elided.insert(i);
            tail_size = tail_size - tok(i) + stub_tokens(i);
        }
    }
    if first_kept <= from || first_kept > history.len() {
        // Nothing new can be summarised; eliding is all there is.
        let before: BTreeSet<usize> = previous
            .map(|p| p.elided.iter().copied().collect())
            .unwrap_or_default();
        if elided == before {
            return None;
        }
        let first_kept = previous.map_or(0, |p| p.first_kept);
        return Some(Plan {
            summarize: false,
            from,
            first_kept,
            kept_user: previous.map(|p| p.kept_user.clone()).unwrap_or_default(),
            tokens_after: overhead + view_tokens(&elided, from),
            elided: elided.into_iter().collect(),
            tokens_before: used,
            summary_budget: 0,
        });
    }
    let elided: Vec<usize> = elided.into_iter().filter(|&i| i >= first_kept).collect();

    // The person's messages: the session's first (the goal) always, then the most recent.
    let keep_user = Policy::share(window, policy.keep_user);
    let people: Vec<usize> = (0..first_kept)
        .filter(|&i| is_person(&history[i]))
        .collect();
    let mut kept_user = Vec::new();
    if let Some(&first) = history[..first_kept]
        .iter()
        .position(|m| m.role == Role::User)
        .as_ref()
    {
        kept_user.push(first);
    }
    let mut budget =
        keep_user.saturating_sub(kept_user.iter().map(|&i| message_tokens(&history[i])).sum());
    for &i in people.iter().rev() {
        if kept_user.contains(&i) {
            continue;
        }
        let size = message_tokens(&history[i]);
        if size > budget {
            // Verbatim or not at all: the summary covers the rest.
            continue;
        }
        budget -= size;
        kept_user.push(i);
    }
    kept_user.sort_unstable();
    let kept_tokens: usize = kept_user.iter().map(|&i| message_tokens(&history[i])).sum();
    let tail_tokens: usize = (first_kept..history.len())
        .map(|i| {
            if elided.binary_search(&i).is_ok() {
                stub_tokens(i)
            } else {
                message_tokens(&history[i])
            }
        })
        .sum();
    // The earlier summary is part of `overhead` now and is folded into the new summary.
    let previous_summary = previous
        .and_then(|p| p.summary.as_deref())
        .map_or(0, |s| s.len().div_ceil(4));
    Some(Plan {
        summarize: true,
        from,
        first_kept,
        kept_user,
        elided,
        tokens_before: used,
        tokens_after: overhead.saturating_sub(previous_summary) + kept_tokens + tail_tokens,
        summary_budget,
    })
}

/// Tool calls' `path` arguments, split into files changed and files only looked at, so
/// the summary names them even if the model forgets to.
fn files_touched(messages: &[Message]) -> (Vec<String>, Vec<String>) {
    let mut changed = BTreeSet::new();
    let mut read = BTreeSet::new();
    for call in messages.iter().flat_map(|m| m.tool_calls.iter()) {
        let Some(path) = call.arguments.get("path").and_then(|p| p.as_str()) else {
            continue;
        };
        if matches!(call.name.as_str(), "write_file" | "edit_file") {
            changed.insert(path.to_string());
        } else {
            read.insert(path.to_string());
        }
    }
    read.retain(|p| !changed.contains(p));
    (changed.into_iter().collect(), read.into_iter().collect())
}

/// The longest a single tool result runs in the summary's transcript.
const TRANSCRIPT_TOOL_RESULT: usize = 1500;

fn cut(text: &str, max: usize) -> String {
    let head = crate::text::head(text, max);
    if head.len() == text.len() {
        return text.to_string();
    }
    format!("{head}… [{} bytes more]", text.len() - head.len())
}

fn transcript_entry(message: &Message) -> String {
    match message.role {
        Role::User if message.text().starts_with(REPORT_PREFIX) => {
            format!(
                "## Background result (a sub-agent's report, not the person)\n{}",
                message.text()
            )
        }
        Role::User => format!("## Person\n{}", message.text()),
        Role::Assistant => {
            let mut text = format!("## Agent\n{}", message.text());
            for call in &message.tool_calls {
                text.push_str(&format!(
                    "\n[calls {} {}]",
                    call.name,
                    cut(&call.arguments.to_string(), 400)
                ));
            }
            text
        }
        Role::Tool => format!(
            "## Tool result\n{}",
            cut(message.text(), TRANSCRIPT_TOOL_RESULT)
        ),
        Role::System => String::new(),
    }
}

/// The instructions of the summary call.
pub const HANDOFF_SYSTEM: &str = "You write handoff notes. The conversation below, between a person and Bumblehive (a coding agent working in the person's workspace), has outgrown the model's context window. Your note replaces it: the agent will continue the work from your note and the most recent messages only. Write plain Markdown with these sections:\n## Goal\nWhat the person wants overall, and any constraints they set.\n## Decisions and progress\nWhat was decided and done, in order, with the reasons that still matter.\n## Files touched\nFiles created, changed or examined, and what was done to each.\n## Open questions and next steps\nWhat is unresolved or still to do, and what the agent was about to do next.\n## Sub-agents still running\nFor each: its title, its task id and what it was asked. Their reports arrive later as user messages starting with \"[Background tool result]\".\nBe specific (names, paths, numbers, error messages); leave out pleasantries and anything settled that no longer matters. Do not call tools. Do not continue the conversation: write only the note.";

/// The summary request: the handoff instructions, the earlier summary, the conversation
/// `history[plan.from..plan.first_kept]` as a transcript, the files its tool calls named,
/// and what each running child was asked. It is fitted into `input_budget` tokens: tool
/// results are shortened, and when that is not enough the oldest messages are left out
/// (said in the transcript), so the summary call itself fits the window.
pub fn handoff_prompt(
    history: &[Message],
    previous: Option<&Compaction>,
    plan: &Plan,
    children: &[RunningChild],
    input_budget: usize,
) -> Vec<Message> {
    let range = &history[plan.from.min(plan.first_kept)..plan.first_kept.min(history.len())];
    let mut head = String::new();
    if let Some(summary) = previous.and_then(|p| p.summary.as_deref()) {
        head.push_str("# Summary of the conversation before this part\n");
        head.push_str(summary);
        head.push_str("\n\n");
    }
    let mut tail = String::new();
    let (changed, read) = files_touched(range);
    if !changed.is_empty() {
        tail.push_str(&format!(
            "\n# Files the agent changed (from its tool calls)\n{}\n",
            changed.join("\n")
        ));
    }
    if !read.is_empty() {
        tail.push_str(&format!(
            "\n# Files the agent looked at\n{}\n",
            read.join("\n")
        ));
    }
    if !children.is_empty() {
        tail.push_str("\n# Sub-agents still running\n");
        for child in children {
            tail.push_str(&format!(
                "- \"{}\" (task id {}): {}\n",
                child.title,
                child.task_id,
                cut(&child.task, 2000)
            ));
        }
    }
    tail.push_str("\nWrite the handoff note now.");
    // Sizes as JSON strings (escapes included): that is what the request estimate counts.
    let fixed =
        (serialized_len(HANDOFF_SYSTEM) + serialized_len(&head) + serialized_len(&tail) + 200)
            .div_ceil(4);
    let room = input_budget.saturating_sub(fixed).saturating_mul(4);
    // Newest first, until the room is used: the oldest messages are the ones left out.
    let mut entries: Vec<String> = Vec::new();
    let mut size = 0;
    for message in range.iter().rev() {
        let entry = transcript_entry(message);
        if entry.is_empty() {
            continue;
        }
        let entry_size = serialized_len(&entry) + 2;
        if size + entry_size > room {
            break;
        }
        size += entry_size;
        entries.push(entry);
    }
    let left_out = range.iter().filter(|m| m.role != Role::System).count() - entries.len();
    entries.reverse();
    let mut body = head;
    body.push_str("# The conversation to summarise\n");
    if left_out > 0 {
        body.push_str(&format!(
            "[{left_out} earlier messages are left out here to fit the window]\n\n"
        ));
    }
    body.push_str(&entries.join("\n\n"));
    body.push('\n');
    body.push_str(&tail);
    vec![
        Message::system(HANDOFF_SYSTEM),
        Message::user("compaction-request", body),
    ]
}

/// Asks the model for the summary (no tools offered, nothing streamed to the chat: the
/// sink sees the deltas and retries, the caller decides what to show). The history is
/// not touched whatever happens; cancel by dropping the future.
pub async fn summarize(
    provider: &dyn ModelProvider,
    settings: &ModelSettings,
    messages: Vec<Message>,
    max_tokens: usize,
    sink: ProviderSink<'_>,
) -> Result<String, CompactionError> {
    let mut settings = settings.clone();
    let cap = u32::try_from(max_tokens).unwrap_or(u32::MAX);
    settings.max_tokens = Some(settings.max_tokens.map_or(cap, |m| m.min(cap)));
    let response = provider
        .generate(
            ModelRequest {
                messages: messages.into(),
                tools: Vec::new().into(),
                settings,
            },
            sink,
        )
        .await?;
    let text = response.content.unwrap_or_default();
    let text = text.trim();
    if text.is_empty() {
        return Err(CompactionError::EmptySummary);
    }
    Ok(text.to_string())
}

/// The result of [`compact`]: always a marker; `error` says why it is not a summary.
#[derive(Debug, Clone)]
pub struct Compacted {
    pub marker: Compaction,
    pub error: Option<CompactionError>,
}

/// One compaction: a summary call for a plan that needs one, and the marker to store.
/// When the summary call fails (or the model answers with nothing) the marker drops the
/// oldest turns instead, keeping the person's messages and any earlier summary, so the
/// next request fits either way. It makes at most one model call and never calls itself:
/// the caller compacts at most once per model call.
#[allow(clippy::too_many_arguments)]
pub async fn compact(
    provider: &dyn ModelProvider,
    settings: &ModelSettings,
    history: &[Message],
    previous: Option<&Compaction>,
    plan: Plan,
    children: &[RunningChild],
    window: usize,
    sink: ProviderSink<'_>,
) -> Compacted {
    let id = uuid::Uuid::now_v7().to_string();
    let mut marker = Compaction {
        id,
        kind: CompactionKind::Elided,
        at: history.len(),
        first_kept: plan.first_kept,
        kept_user: plan.kept_user.clone(),
        elided: plan.elided.clone(),
        summary: previous.and_then(|p| p.summary.clone()),
        tokens_before: plan.tokens_before,
        tokens_after: plan.tokens_after,
        note: None,
    };
    if !plan.summarize {
        return Compacted {
            marker,
            error: None,
        };
    }
    // The summary call gets the window minus room for its answer and a margin for the
    // estimate's error (bytes/4 undercounts some text).
    let input_budget = window.saturating_sub(plan.summary_budget).saturating_mul(3) / 4;
    let request = handoff_prompt(history, previous, &plan, children, input_budget);
    match summarize(provider, settings, request, plan.summary_budget, sink).await {
        Ok(summary) => {
            let summary = cut(&summary, plan.summary_budget.saturating_mul(4));
            marker.tokens_after = plan.tokens_after + (summary.len() + 400).div_ceil(4);
            marker.kind = CompactionKind::Summary;
            marker.summary = Some(summary);
            Compacted {
                marker,
                error: None,
            }
        }
        Err(error) => {
            tracing::warn!("compaction falls back to dropping the oldest turns: {error}");
            marker.kind = CompactionKind::Dropped;
            marker.note = Some(error.to_string());
            marker.tokens_after = plan.tokens_after + 100;
            Compacted {
                marker,
                error: Some(error),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariant::check_message_order;
    use crate::protocol::ToolCall;

    fn call(id: &str, path: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "read_file".into(),
            arguments: serde_json::json!({ "path": path }),
        }
    }

    /// `turns` turns: a question, one tool call with a result of `result_bytes`, an answer.
    fn history(turns: usize, result_bytes: usize) -> Vec<Message> {
        let mut history = Vec::new();
        for t in 0..turns {
            history.push(Message::user(format!("u{t}"), format!("question {t}")));
            history.push(Message::assistant(
                None,
                vec![call(&format!("c{t}"), "a.txt")],
            ));
            history.push(Message::tool(format!("c{t}"), "x".repeat(result_bytes)));
            history.push(Message::assistant(Some(format!("answer {t}")), vec![]));
        }
        history
    }

    fn request_tokens(history: &[Message], marker: Option<&Compaction>) -> usize {
        super::super::window::estimate_tokens(
            &build_messages(Message::system("s"), &Arc::new(history.to_vec()), marker).to_vec(),
            &[],
        )
    }

    fn marker_from(plan: &Plan, history: &[Message], summary: Option<&str>) -> Compaction {
        Compaction {
            id: "m".into(),
            kind: if plan.summarize {
                CompactionKind::Summary
            } else {
                CompactionKind::Elided
            },
            at: history.len(),
            first_kept: plan.first_kept,
            kept_user: plan.kept_user.clone(),
            elided: plan.elided.clone(),
            summary: summary.map(str::to_string),
            tokens_before: plan.tokens_before,
            tokens_after: plan.tokens_after,
            note: None,
        }
    }

    #[test]
    fn below_the_threshold_nothing_happens() {
        let history = history(3, 10);
        let used = request_tokens(&history, None);
        assert_eq!(
            plan(&history, None, used * 2, used, &Policy::default(), false),
            None
        );
        assert!(plan(&history, None, used * 2, used, &Policy::default(), true).is_some());
    }

    #[test]
    fn the_answers_room_moves_the_threshold_but_never_below_half_the_window() {
        let policy = Policy::default();
        assert_eq!(policy.threshold(10_000), 8_500);
        assert_eq!(
            policy
                .clone()
                .with_reserve_output(Some(4_000))
                .threshold(10_000),
            6_000
        );
        assert_eq!(
            policy
                .clone()
                .with_reserve_output(Some(9_000))
                .threshold(10_000),
            5_000
        );
        assert_eq!(policy.with_reserve_output(None).threshold(10_000), 8_500);
        let clamped = Policy::from_config(&ContextConfig { compact_at: 3.0 });
        assert_eq!(clamped.threshold(1_000), 950);
    }

    #[test]
    fn oversized_old_tool_results_are_elided_before_anything_is_summarised() {
        let mut history = history(6, 20);
        history[2] = Message::tool("c0", "y".repeat(6000));
        let used = request_tokens(&history, None);
        let window = used * 100 / 90;
        let plan = plan(&history, None, window, used, &Policy::default(), false).unwrap();
        assert!(!plan.summarize, "{plan:?}");
        assert_eq!(plan.elided, vec![2]);
        let marker = marker_from(&plan, &history, None);
        let messages = build_messages(
            Message::system("s"),
            &Arc::new(history.clone()),
            Some(&marker),
        )
        .to_vec();
        assert_eq!(messages.len(), history.len() + 1);
        assert!(
            messages[3]
                .text()
                .starts_with("[Output elided to save context: 6000 bytes.")
        );
        assert!(request_tokens(&history, Some(&marker)) < window / 2);
    }

    #[test]
    fn summary_plan_keeps_the_first_user_message_and_cuts_only_between_steps() {
        let history = history(40, 200);
        let used = request_tokens(&history, None);
        let window = used;
        let plan = plan(&history, None, window, used, &Policy::default(), false).unwrap();
        assert!(plan.summarize);
        assert_eq!(plan.kept_user.first(), Some(&0));
        assert!(is_cut_point(&history[plan.first_kept]));
        let marker = marker_from(&plan, &history, Some("the summary"));
        let messages = build_messages(
            Message::system("s"),
            &Arc::new(history.clone()),
            Some(&marker),
        )
        .to_vec();
        assert_eq!(
            messages[1], history[0],
            "the seed reads the first user message at index 1"
        );
        assert_eq!(check_message_order(&messages), Ok(()));
        assert!(
            messages
                .iter()
                .any(|m| m.text().starts_with(SUMMARY_HEADER))
        );
        assert_eq!(messages.last(), history.last());
        assert!(request_tokens(&history, Some(&marker)) < window * 6 / 10);
    }

    #[test]
    fn a_marker_that_does_not_fit_the_history_is_read_safely() {
        let history = history(4, 10);
        let bad = Compaction {
            id: "x".into(),
            kind: CompactionKind::Summary,
            at: 99,
            first_kept: 2, // a tool result: the cut moves forward to the next step
            kept_user: vec![7, 0, 0, 500],
            elided: vec![1, 400],
            summary: Some("s".into()),
            tokens_before: 0,
            tokens_after: 0,
            note: None,
        };
        let messages =
            build_messages(Message::system("s"), &Arc::new(history.clone()), Some(&bad)).to_vec();
        assert_eq!(check_message_order(&messages), Ok(()));
        assert_eq!(messages[1], history[0]);
        assert_eq!(messages[2].id.as_deref(), Some("compaction:x"));
        assert_eq!(messages[3], history[3]);
        let past_end = Compaction {
            first_kept: 1000,
            ..bad
        };
        let messages = build_messages(
            Message::system("s"),
            &Arc::new(history.clone()),
            Some(&past_end),
        )
        .to_vec();
        assert_eq!(messages.len(), 3);
        assert_eq!(check_message_order(&messages), Ok(()));
    }

    #[test]
    fn a_step_larger_than_the_window_is_kept_whole_with_its_result_elided() {
        let mut history = history(3, 10);
        history.push(Message::user("big", "read the log"));
        history.push(Message::assistant(None, vec![call("huge", "log.txt")]));
        history.push(Message::tool("huge", "z".repeat(40_000)));
        let used = request_tokens(&history, None);
        let window = 2000;
        let plan = plan(&history, None, window, used, &Policy::default(), false).unwrap();
        let marker = marker_from(&plan, &history, Some("summary"));
        let messages = build_messages(
            Message::system("s"),
            &Arc::new(history.clone()),
            Some(&marker),
        )
        .to_vec();
        assert_eq!(check_message_order(&messages), Ok(()));
        assert!(request_tokens(&history, Some(&marker)) < window);
        assert!(
            messages
                .last()
                .unwrap()
                .text()
                .starts_with("[Output elided")
        );
    }

    #[test]
    fn reports_are_not_kept_as_the_persons_words_and_handoff_names_children_and_files() {
        let mut history = history(30, 100);
        history.insert(
            8,
            Message::user(
                "subagent:t1",
                "[Background tool result]\nTask ID: t1\n\ndone",
            ),
        );
        history[1].tool_calls[0].name = "write_file".into();
        let used = request_tokens(&history, None);
        let plan = plan(&history, None, used, used, &Policy::default(), true).unwrap();
        assert!(!plan.kept_user.contains(&8));
        let children = vec![RunningChild {
            task_id: "t2".into(),
            title: "Tests".into(),
            task: "run the test suite".into(),
        }];
        let request = handoff_prompt(&history, None, &plan, &children, 100_000);
        assert_eq!(request.len(), 2);
        let body = request[1].text();
        assert!(
            body.contains("\"Tests\" (task id t2): run the test suite"),
            "{body}"
        );
        assert!(
            body.contains("# Files the agent changed (from its tool calls)\na.txt"),
            "{body}"
        );
        assert!(body.contains("Background result (a sub-agent's report, not the person)"));
        // A small budget leaves the oldest messages out, and says so.
        let small = handoff_prompt(&history, None, &plan, &children, 600);
        assert!(small[1].text().contains("earlier messages are left out"));
        assert!(super::super::window::estimate_tokens(&small, &[]) <= 600);
    }

    #[test]
    fn running_children_are_the_delegations_without_a_report() {
        let delegate = |id: &str, title: &str| ToolCall {
            id: id.into(),
            name: "sub_agent".into(),
            arguments: serde_json::json!({"title": title, "task": format!("do {title}")}),
        };
        let history = vec![
            Message::user("1", "go"),
            Message::assistant(
                None,
                vec![delegate("a", "A"), delegate("b", "B"), delegate("a", "A2")],
            ),
            Message::tool("a", r#"{"status": "pending", "task_id": "a"}"#),
            Message::tool("b", r#"{"status": "pending", "task_id": "b"}"#),
            // The reused call id got a fresh task id.
            Message::tool("a", r#"{"status": "pending", "task_id": "a-2"}"#),
            Message::assistant(Some("waiting".into()), vec![]),
            Message::user("subagent:a", "[Background tool result]\nTask ID: a\n\ndone"),
        ];
        let running = running_children(&history);
        let ids: Vec<&str> = running.iter().map(|c| c.task_id.as_str()).collect();
        assert_eq!(ids, ["b", "a-2"]);
        let b = running.iter().find(|c| c.task_id == "b").unwrap();
        assert_eq!((b.title.as_str(), b.task.as_str()), ("B", "do B"));
    }

    #[test]
    fn marker_round_trips_through_json() {
        let history = history(40, 200);
        let used = request_tokens(&history, None);
        let plan = plan(&history, None, used, used, &Policy::default(), false).unwrap();
        let marker = marker_from(&plan, &history, Some("sum"));
        let line = serde_json::to_string(&serde_json::json!({ "compaction": marker })).unwrap();
        let back: serde_json::Value = serde_json::from_str(&line).unwrap();
        let back: Compaction = serde_json::from_value(back["compaction"].clone()).unwrap();
        assert_eq!(back, marker);
    }
}
