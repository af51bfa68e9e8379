//! The typed command table driven by name, as both transports drive it: decoding (unknown names, bad arguments, `null` as `{}`), and the session tools the desktop needs (rename, archive, search, workspace files for @-mentions, and the mention's expansion into the message).

use bumblehive::commands::{COMMANDS, dispatch};
use bumblehive::protocol::Role;
use serde_json::json;

use crate::support::{Delegation, receive};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_decode_by_name_with_clear_errors() {
    let fx = Delegation::new();
    let err = dispatch(&fx.service, "no_such", json!({}))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "unknown_command");
    let err = dispatch(&fx.service, "submit", json!({"session_id": 3}))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "invalid_argument");
    assert!(err.to_string().contains("submit"), "{err}");
    // `null` arguments are `{}` for commands that take none.
    let info = dispatch(&fx.service, "app_info", serde_json::Value::Null)
        .await
        .unwrap();
    assert_eq!(info["version"], env!("CARGO_PKG_VERSION"));
    assert!(info["commit"].is_string());
    assert!(COMMANDS.contains(&"rename_session") && COMMANDS.contains(&"list_files"));
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_archive_and_search_sessions() {
    let fx = Delegation::new();
    let mut begun = fx.begin("findme", 0, false, None).await;
    receive(&mut begun.events, "result", Some(&begun.session_id), None).await;
    let id = begun.session_id.clone();
    let renamed = dispatch(
        &fx.service,
        "rename_session",
        json!({"session_id": id, "title": "  Refactor auth  "}),
    )
    .await
    .unwrap();
    assert_eq!(renamed["title"], "Refactor auth");
    let err = dispatch(
        &fx.service,
        "rename_session",
        json!({"session_id": id, "title": " "}),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "invalid_argument");
    let archived = dispatch(
        &fx.service,
        "archive_session",
        json!({"session_id": id, "archived": true}),
    )
    .await
    .unwrap();
    assert_eq!(archived["archived"], true);
    // Both survive the controller being dropped and the app restarting.
    drop(begun);
    let mut fx = fx;
    fx.restart().await;
    let info = fx.service.session_info(&id).unwrap();
    assert_eq!(info.title, "Refactor auth");
    assert!(info.archived);
    // Search finds titles and message content, case-insensitively.
    let by_title = dispatch(&fx.service, "search_sessions", json!({"query": "REFACTOR"}))
        .await
        .unwrap();
    assert_eq!(by_title.as_array().unwrap().len(), 1);
    let by_content = dispatch(
        &fx.service,
        "search_sessions",
        json!({"query": "root:FINDME"}),
    )
    .await
    .unwrap();
    assert_eq!(by_content[0]["session_id"], id.as_str());
    let none = dispatch(
        &fx.service,
        "search_sessions",
        json!({"query": "nothing like it"}),
    )
    .await
    .unwrap();
    assert!(none.as_array().unwrap().is_empty());
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspace_files_are_listed_fuzzily_and_mentions_bring_their_content() {
    let fx = Delegation::new();
    let ws = fx.path().join("mention");
    std::fs::create_dir_all(ws.join("src/controller")).unwrap();
    std::fs::create_dir_all(ws.join("target")).unwrap();
    std::fs::write(ws.join(".gitignore"), "target/\n").unwrap();
    std::fs::write(ws.join("src/controller/run.rs"), "fn run() {}").unwrap();
    std::fs::write(ws.join("README.md"), "readme").unwrap();
    std::fs::write(ws.join("target/run.o"), "junk").unwrap();
    // An ignore file only applies inside a git repository unless it is .ignore.
    std::fs::create_dir_all(ws.join(".git")).unwrap();
    let listed = dispatch(
        &fx.service,
        "list_files",
        json!({"workspace": ws.display().to_string(), "query": "run"}),
    )
    .await
    .unwrap();
    let files: Vec<&str> = listed["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert_eq!(files, ["src/controller/run.rs"]);
    let err = dispatch(&fx.service, "list_files", json!({"workspace": "relative"}))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "invalid_argument");
    // The mention's file content goes into the person's message.
    let info = fx
        .service
        .create_session(ws.to_str().unwrap(), None)
        .unwrap();
    fx.provider
        .plans
        .lock()
        .unwrap()
        .insert("look".into(), (0, false));
    let controller = fx.service.controller(&info.session_id).unwrap();
    let (mut events, _) = controller.subscribe();
    dispatch(
        &fx.service,
        "submit",
        json!({"session_id": info.session_id, "content": "ROOT:look\nsee @src/controller/run.rs"}),
    )
    .await
    .unwrap();
    receive(&mut events, "result", Some(&info.session_id), None).await;
    let history = fx.history(&info.session_id);
    let first = history.iter().find(|m| m.role == Role::User).unwrap();
    assert!(
        first
            .text()
            .contains("<file path=\"src/controller/run.rs\">\nfn run() {}\n</file>"),
        "{}",
        first.text()
    );
    drop(events);
    fx.shutdown().await;
}

/// A 1×1 PNG, base64.
const PIXEL: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg==";

/// A pasted image goes through `submit` into the stored message and reaches each
/// provider as its own kind of image part: Chat Completions' data-URL `image_url`,
/// Anthropic's base64 `image` block before the text; a model configured with
/// `images: false` gets a note instead. Bad images are refused and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_submit_with_an_image_reaches_each_provider_as_an_image_part() {
    use crate::mock_llm::{MockLlm, anthropic, openai};
    use crate::providers_openai::{Fixture, openai_config, provider_config, run_events};

    let image = json!({"media_type": "image/png", "data": PIXEL});
    type Config = fn(&MockLlm) -> bumblehive::config::ProviderConfig;
    let cases: [(&str, Config); 3] = [
        ("openai", openai_config),
        ("anthropic", |mock| {
            provider_config("anthropic", mock.url(), "claude-sonnet-4-5")
        }),
        ("no images", |mock| bumblehive::config::ProviderConfig {
            images: Some(false),
            ..openai_config(mock)
        }),
    ];
    for (kind, config) in cases {
        let mock = MockLlm::start().await;
        if kind == "anthropic" {
            mock.push_sse(anthropic::text_answer(&["a red pixel"], 10, 3));
        } else {
            mock.push_sse(openai::text_answer(&["a red pixel"], (10, 3)));
        }
        let fx = Fixture::new(config(&mock));
        let (controller, mut events) = fx.session();
        let id = controller.session_id().to_string();
        dispatch(
            &fx.service,
            "submit",
            json!({"session_id": id, "content": "what is this?", "images": [image]}),
        )
        .await
        .unwrap();
        let (_, end) = run_events(&mut events, &id).await;
        assert!(
            matches!(end, bumblehive::protocol::Event::Result { .. }),
            "{kind}: {end:?}"
        );
        let body = &mock.requests()[0].body;
        let user = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "user")
            .unwrap()
            .clone();
        match kind {
            "openai" => assert_eq!(
                user["content"],
                json!([
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{PIXEL}")}}
                ])
            ),
            "anthropic" => assert_eq!(
                user["content"],
                json!([
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}},
                    {"type": "text", "text": "what is this?"}
                ])
            ),
            _ => {
                let text = user["content"].as_str().unwrap();
                assert!(text.starts_with("what is this?"), "{text}");
                assert!(text.contains("1 image attached here left out"), "{text}");
                assert!(!body.to_string().contains(PIXEL));
            }
        }
        let stored = fx.service.get_session(&id).unwrap().messages;
        assert_eq!(stored[0].images.len(), 1);
        assert_eq!(stored[0].images[0].data, PIXEL);
        // Fork from that message: its text and its images come back for the composer.
        let forked = dispatch(
            &fx.service,
            "fork_session",
            json!({"session_id": id, "message_index": 0}),
        )
        .await
        .unwrap();
        assert_eq!(forked["draft"], "what is this?", "{kind}");
        assert_eq!(forked["draft_images"], json!([image]), "{kind}");
        fx.shutdown().await;
    }

    // Refused before anything is stored: a type no provider takes, broken base64, too many.
    let mock = MockLlm::start().await;
    let fx = Fixture::new(openai_config(&mock));
    let (controller, _events) = fx.session();
    let id = controller.session_id().to_string();
    let bad = [
        (
            json!([{"media_type": "image/bmp", "data": PIXEL}]),
            "image/bmp",
        ),
        (
            json!([{"media_type": "image/png", "data": "not base64!"}]),
            "not valid base64",
        ),
        (json!(vec![image.clone(); 9]), "at most 8"),
    ];
    for (images, says) in bad {
        let err = dispatch(
            &fx.service,
            "submit",
            json!({"session_id": id, "content": "look", "images": images}),
        )
        .await
        .unwrap_err();
        assert_eq!(err.code(), "invalid_argument");
        assert!(err.to_string().contains(says), "{err}");
    }
    assert!(fx.service.get_session(&id).unwrap().messages.is_empty());
    assert!(mock.requests().is_empty());
    fx.shutdown().await;
}

