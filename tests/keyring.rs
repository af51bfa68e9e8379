//! The OS keyring for real: a key stored with `set_api_key` reaches the provider's requests and nothing else. Runs inside a private D-Bus session with gnome-keyring (scripts/keyring-tier.sh); elsewhere it says it is skipped.

use std::sync::Arc;

use bumblehive::config::Config;
use bumblehive::service::{RuntimeService, ServiceOptions};
use serde_json::json;

use crate::mock_llm::{MockLlm, openai};
use crate::support::{WAIT, receive};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyring_key_stored_by_set_api_key_reaches_the_provider_and_nowhere_else() {
    if std::env::var_os("BUMBLEHIVE_KEYRING_TEST").is_none() {
        eprintln!("skipped: run scripts/keyring-tier.sh for a real Secret Service");
        return;
    }
    let key = format!("sk-keyring-{}", uuid::Uuid::new_v4().simple());
    let entry = format!("test-{}", uuid::Uuid::new_v4().simple());
    let mock = MockLlm::start().await;
    mock.push_sse(openai::text_answer(&["hello"], (3, 1)));
    let dir = tempfile::tempdir().unwrap();
    let config = Config::default()
        .patched(&json!({"provider": {"base_url": format!("{}/v1", mock.url()), "model": "m"}}))
        .unwrap();
    let service = RuntimeService::new(ServiceOptions {
        data_dir: dir.path().join("data"),
        config_path: Some(dir.path().join("config.json")),
        config: Some(config),
        provider_factory: Arc::new(bumblehive::providers::provider_from_config),
        tools: None,
    })
    .unwrap();
    let config = service
        .set_api_key(&key, Some(entry.clone()), None)
        .await
        .unwrap();
    assert_eq!(config.provider.extra["api_key_keyring"], entry.as_str());
    let info = service
        .create_session(dir.path().to_str().unwrap(), None)
        .unwrap();
    let ctl = service.controller(&info.session_id).unwrap();
    let (mut events, _) = ctl.subscribe();
    ctl.submit("hi".into(), None).unwrap();
    let result = tokio::time::timeout(
        WAIT,
        receive(&mut events, "result", Some(&info.session_id), None),
    )
    .await
    .unwrap();
    assert_eq!(result["content"], "hello");
    let requests = mock.requests();
    assert_eq!(
        requests[0].header("authorization"),
        Some(format!("Bearer {key}").as_str())
    );
    service.shutdown().await;
    // The key is in no file the app wrote.
    for entry in walk(dir.path()) {
        let text = std::fs::read(&entry).unwrap();
        assert!(
            !String::from_utf8_lossy(&text).contains(&key),
            "the key leaked into {}",
            entry.display()
        );
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}
