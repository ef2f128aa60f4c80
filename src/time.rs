//! Wall-clock time as the stores record it: seconds since the epoch.

use std::time::{SystemTime, UNIX_EPOCH};

/// Wall time in seconds since the epoch (0 before it).
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
