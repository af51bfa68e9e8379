//! The client's `terminal/*` for an external ACP agent: each `terminal/create` is one `run_command` call (our sandbox, our approvals in the parent's window, our output cap, timeout and process-group kill) running in the background under its terminal id until the agent waits for it, reads it, kills it or releases it.
//!
//! `terminal/output` answers with what the command wrote so far (run_command's head and
//! tail cut), then with its whole result once it has ended.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::rpc::{self, RpcError};
use crate::tools::command::{Output, run_command_into};
use crate::tools::{ToolContext, ToolError};

/// How a terminal's command ended.
#[derive(Debug, Clone, PartialEq)]
struct Ended {
    output: String,
    exit_code: Option<i64>,
    signal: Option<String>,
}

struct Terminal {
    ended: watch::Receiver<Option<Ended>>,
    /// What the command wrote so far.
    output: Arc<Mutex<Output>>,
    kill: CancellationToken,
    output_limit: Option<usize>,
}

/// A terminal's end, its output so far and its output limit.
type Seen = (
    watch::Receiver<Option<Ended>>,
    Arc<Mutex<Output>>,
    Option<usize>,
);

/// One agent's terminals, by id.
#[derive(Default)]
pub struct Terminals {
    map: Mutex<HashMap<String, Terminal>>,
    next: std::sync::atomic::AtomicU64,
}

/// Quotes a word for `sh -c` (what `run_command` runs) so it stays one word.
fn quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        return word.to_string();
    }
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The shell line a `terminal/create` asks for: its `env` as assignments, then the
/// command and its arguments, each quoted (the person sees exactly this line).
fn command_line(params: &Value) -> Result<String, RpcError> {
    let command = params["command"]
        .as_str()
        .filter(|c| !c.trim().is_empty())
        .ok_or_else(|| RpcError::invalid_params("command is missing"))?;
    let mut words = Vec::new();
    for var in params["env"].as_array().into_iter().flatten() {
        let name = var["name"].as_str().unwrap_or_default();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(RpcError::invalid_params(format!(
                "env: {name:?} is not a variable name"
            )));
        }
        words.push(format!(
            "{name}={}",
            quote(var["value"].as_str().unwrap_or_default())
        ));
    }
    words.push(quote(command));
    for arg in params["args"].as_array().into_iter().flatten() {
        words.push(quote(arg.as_str().unwrap_or_default()));
    }
    Ok(words.join(" "))
}

/// What `run_command` answered, as the terminal's output and exit status.
fn ended(result: Result<String, ToolError>) -> Ended {
    match result {
        Ok(text) => {
            let (head, output) = text.split_once('\n').unwrap_or((&text, ""));
            let output = if output == "(no output)" { "" } else { output };
            let (exit_code, signal) = if let Some(code) = head.strip_prefix("exit code: ") {
                (code.trim().parse().ok(), None)
            } else if let Some(signal) = head.strip_prefix("killed by signal ") {
                (None, Some(signal.trim().to_string()))
            } else {
                (None, None)
            };
            Ended {
                output: output.to_string(),
                exit_code,
                signal,
            }
        }
        // Denied, timed out, stopped or not started: the text says which; there is no
        // exit code.
        Err(err) => Ended {
            output: err.to_string(),
            exit_code: None,
            signal: None,
        },
    }
}

/// Keeps the last `limit` bytes (the protocol cuts from the beginning), on a character
/// boundary.
fn cut(output: &str, limit: Option<usize>) -> (String, bool) {
    match limit {
        Some(limit) if output.len() > limit => {
            let mut start = output.len() - limit;
            while !output.is_char_boundary(start) {
                start += 1;
            }
            (output[start..].to_string(), true)
        }
        _ => (output.to_string(), false),
    }
}

fn status(ended: &Ended) -> Value {
    json!({"exitCode": ended.exit_code, "signal": ended.signal})
}

