//! Test helpers: a scripted provider that behaves like the seed's DelegationProvider, a fixture around a real RuntimeService on a temp dir, and event waits with a timeout.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bumblehive::controller::{SessionController, Subscription};
use bumblehive::invariant::check_message_order;
use bumblehive::protocol::{Event, Message, Role, RunConfig, ToolCall};
use bumblehive::provider::{
    ModelProvider, ModelRequest, ModelResponse, ProviderError, ProviderEvent, ProviderSink,
    fixed_provider,
};
use bumblehive::service::{RuntimeService, ServiceOptions};
use serde_json::{Value, json};
use tokio::sync::watch;

/// The seed's longest wait.
pub const WAIT: Duration = Duration::from_secs(4);

/// An asyncio.Event: set, clear, wait.
#[derive(Clone)]
pub struct Flag(Arc<watch::Sender<bool>>);

impl Flag {
    pub fn new(set: bool) -> Self {
        Flag(Arc::new(watch::channel(set).0))
    }
    pub fn set(&self) {
        self.0.send_replace(true);
    }
    pub fn clear(&self) {
        self.0.send_replace(false);
    }
    pub async fn wait(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|set| *set).await;
    }
}

/// The seed's DelegationProvider: parents delegate per plan, children wait on a gate,
/// read `data.txt`, and report; every request is recorded.
pub struct DelegationProvider {
    pub plans: Mutex<HashMap<String, (usize, bool)>>,
    gates: Mutex<HashMap<String, Flag>>,
    pub parent_release: Flag,
    requests: watch::Sender<Vec<Vec<Message>>>,
    pub child_error: AtomicBool,
    pub parent_error: AtomicBool,
    pub approval_path: PathBuf,
}

impl DelegationProvider {
    pub fn new(approval_path: PathBuf) -> Self {
        DelegationProvider {
            plans: Mutex::new(HashMap::new()),
            gates: Mutex::new(HashMap::new()),
            parent_release: Flag::new(true),
            requests: watch::channel(Vec::new()).0,
            child_error: AtomicBool::new(false),
            parent_error: AtomicBool::new(false),
            approval_path,
        }
    }

    /// `provider.children.setdefault(name, asyncio.Event())`
    pub fn gate(&self, name: &str) -> Flag {
        self.gates
            .lock()
            .unwrap()
            .entry(name.to_string())
            .or_insert_with(|| Flag::new(false))
            .clone()
    }

    pub fn requests(&self) -> Vec<Vec<Message>> {
        self.requests.borrow().clone()
    }

    /// Waits (at most [`WAIT`]) until some recorded request satisfies `pred`.
    pub async fn wait_request(&self, pred: impl Fn(&[Message]) -> bool) {
        let mut rx = self.requests.subscribe();
        tokio::time::timeout(
            WAIT,
            rx.wait_for(|requests| requests.iter().any(|r| pred(r))),
        )
        .await
        .expect("timed out waiting for a model request")
        .expect("provider dropped");
    }

    async fn respond(&self, messages: Vec<Message>) -> Result<ModelResponse, ProviderError> {
        self.requests.send_modify(|r| r.push(messages.clone()));
        let users: Vec<String> = messages
            .iter()
            .filter(|m| m.role == Role::User)
            .map(|m| m.text().to_string())
            .collect();
        let first = users[0].clone();
        if first.contains("\nTask:\nCHILD:") {
            let name = first
                .rsplit_once("CHILD:")
                .unwrap()
                .1
                .lines()
                .next()
                .unwrap_or("")
                .to_string();
            let last = messages.last().unwrap();
            if last.role == Role::Tool {
                return Ok(ModelResponse::text(format!(
                    "REPORT:{name}: {}",
                    last.text()
                )));
            }
            self.gate(&name).wait().await;
            if self.child_error.load(Ordering::SeqCst) {
                return Err(ProviderError::Other("child execution failed".into()));
            }
            return Ok(ModelResponse::tool_calls(vec![ToolCall {
                id: "read-child".into(),
                name: "read_file".into(),
                arguments: json!({"path": "data.txt"}),
            }]));
        }
        let root = first
            .strip_prefix("ROOT:")
            .unwrap_or(&first)
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        let systems = messages.iter().filter(|m| m.role == Role::System).count();
        if messages.len() == systems + 1 {
            let (count, approval) = self.plans.lock().unwrap()[&root];
            let mut calls: Vec<ToolCall> = (0..count)
                .map(|i| ToolCall {
                    id: format!("delegate-{i}"),
                    name: "sub_agent".into(),
                    arguments: json!({"title": format!("Review {root}-{i}"), "task": format!("CHILD:{root}-{i}")}),
                })
                .collect();
            if approval {
                calls.push(ToolCall {
                    id: "write-parent".into(),
                    name: "write_file".into(),
                    arguments: json!({"path": self.approval_path.display().to_string(), "content": "approved"}),
                });
            }
            return Ok(ModelResponse::tool_calls(calls));
        }
        self.parent_release.wait().await;
        if self.parent_error.load(Ordering::SeqCst) {
            return Err(ProviderError::Other("parent execution failed".into()));
        }
        let reports: Vec<&str> = users
            .iter()
            .filter(|u| u.starts_with("[Background tool result]"))
            .map(String::as_str)
            .collect();
        let body = if reports.is_empty() {
            "initial answer".to_string()
        } else {
            reports.join("\n")
        };
        Ok(ModelResponse::text(format!("PARENT:{root}:{body}")))
    }
}

