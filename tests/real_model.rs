//! The `openai` provider against a real small model (llama.cpp's llama-server with Qwen2.5-Coder-0.5B from scripts/local-llm/server.sh): a streamed text answer, and a run that reads a file of a real workspace. Skipped, with a line saying so, unless BUMBLEHIVE_REAL_MODEL_URL is set (scripts/real-model-tier.sh sets it).

use std::sync::Arc;
use std::time::Duration;

use bumblehive::config::{Config, ProviderConfig};
use bumblehive::protocol::{Event, Message, Role};
use bumblehive::provider::{
    ModelProvider, ModelRequest, ModelResponse, ModelSettings, ProviderError, ProviderEvent,
    ProviderSink,
};
use bumblehive::providers::provider_from_config;
use bumblehive::service::{RuntimeService, ServiceOptions};
use bumblehive::tools::{ReadFile, ToolRegistry};
use serde_json::json;

use crate::support::assert_message_order;

const URL_ENV: &str = "BUMBLEHIVE_REAL_MODEL_URL";

/// A 0.5B model on two CPU cores: generous, but bounded.
const REAL_WAIT: Duration = Duration::from_secs(240);

fn real_model_config() -> Option<ProviderConfig> {
    let Ok(url) = std::env::var(URL_ENV) else {
        println!(
            "skipped: {URL_ENV} is not set (scripts/real-model-tier.sh starts a real model and sets it)"
        );
        return None;
    };
    let mut config = ProviderConfig {
        kind: "openai".into(),
        base_url: url,
        model: std::env::var("BUMBLEHIVE_REAL_MODEL_NAME")
            .unwrap_or_else(|_| "qwen2.5-coder-0.5b-instruct".into()),
        api_key_env: None,
        // Deterministic answers; short ones, so the tier stays quick.
        temperature: Some(0.0),
        max_tokens: Some(128),
        ..ProviderConfig::default()
    };
    config
        .extra
        .insert("idle_timeout_ms".into(), json!(120_000));
    config.extra.insert("max_retries".into(), json!(2));
    Some(config)
}

#[tokio::test]
async fn real_model_streams_a_text_answer() {
    let Some(config) = real_model_config() else {
        return;
    };
    let provider = provider_from_config(&config).unwrap();
    let request = ModelRequest {
        messages: vec![
            Message::system("You are a helpful assistant. Answer briefly."),
            Message::user("m1", "Count from 1 to 5, separated by commas."),
        ]
        .into(),
        // The 0.5B model calls a tool whenever tools are offered: none here.
        tools: Vec::new().into(),
        settings: ModelSettings::from(&config),
    };
    let deltas = std::sync::Mutex::new(Vec::new());
    let sink = |event: ProviderEvent| {
        if let ProviderEvent::ContentDelta(text) = event {
            deltas.lock().unwrap().push(text);
        }
    };
    let response = tokio::time::timeout(REAL_WAIT, provider.generate(request, &sink))
        .await
        .expect("the real model did not answer in time")
        .unwrap();
    let deltas = deltas.into_inner().unwrap();
    let content = response.content.clone().unwrap_or_default();
    println!("real model answered {content:?} in {} deltas", deltas.len());
    assert!(!content.trim().is_empty(), "{response:?}");
    assert!(deltas.len() > 1, "the answer was not streamed: {deltas:?}");
    assert_eq!(deltas.concat(), content);
    assert!(response.tool_calls.is_empty());
    assert!(
        matches!(response.finish_reason.as_deref(), Some("stop" | "length")),
        "{response:?}"
    );
    let usage = response.usage.expect("no usage chunk");
    assert!(
        usage.input_tokens > 0 && usage.output_tokens > 0,
        "{usage:?}"
    );
}

/// The 0.5B model calls a tool whenever tools are offered (shared/tools/local-llm's
/// README), so a run with it never ends on its own. Once a tool result is in the history,
/// this asks the real model without tools, which makes it answer in text; every call
/// still goes over HTTP through the real `openai` provider.
struct OneToolRound(Arc<dyn ModelProvider>);

#[async_trait::async_trait]
impl ModelProvider for OneToolRound {
    async fn generate(
        &self,
        mut request: ModelRequest,
        sink: ProviderSink<'_>,
    ) -> Result<ModelResponse, ProviderError> {
        if request.messages.iter().any(|m| m.role == Role::Tool) {
            request.tools = Vec::new().into();
        }
        self.0.generate(request, sink).await
    }
}

#[tokio::test]
async fn real_model_reads_a_file_in_a_real_workspace() {
    let Some(config) = real_model_config() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let mut notes = String::from("The secret word is PINEAPPLE.\n");
    for line in 2..=12 {
        notes.push_str(&format!("Line {line} is filler.\n"));
    }
    std::fs::write(workspace.join("notes.txt"), notes).unwrap();
    // Only the read-only tool: nothing can wait for an approval nobody gives.
    let mut tools = ToolRegistry::default();
    tools.register(Arc::new(ReadFile));
    let service = RuntimeService::new(ServiceOptions {
        data_dir: dir.path().join("data"),
        config_path: None,
        config: Some(Config {
            provider: config,
            ..Config::default()
        }),
        provider_factory: Arc::new(|config: &ProviderConfig| {
            let real = provider_from_config(config)?;
            Ok(Arc::new(OneToolRound(real)) as Arc<dyn ModelProvider>)
        }),
        tools: Some(tools),
    })
    .unwrap();
    let info = service
        .create_session(workspace.to_str().unwrap(), None)
        .unwrap();
    let controller = service.controller(&info.session_id).unwrap();
    let (mut events, _) = controller.subscribe();
    controller
        .submit(
            // Short prompts get sensible arguments from this model; longer ones made it
            // ask for line 10^15.
            "Read notes.txt.".into(),
            None,
        )
        .unwrap();
    let end = tokio::time::timeout(REAL_WAIT, async {
        loop {
            let event = events.next_event().await.expect("event stream closed");
            if matches!(event, Event::Result { .. } | Event::Error { .. }) {
                return event;
            }
        }
    })
    .await
    .expect("the run with the real model did not end in time");
    let history = service.store().load(&info.session_id).unwrap().messages;
    println!("real model history: {history:#?}");
    assert!(matches!(end, Event::Result { .. }), "{end:?}");
    assert_message_order(&history);
    let call = history
        .iter()
        .flat_map(|m| &m.tool_calls)
        .find(|c| c.name == "read_file")
        .expect("the model never called read_file");
    let result = history
        .iter()
        .find(|m| m.role == Role::Tool && m.tool_call_id.as_deref() == Some(call.id.as_str()))
        .expect("the call has no result");
    assert!(
        call.arguments["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("notes.txt")),
        "{call:?}"
    );
    // The real tool read the real file: its first line, or (if the model asked for
    // lines that are not there) a tool error about that file, which the model is shown.
    assert!(
        result.text().contains("PINEAPPLE")
            || (result.text().starts_with("Error:") && result.text().contains("notes.txt")),
        "{result:?}"
    );
    let last = history.last().unwrap();
    assert_eq!(last.role, Role::Assistant);
    assert!(last.tool_calls.is_empty());
    assert!(
        history
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .all(|m| m.usage.is_some())
    );
    assert!(controller.snapshot().usage.total() > 0);
    tokio::time::timeout(Duration::from_secs(10), service.shutdown())
        .await
        .unwrap();
}
