//! The one command table of SPEC §9, executed: transports decode a name and JSON arguments into a typed [`Command`], this runs it, and they encode the typed result. The table itself (names, argument and result types) is `protocol::commands::command_table!`.

use serde_json::{Value, json};

use crate::error::RuntimeError;
use crate::protocol::commands::*;
use crate::service::RuntimeService;

/// Every command's name, for transports that list or route them.
pub const COMMANDS: &[&str] = COMMAND_NAMES;

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
            "busy" | "conflict" => 409,
            "unavailable" => 503,
            _ => 500,
        }
    }

    /// `{"error": {"code", "message"}}`.
    pub fn to_json(&self) -> Value {
        json!({"error": {"code": self.code(), "message": self.to_string()}})
    }
}

/// Decodes a command from its name and JSON arguments (`null` counts as `{}`).
pub fn decode(name: &str, arguments: Value) -> Result<Command, CommandError> {
    if !COMMAND_NAMES.contains(&name) {
        return Err(CommandError::UnknownCommand(name.to_string()));
    }
    let arguments = if arguments.is_null() {
        json!({})
    } else {
        arguments
    };
    serde_json::from_value(json!({"name": name, "args": arguments})).map_err(|err| {
        CommandError::BadArguments {
            command: name.to_string(),
            message: err.to_string(),
        }
    })
}

/// Runs one command by name. Transports only decode, call this, and encode.
pub async fn dispatch(
    service: &RuntimeService,
    command: &str,
    arguments: Value,
) -> Result<Value, CommandError> {
    let output = execute(service, decode(command, arguments)?).await?;
    serde_json::to_value(output).map_err(|err| {
        CommandError::Runtime(RuntimeError::InvalidArgument(format!(
            "result not serialisable: {err}"
        )))
    })
}

impl RuntimeService {
    /// The skills and custom commands a workspace's sessions see (read each time, like
    /// the profiles: a few small folders, edits apply at once).
    fn skills(&self, workspace: &str) -> Result<crate::skills::Catalog, RuntimeError> {
        let root = std::path::Path::new(workspace);
        if !root.is_absolute() || !root.is_dir() {
            return Err(RuntimeError::InvalidArgument(format!(
                "workspace {workspace} is not a folder"
            )));
        }
        let user = self.shared().user_dir();
        Ok(crate::skills::discover(
            root,
            &crate::skills::UserDirs::with_config(user.as_deref()),
        ))
    }
}

/// Runs blocking service work on a blocking thread.
async fn blocking<T: Send + 'static>(
    service: &RuntimeService,
    work: impl FnOnce(&RuntimeService) -> Result<T, RuntimeError> + Send + 'static,
) -> Result<T, RuntimeError> {
    let service = service.clone();
    tokio::task::spawn_blocking(move || work(&service))
        .await
        .map_err(|err| RuntimeError::Unavailable(format!("the command failed: {err}")))?
}

