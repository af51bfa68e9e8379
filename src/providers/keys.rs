//! API keys: where a provider's key comes from (the environment variable `provider.api_key_env` names, or the OS keyring entry `provider.api_key_keyring` names), read so that the key is never logged, stored or shown.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::config::ProviderConfig;
use crate::provider::ProviderError;

/// The keyring "service" every Bumblehive key is filed under; the entry name is the
/// keyring "username" (`secret-tool store --label=… service bumblehive username NAME`).
pub const KEYRING_SERVICE: &str = "bumblehive";

/// A locked keyring may wait for an unlock prompt that never comes on a headless box.
const KEYRING_TIMEOUT: Duration = Duration::from_secs(10);

/// A key in memory. Its `Debug` never shows it, so a stray `{:?}` cannot leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    /// The key itself, for the one header that carries it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// Where a provider finds its key. The environment wins when both are named, so a
/// terminal session can override the desktop's stored key.
#[derive(Debug, Clone, Default)]
pub struct KeySource {
    pub env: Option<String>,
    pub keyring: Option<String>,
    /// A key read from the keyring once; the keyring is slow and may prompt.
    cached: Arc<Mutex<Option<ApiKey>>>,
}

impl KeySource {
    pub fn from_config(config: &ProviderConfig) -> Result<Self, ProviderError> {
        let keyring = match config.extra.get("api_key_keyring") {
            None | Some(Value::Null) => None,
            Some(Value::String(name)) if !name.trim().is_empty() => Some(name.trim().to_string()),
            Some(other) => {
                return Err(ProviderError::Config(format!(
                    "provider.api_key_keyring must name a keyring entry, got {other}"
                )));
            }
        };
        let env = config
            .api_key_env
            .as_deref()
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(str::to_string);
        Ok(KeySource {
            env,
            keyring,
            cached: Arc::default(),
        })
    }

    pub fn is_configured(&self) -> bool {
        self.env.is_some() || self.keyring.is_some()
    }

    /// The key, `None` when no source is configured (local servers need none).
    pub async fn resolve(&self) -> Result<Option<ApiKey>, ProviderError> {
        if let Some(name) = &self.env {
            match std::env::var(name) {
                Ok(value) if !value.trim().is_empty() => {
                    return Ok(Some(ApiKey(value.trim().to_string())));
                }
                _ if self.keyring.is_none() => {
                    return Err(ProviderError::Auth(format!(
                        "no API key: the environment variable {name} (provider.api_key_env) is not set"
                    )));
                }
                _ => {}
            }
        }
        let Some(entry) = &self.keyring else {
            return Ok(None);
        };
        if let Some(key) = self
            .cached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Ok(Some(key));
        }
        let key = read_keyring(entry).await?;
        *self.cached.lock().unwrap_or_else(|p| p.into_inner()) = Some(key.clone());
        Ok(Some(key))
    }
}

/// Reads an entry on a thread of its own: the secret-service client blocks on its own
/// executor and deadlocks when called from a tokio worker (keyring's documented caveat).
async fn read_keyring(entry: &str) -> Result<ApiKey, ProviderError> {
    let name = entry.to_string();
    let result = on_keyring_thread(move || {
        keyring::Entry::new(KEYRING_SERVICE, &name).and_then(|e| e.get_password())
    })
    .await?;
    match result {
        Ok(key) if !key.trim().is_empty() => Ok(ApiKey(key.trim().to_string())),
        Ok(_) | Err(keyring::Error::NoEntry) => Err(ProviderError::Auth(format!(
            "no API key in the OS keyring under service \"{KEYRING_SERVICE}\", entry \"{entry}\" (provider.api_key_keyring)"
        ))),
        Err(err) => Err(keyring_unavailable(entry, &err)),
    }
}

/// A secret other than a provider's key (an MCP server's header or env value) from the
/// keyring entry `entry`, with the same thread, timeout and messages.
pub(crate) async fn read_secret(entry: &str) -> Result<String, ProviderError> {
    read_keyring(entry).await.map(|key| key.0)
}

/// Stores a key in the OS keyring under the entry `provider.api_key_keyring` names.
pub async fn store_key_in_keyring(entry: &str, key: &ApiKey) -> Result<(), ProviderError> {
    let name = entry.to_string();
    let secret = key.clone();
    on_keyring_thread(move || {
        keyring::Entry::new(KEYRING_SERVICE, &name).and_then(|e| e.set_password(secret.expose()))
    })
    .await?
    .map_err(|err| keyring_unavailable(entry, &err))
}

/// [`store_key_in_keyring`] for a caller inside a config change (a sync closure under
/// the run gate, `set_api_key`): the keyring is asked on its own thread and given up
/// after [`KEYRING_TIMEOUT`], so a locked keyring cannot hold the gate for longer.
pub(crate) fn store_key_blocking(entry: &str, key: &ApiKey) -> Result<(), ProviderError> {
    use std::sync::mpsc::RecvTimeoutError;
    let name = entry.to_string();
    let secret = key.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("bumblehive-keyring".into())
        .spawn(move || {
            let stored = keyring::Entry::new(KEYRING_SERVICE, &name)
                .and_then(|e| e.set_password(secret.expose()));
            let _ = tx.send(stored);
        })
        .map_err(|err| ProviderError::Auth(format!("cannot reach the OS keyring: {err}")))?;
    match rx.recv_timeout(KEYRING_TIMEOUT) {
        Ok(stored) => stored.map_err(|err| keyring_unavailable(entry, &err)),
        Err(RecvTimeoutError::Disconnected) => Err(ProviderError::Auth(
            "the OS keyring failed while storing the API key".into(),
        )),
        Err(RecvTimeoutError::Timeout) => Err(ProviderError::Auth(format!(
            "the OS keyring did not answer within {} s (is it locked?); set provider.api_key_env instead",
            KEYRING_TIMEOUT.as_secs()
        ))),
    }
}

async fn on_keyring_thread<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ProviderError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("bumblehive-keyring".into())
        .spawn(move || {
            let _ = tx.send(work());
        })
        .map_err(|err| ProviderError::Auth(format!("cannot reach the OS keyring: {err}")))?;
    match tokio::time::timeout(KEYRING_TIMEOUT, rx).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(_)) => Err(ProviderError::Auth(
            "the OS keyring failed while reading the API key".into(),
        )),
        Err(_) => Err(ProviderError::Auth(format!(
            "the OS keyring did not answer within {} s (is it locked?); set provider.api_key_env instead",
            KEYRING_TIMEOUT.as_secs()
        ))),
    }
}

/// No D-Bus session or no Secret Service (a headless box) lands here: say what to do.
fn keyring_unavailable(entry: &str, err: &keyring::Error) -> ProviderError {
    let detail = match err {
        // Its payload is the secret's bytes: never show them.
        keyring::Error::BadEncoding(_) => "the stored key is not UTF-8 text".to_string(),
        other => other.to_string(),
    };
    ProviderError::Auth(format!(
        "the OS keyring is not available for entry \"{entry}\" ({detail}); on Linux it needs a D-Bus session with a Secret Service such as gnome-keyring, or set provider.api_key_env instead"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_key() {
        let key = ApiKey::new("sk-secret-123");
        assert_eq!(format!("{key:?}"), "ApiKey(<redacted>)");
        let source = KeySource {
            cached: Arc::new(Mutex::new(Some(key))),
            ..KeySource::default()
        };
        assert!(!format!("{source:?}").contains("sk-secret"));
    }
}