impl Terminals {
    /// Kills every command still running (the agent is gone).
    pub fn kill_all(&self) {
        for terminal in self.lock().values() {
            terminal.kill.cancel();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Terminal>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, params: &Value) -> Result<Seen, RpcError> {
        let id = params["terminalId"].as_str().unwrap_or_default();
        self.lock()
            .get(id)
            .map(|t| (t.ended.clone(), t.output.clone(), t.output_limit))
            .ok_or_else(|| RpcError::invalid_params(format!("no terminal {id:?}")))
    }

    /// Serves one `terminal/*` request.
    pub async fn serve(
        &self,
        ctx: &ToolContext,
        method: &str,
        params: &Value,
    ) -> Result<Value, RpcError> {
        match method {
            "terminal/create" => {
                let line = command_line(params)?;
                let mut arguments = json!({"command": line});
                if let Some(cwd) = params["cwd"].as_str() {
                    arguments["cwd"] = json!(cwd);
                }
                let id = format!(
                    "term-{}",
                    self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
                );
                let kill = ctx.cancel.child_token();
                let (tx, rx) = watch::channel(None);
                let mut run_ctx = ctx.clone();
                run_ctx.cancel = kill.clone();
                let output = Arc::new(Mutex::new(Output::default()));
                tokio::spawn({
                    let output = output.clone();
                    async move {
                        let result = run_command_into(&run_ctx, arguments, output).await;
                        tx.send_replace(Some(ended(result)));
                    }
                });
                self.lock().insert(
                    id.clone(),
                    Terminal {
                        ended: rx,
                        output,
                        kill,
                        output_limit: params["outputByteLimit"].as_u64().map(|l| l as usize),
                    },
                );
                Ok(json!({"terminalId": id}))
            }
            "terminal/output" => {
                let (ended, so_far, limit) = self.get(params)?;
                let ended = ended.borrow().clone();
                Ok(match ended {
                    Some(ended) => {
                        let (output, truncated) = cut(&ended.output, limit);
                        json!({"output": output, "truncated": truncated, "exitStatus": status(&ended)})
                    }
                    None => {
                        let so_far = so_far.lock().unwrap_or_else(|p| p.into_inner()).so_far();
                        let (output, truncated) = cut(&so_far, limit);
                        json!({"output": output, "truncated": truncated})
                    }
                })
            }
            "terminal/wait_for_exit" => {
                let (mut ended, _, _) = self.get(params)?;
                let ended = ended
                    .wait_for(Option::is_some)
                    .await
                    .map_err(|_| RpcError::new(rpc::INTERNAL_ERROR, "the terminal is gone"))?
                    .clone()
                    .unwrap_or_else(|| unreachable!("waited for Some"));
                Ok(status(&ended))
            }
            "terminal/kill" => {
                let id = params["terminalId"].as_str().unwrap_or_default();
                match self.lock().get(id) {
                    Some(terminal) => terminal.kill.cancel(),
                    None => return Err(RpcError::invalid_params(format!("no terminal {id:?}"))),
                }
                Ok(json!({}))
            }
            "terminal/release" => {
                let id = params["terminalId"].as_str().unwrap_or_default();
                match self.lock().remove(id) {
                    Some(terminal) => terminal.kill.cancel(),
                    None => return Err(RpcError::invalid_params(format!("no terminal {id:?}"))),
                }
                Ok(json!({}))
            }
            other => Err(RpcError::new(
                rpc::METHOD_NOT_FOUND,
                format!("{other} is not offered by this client"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_quotes_each_word() {
        assert_eq!(
            command_line(
                &json!({"command": "sh", "args": ["-c", "echo 'hi' > out.txt"],
                "env": [{"name": "LANG", "value": "C"}]})
            )
            .unwrap(),
            r#"LANG=C sh -c 'echo '\''hi'\'' > out.txt'"#
        );
        assert!(
            command_line(&json!({"command": "ls", "env": [{"name": "A;B", "value": ""}]})).is_err()
        );
    }

    #[test]
    fn run_command_results_become_exit_statuses() {
        assert_eq!(
            ended(Ok("exit code: 3\nsome output".into())),
            Ended {
                output: "some output".into(),
                exit_code: Some(3),
                signal: None
            }
        );
        assert_eq!(ended(Ok("exit code: 0\n(no output)".into())).output, "");
        assert_eq!(
            ended(Ok("killed by signal 9\n".into())).signal.as_deref(),
            Some("9")
        );
        let denied = ended(Err(ToolError::Denied(Some("not now".into()))));
        assert_eq!(denied.exit_code, None);
        assert!(denied.output.contains("not now"), "{}", denied.output);
    }

    #[test]
    fn output_is_cut_from_the_beginning_on_a_character_boundary() {
        assert_eq!(cut("abcdef", Some(3)), ("def".into(), true));
        assert_eq!(cut("aé", Some(1)), ("".into(), true));
        assert_eq!(cut("abc", None), ("abc".into(), false));
    }
}
