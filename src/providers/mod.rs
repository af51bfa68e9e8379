//! Model providers over HTTP, chosen by `provider.kind` (placeholder until the providers branch lands).

use std::sync::Arc;

use crate::config::ProviderConfig;
use crate::provider::{ModelProvider, ProviderError};

/// Builds the provider a config names.
pub fn provider_from_config(
    config: &ProviderConfig,
) -> Result<Arc<dyn ModelProvider>, ProviderError> {
    Err(ProviderError::Other(format!(
        "provider kind {:?} is not available in this build",
        config.kind
    )))
}
