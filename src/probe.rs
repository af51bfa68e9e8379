//! Finds local OpenAI-compatible model servers (Ollama, LM Studio) and their models, for the first start with no provider configured.

use std::time::Duration;

use serde::Deserialize;

pub use crate::protocol::FoundServer;

/// The well-known local servers: name and OpenAI-compatible base URL.
pub const KNOWN: &[(&str, &str)] = &[
    ("Ollama", "http://127.0.0.1:11434/v1"),
    ("LM Studio", "http://127.0.0.1:1234/v1"),
];

#[derive(Deserialize)]
struct ModelList {
    data: Vec<ModelEntry>,
}

#[derive(Deserialize)]
struct ModelEntry {
    id: String,
}

/// Asks each candidate's `GET {base_url}/models`; servers that do not answer quickly, or
/// answer something else, are left out.
pub async fn probe(candidates: &[(String, String)]) -> Vec<FoundServer> {
    let Ok(client) = reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(300))
        .timeout(Duration::from_millis(1500))
        .build()
    else {
        return Vec::new();
    };
    let asks = candidates.iter().map(|(name, base_url)| {
        let client = client.clone();
        async move {
            let url = format!("{}/models", base_url.trim_end_matches('/'));
            let response = client.get(&url).send().await.ok()?;
            if !response.status().is_success() {
                return None;
            }
            let list: ModelList = response.json().await.ok()?;
            Some(FoundServer {
                name: name.clone(),
                kind: "openai".into(),
                base_url: base_url.clone(),
                ok: true,
                models: list.data.into_iter().map(|m| m.id).collect(),
            })
        }
    });
    futures::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Probes the well-known local servers.
pub async fn probe_known() -> Vec<FoundServer> {
    let candidates: Vec<(String, String)> = KNOWN
        .iter()
        .map(|(name, url)| (name.to_string(), url.to_string()))
        .collect();
    probe(&candidates).await
}