/// Runs one typed command; each row returns the result type the table names for it.
pub async fn execute(
    service: &RuntimeService,
    command: Command,
) -> Result<CommandOutput, CommandError> {
    let done = || Empty {};
    Ok(match command {
        Command::CreateSession(a) => {
            CommandOutput::CreateSession(service.create_session(&a.workspace, a.title)?)
        }
        // Both read files that grow with use (every meta, a whole history): off the async
        // threads, so a long list or a long session never stalls running sessions (C16).
        Command::ListSessions(a) => CommandOutput::ListSessions(
            blocking(service, move |s| s.list_sessions(a.workspace.as_deref())).await?,
        ),
        Command::GetSession(a) => CommandOutput::GetSession(
            blocking(service, move |s| {
                s.get_session_page(&a.session_id, a.last, a.before)
            })
            .await?,
        ),
        Command::DeleteSession(a) => {
            service.delete_session(&a.session_id).await?;
            CommandOutput::DeleteSession(done())
        }
        Command::Submit(a) => {
            let (message_id, status) = service
                .submit_message_with_images(
                    &a.session_id,
                    a.content,
                    a.config,
                    a.images.unwrap_or_default(),
                )
                .await?;
            CommandOutput::Submit(Submitted { message_id, status })
        }
        Command::Cancel(a) => {
            service.cancel_session(&a.session_id).await?;
            CommandOutput::Cancel(done())
        }
        Command::Compact(a) => {
            service.controller(&a.session_id)?.compact()?;
            CommandOutput::Compact(done())
        }
        Command::ResumeSubagent(a) => {
            service.resume_subagent(&a.session_id).await?;
            CommandOutput::ResumeSubagent(done())
        }
        Command::Steer(a) => {
            let status = service.controller(&a.session_id)?.steer(&a.message_id)?;
            CommandOutput::Steer(Steered { status })
        }
        // A report's discard waits for the ledger's flush: off the async threads (R12).
        Command::Discard(a) => {
            blocking(service, move |s| {
                s.controller(&a.session_id)?.discard(&a.message_id)
            })
            .await?;
            CommandOutput::Discard(done())
        }
        Command::DecideApproval(a) => {
            service.decide_approval(a)?;
            CommandOutput::DecideApproval(done())
        }
        Command::Snapshot(a) => {
            CommandOutput::Snapshot(service.controller(&a.session_id)?.snapshot())
        }
        Command::GetConfig(_) => CommandOutput::GetConfig(service.config().redacted()),
        Command::UpdateConfig(a) => {
            CommandOutput::UpdateConfig(service.update_config(&a.patch)?.redacted())
        }
        Command::ProbeProviders(_) => {
            CommandOutput::ProbeProviders(crate::probe::probe_known().await)
        }
        Command::AppInfo(_) => CommandOutput::AppInfo(service.app_info()),
        Command::SetApiKey(a) => CommandOutput::SetApiKey(
            service
                .set_api_key(&a.key, a.entry, a.provider.as_deref())
                .await?
                .redacted(),
        ),
        Command::RenameSession(a) => {
            CommandOutput::RenameSession(service.rename_session(&a.session_id, &a.title)?)
        }
        Command::ArchiveSession(a) => {
            CommandOutput::ArchiveSession(service.archive_session(&a.session_id, a.archived)?)
        }
        Command::SearchSessions(a) => CommandOutput::SearchSessions(
            service
                .search_sessions(&a.query, a.workspace.as_deref())
                .await?,
        ),
        Command::SetAgent(a) => CommandOutput::SetAgent(service.set_agent(&a.session_id, a.agent)?),
        Command::SetModel(a) => {
            CommandOutput::SetModel(service.set_model(&a.session_id, a.provider, a.model)?)
        }
        Command::ListAgents(a) => CommandOutput::ListAgents(
            blocking(service, move |s| Ok(s.list_agents(&a.workspace))).await?,
        ),
        Command::TestProvider(a) => {
            CommandOutput::TestProvider(service.test_provider(&a.name).await?)
        }
        Command::TurnChanges(a) => {
            CommandOutput::TurnChanges(service.turn_changes(&a.session_id).await?)
        }
        Command::UndoTurn(a) => CommandOutput::UndoTurn(service.undo_turn(a).await?),
        Command::ForkSession(a) => CommandOutput::ForkSession(service.fork_session(a).await?),
        Command::ApplyWorktree(a) => {
            CommandOutput::ApplyWorktree(service.apply_worktree(&a.session_id).await?)
        }
        Command::UndoHistory(a) => CommandOutput::UndoHistory(
            crate::checkpoints::session_ops::undo_history(service.shared(), &a.workspace).await?,
        ),
        Command::ClearUndoHistory(a) => CommandOutput::ClearUndoHistory(
            crate::checkpoints::session_ops::clear_undo_history(service.shared(), &a.workspace)
                .await?,
        ),
        Command::DiscardWorktree(a) => {
            service.discard_worktree(&a.session_id).await?;
            CommandOutput::DiscardWorktree(done())
        }
        Command::ListMcpServers(a) => CommandOutput::ListMcpServers(
            blocking(service, move |s| {
                Ok(s.list_mcp_servers(a.workspace.as_deref()))
            })
            .await?,
        ),
        Command::SetMcpServerEnabled(a) => CommandOutput::SetMcpServerEnabled(
            blocking(service, move |s| {
                s.set_mcp_server_enabled(&a.name, a.enabled)
            })
            .await?,
        ),
        Command::RestartMcpServer(a) => {
            service.restart_mcp_server(&a.name, a.workspace.as_deref())?;
            CommandOutput::RestartMcpServer(done())
        }
        Command::TrustMcpWorkspace(a) => {
            let start = a.allow && a.start == Some(true);
            let workspace = a.workspace.clone();
            let listed = blocking(service, move |s| {
                // The answer is for what the person was shown (security review 6).
                if let Some(sha256) = &a.sha256 {
                    crate::mcp::check_trust_digest(&a.workspace, sha256)
                        .map_err(crate::error::RuntimeError::InvalidArgument)?;
                }
                s.trust_mcp_workspace(&a.workspace, a.allow)
            })
            .await?;
            CommandOutput::TrustMcpWorkspace(if start {
                crate::settings::start_mcp_workspace(service.shared(), &workspace).await
            } else {
                listed
            })
        }
        // A workspace just opened: its MCP servers (the config's, and the trusted ones of
        // its `.mcp.json`) start now instead of with its first turn, which waited about
        // 1.5 s for them after every start (UX review E13). The answer comes once they are
        // ready (the UI does not wait for it). Nothing untrusted starts: `prepare` is the
        // turn's own path.
        Command::WarmWorkspace(a) => CommandOutput::WarmWorkspace(
            crate::settings::start_mcp_workspace(service.shared(), &a.workspace).await,
        ),
        Command::ListWorkspaces(_) => {
            CommandOutput::ListWorkspaces(blocking(service, |s| s.list_workspaces()).await?)
        }
        Command::ListFolders(a) => CommandOutput::ListFolders(
            blocking(service, move |_| {
                crate::workspace::list_folders(a.path.as_deref(), a.hidden, a.limit)
            })
            .await?,
        ),
        Command::CheckWorkspace(a) => CommandOutput::CheckWorkspace(CheckedWorkspace {
            path: crate::workspace::check_folder(&a.path)?
                .display()
                .to_string(),
        }),
        Command::ListSkills(a) => CommandOutput::ListSkills(
            blocking(service, move |s| Ok(s.skills(&a.workspace)?.info())).await?,
        ),
        Command::ExpandCommand(a) => CommandOutput::ExpandCommand(
            blocking(service, move |s| {
                let mut expanded = crate::skills::expand(&s.skills(&a.workspace)?, &a.text)
                    .map_err(|err| match err {
                        crate::skills::SkillError::Unreadable { .. } => {
                            RuntimeError::Unavailable(err.to_string())
                        }
                        _ => RuntimeError::NotFound(err.to_string()),
                    })?;
                // The session's provider is the default one unless the person picked
                // another; the default is what a new turn runs on.
                let kind = s.shared().read_config(|c| {
                    c.provider_named(None)
                        .map(|(_, block)| block.kind.clone())
                        .unwrap_or_default()
                });
                crate::skills::fit_model(&mut expanded, &kind);
                Ok(expanded)
            })
            .await?,
        ),
        Command::ListFiles(a) => CommandOutput::ListFiles(
            service
                .list_files(&a.workspace, a.query.as_deref(), a.limit)
                .await?,
        ),
    })
}