/// Settings → Model servers → Test: one real one-token request through each named
/// provider, over HTTP to the scripted server, with the failure said in words.
/// E19: a provider test also answers with the models the server lists (its
/// `GET /v1/models`), even when the test failed, so Settings offers them in the model
/// field instead of free text only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_provider_lists_the_servers_models_for_the_model_field() {
    use crate::providers_openai::provider_config;
    use bumblehive::config::Config;
    use bumblehive::service::{RuntimeService, ServiceOptions};

    let app = axum::Router::new().route(
        "/v1/models",
        axum::routing::get(|| async {
            axum::Json(json!({"object": "list", "data": [
                {"id": "qwen2.5-coder", "object": "model"},
                {"id": "llama3.2", "object": "model"}
            ]}))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let mut config = Config::default();
    // The named model is not one it has: the test fails, and the list says what it has.
    config.providers.insert(
        "lister".into(),
        provider_config("openai", format!("http://{addr}/v1"), "wrong-model"),
    );
    let dir = tempfile::tempdir().unwrap();
    let service = RuntimeService::new(ServiceOptions {
        data_dir: dir.path().join("data"),
        config_path: None,
        config: Some(config),
        provider_factory: bumblehive::providers::factory(),
        tools: None,
    })
    .unwrap();
    let tested = dispatch(&service, "test_provider", json!({"name": "lister"}))
        .await
        .unwrap();
    assert_eq!(tested["ok"], false, "{tested}");
    assert_eq!(
        tested["models"],
        json!(["qwen2.5-coder", "llama3.2"]),
        "{tested}"
    );
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_provider_sends_one_tiny_request_and_says_what_failed() {
    use crate::mock_llm::{MockLlm, MockResponse, anthropic, openai};
    use crate::providers_openai::provider_config;
    use bumblehive::config::Config;
    use bumblehive::service::{RuntimeService, ServiceOptions};

    let good = MockLlm::start().await;
    good.push_sse(openai::text_answer(&["OK"], (5, 1)));
    let locked = MockLlm::start().await;
    locked.push(MockResponse::error(
        401,
        r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#,
    ));
    let mut config = Config::default();
    config.providers.insert(
        "local".into(),
        provider_config("openai", format!("{}/v1", good.url()), "small-coder"),
    );
    config.providers.insert(
        "hosted".into(),
        provider_config("openai", format!("{}/v1", locked.url()), "big-model"),
    );
    let claude = MockLlm::start().await;
    claude.push_sse(anthropic::text_answer(&["OK"], 4, 1));
    config.providers.insert(
        "claude".into(),
        provider_config("anthropic", claude.url(), "claude-sonnet-4-5"),
    );
    let ollama = MockLlm::start().await;
    ollama.push(MockResponse::error(
        404,
        r#"{"error":"model \"nope\" not found, try pulling it first"}"#,
    ));
    config.providers.insert(
        "ollama".into(),
        provider_config("openai", format!("{}/v1", ollama.url()), "nope"),
    );
    // A port nothing listens on any more: the connection is refused.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    config.providers.insert(
        "gone".into(),
        provider_config("openai", format!("http://{closed}/v1"), "any"),
    );
    let dir = tempfile::tempdir().unwrap();
    let service = RuntimeService::new(ServiceOptions {
        data_dir: dir.path().join("data"),
        config_path: None,
        config: Some(config),
        provider_factory: bumblehive::providers::factory(),
        tools: None,
    })
    .unwrap();

    let ok = dispatch(&service, "test_provider", json!({"name": "local"}))
        .await
        .unwrap();
    assert_eq!(ok["ok"], true, "{ok}");
    assert_eq!(ok["model"], "small-coder");
    assert_eq!(ok["message"], "");
    assert!(ok["latency_ms"].is_u64(), "{ok}");
    // The request was the tiny one: the model, one user message, one token, no tools.
    let sent = good.bodies();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["model"], "small-coder");
    assert_eq!(sent[0]["max_tokens"], 1, "{}", sent[0]);
    assert_eq!(sent[0]["messages"].as_array().unwrap().len(), 1);
    assert!(sent[0].get("tools").is_none(), "{}", sent[0]);

    let refused = dispatch(&service, "test_provider", json!({"name": "hosted"}))
        .await
        .unwrap();
    assert_eq!(refused["ok"], false, "{refused}");
    assert_eq!(refused["model"], "big-model");
    let message = refused["message"].as_str().unwrap();
    assert!(message.contains("authentication failed"), "{message}");
    assert!(message.contains("Incorrect API key provided"), "{message}");
    assert!(message.contains("Check the API key"), "{message}");
    // A refused key is not retried: one request.
    assert_eq!(locked.requests().len(), 1);

    // The Messages dialect too: its one-token request, answered.
    let ok = dispatch(&service, "test_provider", json!({"name": "claude"}))
        .await
        .unwrap();
    assert_eq!(ok["ok"], true, "{ok}");
    let sent = claude.bodies();
    assert_eq!(sent[0]["max_tokens"], 1, "{}", sent[0]);
    assert_eq!(sent[0]["model"], "claude-sonnet-4-5");
    assert_eq!(claude.requests()[0].path, "/v1/messages");

    let missing = dispatch(&service, "test_provider", json!({"name": "ollama"}))
        .await
        .unwrap();
    assert_eq!(missing["ok"], false, "{missing}");
    let message = missing["message"].as_str().unwrap();
    assert!(message.contains("model \"nope\" not found"), "{message}");
    assert!(message.contains("Check the model name"), "{message}");

    let gone = dispatch(&service, "test_provider", json!({"name": "gone"}))
        .await
        .unwrap();
    assert_eq!(gone["ok"], false, "{gone}");
    let message = gone["message"].as_str().unwrap();
    assert!(message.contains("no model server is running"), "{message}");

    let err = dispatch(&service, "test_provider", json!({"name": "nobody"}))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "invalid_argument");
    assert!(err.to_string().contains("nobody"), "{err}");
    assert!(err.to_string().contains("local"), "{err}");
    // A key for a server that does not exist is refused before the keyring is touched.
    let err = dispatch(
        &service,
        "set_api_key",
        json!({"key": "sk-new", "provider": "nobody"}),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "invalid_argument");
    service.shutdown().await;
}

