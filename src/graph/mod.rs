//! Graph workflows (EXT-20 … EXT-33): the compiled structure and its
//! validation, reducer merging, the step schedule and checkpoint encoding.
//! Python calls the node functions; every decision about state, order and
//! storage is made here.

pub mod checkpoint;
pub mod exec;
pub mod reduce;
pub mod spec;
pub mod threads;

use crate::error::CoreError;
use serde_json::{json, Value};

/// The end of a branch (`END` in Python).
pub const END: &str = "__end__";

/// A graph error with the stable `code` Python exposes as `.code`.
pub fn graph_error(code: &str, message: impl Into<String>, details: Value) -> CoreError {
    CoreError::Graph {
        code: code.to_string(),
        message: message.into(),
        details_json: details.to_string(),
    }
}

/// `graph_error` with no details beyond the code.
pub fn plain_error(code: &str, message: impl Into<String>) -> CoreError {
    graph_error(code, message, json!({}))
}
