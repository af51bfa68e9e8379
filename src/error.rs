//! Typed errors of the runtime and their mapping to the command table's error codes.

use crate::protocol::ErrorBody;

/// Errors of the runtime that reach a caller of the command table.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("the runtime is busy: {0}")]
    Busy(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Unavailable(String),
    /// Undo refused: files changed since the agent wrote them (`force` overrides).
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Another process owns the data folder (SPEC §12.7).
    #[error(transparent)]
    InUse(#[from] crate::owner::OwnerError),
}

impl RuntimeError {
    /// The stable code of SPEC §9 (`busy`, `not_found`, `invalid_argument`, …).
    pub fn code(&self) -> &'static str {
        match self {
            RuntimeError::Busy(_) => "busy",
            RuntimeError::NotFound(_) => "not_found",
            RuntimeError::InvalidArgument(_) => "invalid_argument",
            RuntimeError::Unavailable(_) => "unavailable",
            RuntimeError::Conflict(_) => "conflict",
            RuntimeError::Store(StoreError::NotFound(_)) => "not_found",
            RuntimeError::Store(_) => "storage",
            RuntimeError::Config(ConfigError::Invalid(_)) => "invalid_argument",
            RuntimeError::Config(_) => "config",
            RuntimeError::InUse(_) => "in_use",
        }
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            code: self.code().to_string(),
            message: self.to_string(),
        }
    }
}

/// Errors of the on-disk session store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("session {0} not found")]
    NotFound(String),
    #[error("session store I/O error at {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("session metadata {path} is not valid: {message}")]
    BadMeta { path: String, message: String },
}

impl StoreError {
    pub fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        StoreError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// Errors of loading, patching or saving the config file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path} does not parse (line {line}, column {column}): {message}")]
    Parse {
        path: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("config file {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config: {0}")]
    Invalid(String),
}
