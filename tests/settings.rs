//! The busy rule for config changes that touch more than the config file (SPEC §6): `set_api_key` writes the keyring only inside the config change, after its busy check (runtime review 2, R14).
//!
//! The keyring is keyring-rs's own seam (`set_default_credential_builder`): entries
//! named `r14-…` go to a recording store, every other entry to the platform's, so the
//! rest of this binary sees the keyring it always did.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bumblehive::config::Config;
use bumblehive::tools::ToolRegistry;

use crate::lifecycle::{Gated, Then, service_with};
use crate::support::{Flag, receive};

/// The recording store: a write says so on `writing`, then waits (at most a second)
/// for `go` before it counts; what was stored is in `stored`.
struct Recording {
    stored: Arc<Mutex<Vec<String>>>,
    writing: Mutex<mpsc::Sender<()>>,
    go: Arc<Mutex<mpsc::Receiver<()>>>,
}

struct RecordingCredential {
    user: String,
    stored: Arc<Mutex<Vec<String>>>,
    writing: mpsc::Sender<()>,
    go: Arc<Mutex<mpsc::Receiver<()>>>,
}

impl ::keyring::credential::CredentialApi for RecordingCredential {
    fn set_secret(&self, _secret: &[u8]) -> ::keyring::Result<()> {
        let _ = self.writing.send(());
        let _ = self.go.lock().unwrap().recv_timeout(Duration::from_secs(1));
        self.stored.lock().unwrap().push(self.user.clone());
        Ok(())
    }
    fn get_secret(&self) -> ::keyring::Result<Vec<u8>> {
        Err(::keyring::Error::NoEntry)
    }
    fn delete_credential(&self) -> ::keyring::Result<()> {
        Ok(())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl ::keyring::credential::CredentialBuilderApi for Recording {
    fn build(
        &self,
        target: Option<&str>,
        service: &str,
        user: &str,
    ) -> ::keyring::Result<Box<::keyring::credential::Credential>> {
        if !user.starts_with("r14-") {
            return ::keyring::default::default_credential_builder().build(target, service, user);
        }
        Ok(Box::new(RecordingCredential {
            user: user.to_string(),
            stored: self.stored.clone(),
            writing: self.writing.lock().unwrap().clone(),
            go: self.go.clone(),
        }))
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// R14: a run that starts while `set_api_key` stores the key either waits for the whole
/// change (the key stored, the config naming it) or makes it `busy` with the keyring as
/// it was. Before the fix the keyring was written between two busy checks: the run
/// started in that window, the second check said `busy`, and the key was stored anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r14_a_busy_set_api_key_leaves_the_keyring_as_it_was() {
    if std::env::var_os("BUMBLEHIVE_KEYRING_TEST").is_some() {
        eprintln!("skipped: the keyring tier runs against a real Secret Service");
        return;
    }
    let stored = Arc::new(Mutex::new(Vec::new()));
    let (writing_tx, writing) = mpsc::channel();
    let (go, go_rx) = mpsc::channel();
    ::keyring::set_default_credential_builder(Box::new(Recording {
        stored: stored.clone(),
        writing: Mutex::new(writing_tx),
        go: Arc::new(Mutex::new(go_rx)),
    }));
    let dir = tempfile::tempdir().unwrap();
    let release = Flag::new(false);
    let model = {
        let release = release.clone();
        Gated::new(move |_| {
            Then::After(
                release.clone(),
                bumblehive::provider::ModelResponse::text("ok"),
            )
        })
    };
    let service = service_with(
        &dir.path().join("data"),
        model,
        Config::default(),
        ToolRegistry::standard(),
    )
    .unwrap();
    let id = service
        .create_session(dir.path().to_str().unwrap(), None)
        .unwrap()
        .session_id;
    let ctl = service.controller(&id).unwrap();
    let (mut events, _) = ctl.subscribe();
    let entry = format!("r14-{}", uuid::Uuid::new_v4().simple());
    let set = {
        let service = service.clone();
        let entry = entry.clone();
        tokio::spawn(async move { service.set_api_key("sk-r14", Some(entry), None).await })
    };
    // The key is being written: a run starts now (or waits for the change to finish).
    tokio::task::spawn_blocking(move || writing.recv_timeout(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("set_api_key never wrote the keyring");
    let submitted = {
        let ctl = ctl.clone();
        tokio::task::spawn_blocking(move || ctl.submit("hi".into(), None))
    };
    // Give a run that is not held back by the change the time to start.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = go.send(());
    let outcome = set.await.unwrap();
    submitted.await.unwrap().unwrap();
    let stored = stored.lock().unwrap().clone();
    match outcome {
        Ok(config) => {
            assert_eq!(stored, vec![entry.clone()]);
            assert_eq!(config.provider.extra["api_key_keyring"], entry.as_str());
        }
        Err(err) => {
            assert_eq!(err.code(), "busy", "{err}");
            assert!(stored.is_empty(), "a busy set_api_key stored {stored:?}");
            assert!(
                !service
                    .config()
                    .provider
                    .extra
                    .contains_key("api_key_keyring")
            );
        }
    }
    release.set();
    receive(&mut events, "result", Some(&id), None).await;
    service.shutdown().await;
}
