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
