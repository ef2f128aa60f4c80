//! Deploying new code under runs in flight (OPS-1, OPS-3): what a store
//! reports per code version, which runs a checked upgrade considers, and
//! the re-stamp of a run whose journal replayed cleanly under new code.
//!
//! The re-stamp's decisions are written once here over `UpgradeTx`, which
//! each backend implements on its transaction (the run row locked against
//! a concurrent claim where the store locks rows): in one transaction the
//! run's stored fingerprint becomes the new code's, an `__upgrade__:<n>`
//! journal row records the change, and a run failed by a divergence
//! returns to where it failed from. Nothing is written unless the run is
//! still exactly what the replay checked.

use crate::error::CoreResult;
use crate::store::answer::AnswerTx;
use crate::store::takeover::LeaseCheck;

/// The prefix of the journal rows recording upgrades (`__upgrade__:1`, ...).
pub const UPGRADE_KEY: &str = "__upgrade__:";

/// The stored error type of a run failed by a divergence.
pub const DIVERGED: &str = "NondeterminismError";

/// Statuses of runs not settled yet.
pub const UNSETTLED: [&str; 3] = ["queued", "running", "paused"];

/// One line of `compose versions`: the unsettled runs of one flow stored
/// with one fingerprint.
#[derive(Debug, Clone, PartialEq)]
pub struct VersionRow {
    pub flow: String,
    pub fingerprint: Option<String>,
    pub queued: i64,
    pub running: i64,
    pub paused: i64,
    /// The newest `created_at` among them.
    pub newest: f64,
}

/// A run a checked upgrade considers: unsettled with another fingerprint
/// than the imported code's, or failed by a divergence.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub run_id: String,
    pub flow: String,
    pub status: String,
    pub fingerprint: Option<String>,
    /// The queue of a run started on one.
    pub queue: Option<String>,
}

/// What a re-stamp is told: the run as the replay checked it.
#[derive(Debug, Clone)]
pub struct UpgradeRequest<'a> {
    pub run_id: &'a str,
    /// The fingerprint stored when the replay read the run.
    pub from: Option<&'a str>,
    /// The imported code's fingerprint.
    pub to: &'a str,
    /// The status the replay read.
    pub status: &'a str,
    /// How many journal rows the replay read.
    pub journal_rows: i64,
    /// Wall time, recorded in the `__upgrade__` row.
    pub at: f64,
    /// Engine time: a run restored from a divergence failure is due then.
    pub due_at: f64,
}

/// What a re-stamp did.
#[derive(Debug, Clone, PartialEq)]
pub enum UpgradeOutcome {
    /// Re-stamped; the run's status now.
    Upgraded(String),
    /// Another process re-stamped it to this code first.
    AlreadyUpgraded,
    /// Nothing written: why.
    Refused(String),
}

/// The run row as the re-stamp's transaction reads it.
#[derive(Debug, Clone)]
pub struct UpgradeSeen {
    pub rid: i64,
    pub status: String,
    pub fingerprint: Option<String>,
    pub error_json: Option<String>,
    pub holder: Option<String>,
    pub until: Option<f64>,
}

/// What `upgrade_in` needs of a backend's transaction, besides the
/// journal and interrupt operations `compose answer` uses.
pub trait UpgradeTx: AnswerTx {
    /// The run row, locked for the rest of the transaction where the store
    /// locks rows.
    fn upgrade_seen(&self, run_id: &str) -> CoreResult<Option<UpgradeSeen>>;
    /// How many journal rows the run has.
    fn journal_rows(&self, rid: i64) -> CoreResult<i64>;
    /// How many `__upgrade__` rows the run has.
    fn upgrade_rows(&self, rid: i64) -> CoreResult<i64>;
    /// Sets the run's fingerprint to `to` (and, with `status`, its status,
    /// clearing its error and output), updated at `at`.
    fn restamp(&self, rid: i64, to: &str, status: Option<&str>, at: f64) -> CoreResult<()>;
}

/// The `type` of a stored error record (`{"type", "message"}`).
pub fn error_type(error_json: Option<&str>) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(error_json?).ok()?;
    v.get("type")?.as_str().map(str::to_string)
}