#[async_trait]
impl ModelProvider for DelegationProvider {
    async fn generate(
        &self,
        request: ModelRequest,
        sink: ProviderSink<'_>,
    ) -> Result<ModelResponse, ProviderError> {
        let response = self.respond(request.messages.to_vec()).await?;
        if let Some(content) = &response.content {
            sink(ProviderEvent::ContentDelta(content.clone()));
        }
        Ok(response)
    }
}

/// The seed's `delegation` fixture: a real service on a temp dir with the scripted provider.
pub struct Delegation {
    pub service: RuntimeService,
    pub provider: Arc<DelegationProvider>,
    pub dir: tempfile::TempDir,
}

impl Delegation {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let provider = Arc::new(DelegationProvider::new(dir.path().join("approval.txt")));
        let service = Self::open(dir.path(), provider.clone());
        Delegation {
            service,
            provider,
            dir,
        }
    }

    /// Stops the service and starts a new one on the same data dir and provider, as an
    /// app restart does.
    pub async fn restart(&mut self) {
        tokio::time::timeout(WAIT, self.service.shutdown())
            .await
            .expect("shutdown hung");
        self.service = Self::open(self.dir.path(), self.provider.clone());
    }

    /// A service on `folder`'s `data` and `config.json` with this fixture's model: the
    /// fixture's own folder, or a copy of it (a crash's disk, recovered).
    pub fn open(folder: &Path, provider: Arc<DelegationProvider>) -> RuntimeService {
        RuntimeService::new(ServiceOptions {
            data_dir: folder.join("data"),
            config_path: Some(folder.join("config.json")),
            config: None,
            provider_factory: fixed_provider(provider),
            tools: None,
        })
        .unwrap()
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The seed's teardown: shutdown leaves zero active runs and zero tasks.
    pub async fn shutdown(self) {
        tokio::time::timeout(WAIT, self.service.shutdown())
            .await
            .expect("shutdown hung");
        assert_eq!(self.service.active_runs(), 0);
        assert!(self.service.subagents().is_empty());
    }

    pub fn history(&self, session_id: &str) -> Vec<Message> {
        self.service.store().load(session_id).unwrap().messages
    }

    /// Waits until no run and no sub-agent task is left.
    pub async fn wait_idle(&self) {
        tokio::time::timeout(WAIT, self.service.wait_idle())
            .await
            .expect("timed out waiting for the runtime to be idle");
    }

    /// The seed's `begin`: a session in `workspace` (default `<tmp>/<root>`) with
    /// `data.txt`, subscribed, submitted, and its `count` children created.
    pub async fn begin(
        &self,
        root: &str,
        count: usize,
        approval: bool,
        workspace: Option<PathBuf>,
    ) -> Begun {
        let workspace = workspace.unwrap_or_else(|| self.path().join(root));
        std::fs::create_dir_all(&workspace).unwrap();
        std::fs::write(workspace.join("data.txt"), format!("DATA:{root}")).unwrap();
        let info = self
            .service
            .create_session(workspace.to_str().unwrap(), None)
            .unwrap();
        let controller = self.service.controller(&info.session_id).unwrap();
        let (mut events, _) = controller.subscribe();
        self.provider
            .plans
            .lock()
            .unwrap()
            .insert(root.to_string(), (count, approval));
        let config: RunConfig = serde_json::from_value(
            json!({"runtime": {"workspace": workspace.display().to_string()}}),
        )
        .unwrap();
        controller
            .submit(format!("ROOT:{root}"), Some(config))
            .unwrap();
        let mut children = Vec::new();
        for _ in 0..count {
            children.push(receive(&mut events, "session_created", None, None).await);
        }
        Begun {
            session_id: info.session_id,
            controller,
            events,
            children,
        }
    }
}

pub struct Begun {
    pub session_id: String,
    pub controller: Arc<SessionController>,
    pub events: Subscription,
    pub children: Vec<Value>,
}

/// Whether an event (as JSON) is of `kind`, and of the session and status when given.
pub fn is_event(value: &Value, kind: &str, session_id: Option<&str>, status: Option<&str>) -> bool {
    value["type"] == kind
        && session_id.is_none_or(|id| value["session_id"] == id)
        && status.is_none_or(|s| value["status"] == s)
}

/// The seed's `receive`: the next event of `kind` (and session, and status), within 4 s.
pub async fn receive(
    events: &mut Subscription,
    kind: &str,
    session_id: Option<&str>,
    status: Option<&str>,
) -> Value {
    let wanted = async {
        loop {
            let event: Event = events.next_event().await.expect("event stream closed");
            let value = serde_json::to_value(&event).unwrap();
            if is_event(&value, kind, session_id, status) {
                return value;
            }
        }
    };
    tokio::time::timeout(WAIT, wanted)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {kind} {session_id:?} {status:?}"))
}

/// The seed's `assert_message_order`.
pub fn assert_message_order(messages: &[Message]) {
    if let Err(err) = check_message_order(messages) {
        panic!("{err}: {messages:#?}");
    }
}

pub fn is_report(message: &Message) -> bool {
    message.text().starts_with("[Background tool result]")
}

/// Whether this process runs one test alone (`run_alone` started it).
pub fn alone() -> bool {
    std::env::var_os("BUMBLEHIVE_TEST_ALONE").is_some()
}

/// Runs the ignored test `name` (its full path, `module::test`) in a process of its own:
/// for tests of process-wide state (the sandbox's settings and hidden paths, which every
/// service started by a parallel test changes), whose property holds only while nothing
/// else in the process changes it. The inner test starts with `if !alone() { return; }`.
pub fn run_alone(name: &str) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            name,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("BUMBLEHIVE_TEST_ALONE", "1")
        .output()
        .unwrap();
    let said = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.contains("1 passed"),
        "{name}, run alone, failed ({}):\n{said}",
        out.status
    );
}