/// Security finding 11 through the command table: `/`, the home folder itself and system
/// folders are refused as a new session's workspace, and `submit`'s workspace override
/// gets the same checks (it was not checked at all); nothing is created or run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_refuse_root_home_and_system_folders_as_workspaces_and_overrides() {
    let fx = Delegation::new();
    let home = std::env::var("HOME").unwrap();
    let before = fx.service.list_sessions(None).unwrap().len();
    for bad in ["/", home.as_str(), "/etc", "/usr"] {
        let err = dispatch(&fx.service, "create_session", json!({"workspace": bad}))
            .await
            .unwrap_err();
        assert_eq!(err.code(), "invalid_argument", "{bad}: {err}");
    }
    assert_eq!(fx.service.list_sessions(None).unwrap().len(), before);
    let dir = tempfile::tempdir().unwrap();
    let info = dispatch(
        &fx.service,
        "create_session",
        json!({"workspace": dir.path().display().to_string()}),
    )
    .await
    .unwrap();
    let id = info["session_id"].as_str().unwrap().to_string();
    for bad in ["/", home.as_str(), "/etc"] {
        let err = dispatch(
            &fx.service,
            "submit",
            json!({"session_id": id, "content": "hi", "config": {"runtime": {"workspace": bad}}}),
        )
        .await
        .unwrap_err();
        assert_eq!(err.code(), "invalid_argument", "{bad}: {err}");
    }
    assert!(fx.service.store().load(&id).unwrap().messages.is_empty());
    fx.shutdown().await;
}