/// Whether a run with this status and error is one a checked upgrade takes.
pub fn upgradable(status: &str, error_json: Option<&str>) -> bool {
    UNSETTLED.contains(&status)
        || (status == "failed" && error_type(error_json).as_deref() == Some(DIVERGED))
}

/// The `__upgrade__` row's value: old and new fingerprint and wall time.
pub fn upgrade_value(from: Option<&str>, to: &str, at: f64) -> String {
    serde_json::json!({"from": from, "to": to, "at": at}).to_string()
}

/// Re-stamps `req.run_id` inside the caller's transaction, when the run is
/// still what the replay checked and no live attempt holds it.
pub fn upgrade_in(
    tx: &dyn UpgradeTx,
    req: &UpgradeRequest<'_>,
    live: LeaseCheck<'_>,
) -> CoreResult<UpgradeOutcome> {
    let Some(seen) = tx.upgrade_seen(req.run_id)? else {
        return Ok(UpgradeOutcome::Refused("no such run".into()));
    };
    let stored = seen.fingerprint.as_deref();
    if stored != req.from {
        if stored == Some(req.to) {
            return Ok(UpgradeOutcome::AlreadyUpgraded);
        }
        return Ok(UpgradeOutcome::Refused(format!(
            "its code version changed while it was checked (now {}) -- run the upgrade again",
            short(stored)
        )));
    }
    if let Some(holder) = &seen.holder {
        if live(holder, seen.until.unwrap_or(0.0)) {
            return Ok(UpgradeOutcome::Refused(format!(
                "executing in another process ({holder}) -- the workers of its code version \
                 continue it; upgrade it once it parks or settles"
            )));
        }
    }
    if seen.status != req.status {
        return Ok(UpgradeOutcome::Refused(format!(
            "it became {} while it was checked -- run the upgrade again",
            seen.status
        )));
    }
    if !upgradable(&seen.status, seen.error_json.as_deref()) {
        return Ok(UpgradeOutcome::Refused(format!(
            "{}: nothing to upgrade",
            seen.status
        )));
    }
    if tx.journal_rows(seen.rid)? != req.journal_rows {
        return Ok(UpgradeOutcome::Refused(
            "its journal grew while it was checked -- run the upgrade again".into(),
        ));
    }
    let n = tx.upgrade_rows(seen.rid)? + 1;
    tx.insert_journal(
        seen.rid,
        &format!("{UPGRADE_KEY}{n}"),
        &upgrade_value(req.from, req.to, req.at),
    )?;
    if seen.status == "failed" {
        // Back to where it failed from: paused on the interrupts still
        // pending, else due now, so a worker continues it (and parks it
        // again on the wait it was on, if that wait is not over).
        tx.restamp(seen.rid, req.to, Some("paused"), req.at)?;
        if tx.pending_left(seen.rid)? == 0 {
            tx.make_due(seen.rid, UPGRADE_KEY.trim_end_matches(':'), req.due_at)?;
        }
        return Ok(UpgradeOutcome::Upgraded("paused".into()));
    }
    tx.restamp(seen.rid, req.to, None, req.at)?;
    Ok(UpgradeOutcome::Upgraded(seen.status))
}

/// A fingerprint as `compose versions` shows it: its first 12 hex digits.
pub fn short(fingerprint: Option<&str>) -> String {
    match fingerprint {
        Some(f) => f.chars().take(12).collect(),
        None => "(none)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unsettled_runs_and_runs_failed_by_a_divergence_are_upgradable() {
        for s in UNSETTLED {
            assert!(upgradable(s, None));
        }
        let diverged = r#"{"type": "NondeterminismError", "message": "x"}"#;
        assert!(upgradable("failed", Some(diverged)));
        assert!(!upgradable("failed", Some(r#"{"type": "ValueError"}"#)));
        assert!(!upgradable("completed", None));
        assert!(!upgradable("cancelled", Some(diverged)));
    }

    #[test]
    fn the_upgrade_row_names_both_versions() {
        let v: serde_json::Value =
            serde_json::from_str(&upgrade_value(Some("aa"), "bb", 12.5)).unwrap();
        assert_eq!(v["from"], "aa");
        assert_eq!(v["to"], "bb");
        assert_eq!(v["at"], 12.5);
        assert_eq!(short(Some("0123456789abcdef")), "0123456789ab");
    }
}
