//! The one command table of SPEC §9: names, JSON arguments and JSON results, shared by the HTTP server and the desktop shell.

use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::error::RuntimeError;
use crate::protocol::commands::*;
use crate::service::RuntimeService;

/// Every command's name, for transports that list or route them.
pub const COMMANDS: &[&str] = &[
    "create_session",
    "list_sessions",
    "get_session",
    "delete_session",
    "submit",
    "cancel",
    "resume_subagent",
    "steer",
    "discard",
    "decide_approval",
    "snapshot",
    "get_config",
    "update_config",
    "probe_providers",
    "app_info",
    "set_api_key",
];

/// Why a command failed, with the code and HTTP status a transport needs.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("unknown command {0:?}")]
    UnknownCommand(String),
    #[error("bad arguments for {command}: {message}")]
    BadArguments { command: String, message: String },
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

impl CommandError {
    pub fn code(&self) -> &'static str {
        match self {
            CommandError::UnknownCommand(_) => "unknown_command",
            CommandError::BadArguments { .. } => "invalid_argument",
            CommandError::Runtime(err) => err.code(),
        }
    }

    pub fn http_status(&self) -> u16 {
        match self.code() {
            "unknown_command" | "not_found" => 404,
            "invalid_argument" => 400,
            "busy" => 409,
            "unavailable" => 503,
            _ => 500,
        }
    }

    /// `{"error": {"code", "message"}}`.
    pub fn to_json(&self) -> Value {
        json!({"error": {"code": self.code(), "message": self.to_string()}})
    }
}

fn args<T: DeserializeOwned>(command: &str, value: Value) -> Result<T, CommandError> {
    let value = if value.is_null() { json!({}) } else { value };
    serde_json::from_value(value).map_err(|err| CommandError::BadArguments {
        command: command.to_string(),
        message: err.to_string(),
    })
}

fn to_value<T: serde::Serialize>(value: T) -> Result<Value, CommandError> {
    serde_json::to_value(value).map_err(|err| {
        CommandError::Runtime(RuntimeError::InvalidArgument(format!(
            "result not serialisable: {err}"
        )))
    })
}

/// Runs one command. Transports only decode, call this, and encode.
pub async fn dispatch(
    service: &RuntimeService,
    command: &str,
    arguments: Value,
) -> Result<Value, CommandError> {
    match command {
        "create_session" => {
            let a: CreateSession = args(command, arguments)?;
            to_value(service.create_session(&a.workspace, a.title)?)
        }
        "list_sessions" => {
            let a: ListSessions = args(command, arguments)?;
            to_value(service.list_sessions(a.workspace.as_deref())?)
        }
        "get_session" => {
            let a: SessionRef = args(command, arguments)?;
            to_value(service.get_session(&a.session_id)?)
        }
        "delete_session" => {
            let a: SessionRef = args(command, arguments)?;
            service.delete_session(&a.session_id).await?;
            Ok(json!({}))
        }
        "submit" => {
            let a: Submit = args(command, arguments)?;
            let (message_id, status) = service
                .controller(&a.session_id)?
                .submit(a.content, a.config)?;
            to_value(Submitted { message_id, status })
        }
        "cancel" => {
            let a: SessionRef = args(command, arguments)?;
            service.cancel_session(&a.session_id).await?;
            Ok(json!({}))
        }
        "resume_subagent" => {
            let a: SessionRef = args(command, arguments)?;
            service.resume_subagent(&a.session_id).await?;
            Ok(json!({}))
        }
        "steer" => {
            let a: MessageRef = args(command, arguments)?;
            let status = service.controller(&a.session_id)?.steer(&a.message_id)?;
            to_value(Steered { status })
        }
        "discard" => {
            let a: MessageRef = args(command, arguments)?;
            service.controller(&a.session_id)?.discard(&a.message_id)?;
            Ok(json!({}))
        }
        "decide_approval" => {
            let a: DecideApproval = args(command, arguments)?;
            service.decide_approval(a)?;
            Ok(json!({}))
        }
        "snapshot" => {
            let a: SessionRef = args(command, arguments)?;
            to_value(service.controller(&a.session_id)?.snapshot())
        }
        "get_config" => Ok(service.config().redacted()),
        "update_config" => {
            let a: UpdateConfig = args(command, arguments)?;
            Ok(service.update_config(&a.patch)?.redacted())
        }
        "probe_providers" => to_value(crate::probe::probe_known().await),
        "app_info" => Ok(service.app_info()),
        "set_api_key" => {
            let a: SetApiKey = args(command, arguments)?;
            Ok(service.set_api_key(&a.key, a.entry).await?.redacted())
        }
        other => Err(CommandError::UnknownCommand(other.to_string())),
    }
}
