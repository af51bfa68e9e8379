//! The message-order checker of SPEC §2, used by tests and by the crash harness on every stored history and model request.

use std::collections::HashSet;

use crate::protocol::{Message, Role};

/// Why a sequence of messages breaks the invariant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrderError {
    #[error("message {index}: an assistant message interrupted a tool result batch")]
    AssistantInBatch { index: usize },
    #[error("message {index}: a user message split an assistant/tool result batch")]
    UserInBatch { index: usize },
    #[error("message {index}: tool result {call_id:?} answers no open call")]
    UnknownResult { index: usize, call_id: String },
    #[error("the history ends with calls left without results: {missing:?}")]
    Unanswered { missing: Vec<String> },
}

/// Checks that after an assistant message with tool calls, exactly the results of those
/// calls follow (any order) before any user or assistant message, and that none is missing.
pub fn check_message_order(messages: &[Message]) -> Result<(), OrderError> {
    let mut waiting: HashSet<&str> = HashSet::new();
    for (index, message) in messages.iter().enumerate() {
        match message.role {
            Role::Assistant => {
                if !waiting.is_empty() {
                    return Err(OrderError::AssistantInBatch { index });
                }
                waiting = message.tool_calls.iter().map(|c| c.id.as_str()).collect();
            }
            Role::Tool => {
                let id = message.tool_call_id.as_deref().unwrap_or("");
                if !waiting.remove(id) {
                    return Err(OrderError::UnknownResult {
                        index,
                        call_id: id.to_string(),
                    });
                }
            }
            Role::User => {
                if !waiting.is_empty() {
                    return Err(OrderError::UserInBatch { index });
                }
            }
            Role::System => {}
        }
    }
    if waiting.is_empty() {
        Ok(())
    } else {
        let mut missing: Vec<String> = waiting.into_iter().map(str::to_string).collect();
        missing.sort();
        Err(OrderError::Unanswered { missing })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ToolCall;

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "read_file".into(),
            arguments: serde_json::json!({}),
        }
    }

    #[test]
    fn accepts_valid_orders_and_rejects_each_kind_of_bad_one() {
        let batch = Message::assistant(None, vec![call("a"), call("b")]);
        let good = vec![
            Message::system("s"),
            Message::user("1", "hi"),
            batch.clone(),
            Message::tool("b", "B"),
            Message::tool("a", "A"),
            Message::user("2", "report"),
            Message::assistant(Some("done".into()), vec![]),
        ];
        assert_eq!(check_message_order(&good), Ok(()));

        let user_in_batch = vec![
            batch.clone(),
            Message::tool("a", "A"),
            Message::user("2", "x"),
        ];
        assert_eq!(
            check_message_order(&user_in_batch),
            Err(OrderError::UserInBatch { index: 2 })
        );
        let assistant_in_batch = vec![batch.clone(), Message::assistant(Some("x".into()), vec![])];
        assert_eq!(
            check_message_order(&assistant_in_batch),
            Err(OrderError::AssistantInBatch { index: 1 })
        );
        let unknown = vec![batch.clone(), Message::tool("z", "Z")];
        assert!(matches!(
            check_message_order(&unknown),
            Err(OrderError::UnknownResult { .. })
        ));
        let duplicate = vec![
            batch.clone(),
            Message::tool("a", "A"),
            Message::tool("a", "A"),
        ];
        assert!(matches!(
            check_message_order(&duplicate),
            Err(OrderError::UnknownResult { index: 2, .. })
        ));
        let unanswered = vec![batch, Message::tool("a", "A")];
        assert_eq!(
            check_message_order(&unanswered),
            Err(OrderError::Unanswered {
                missing: vec!["b".into()]
            })
        );
        let orphan = vec![Message::user("1", "x"), Message::tool("a", "A")];
        assert!(check_message_order(&orphan).is_err());
    }
}
