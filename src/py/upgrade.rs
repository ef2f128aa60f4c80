//! Deploying new code under runs in flight (OPS-1, OPS-3): the reads of
//! `compose versions` and `compose upgrade`, and the re-stamp of a run
//! whose journal replayed cleanly under the imported code.

use super::errors::IntoPy;
use super::store::PyStore;
use crate::owner::lease_is_live;
use crate::store::upgrade::{UpgradeOutcome, UpgradeRequest};
use pyo3::prelude::*;

type VersionTuple = (String, Option<String>, i64, i64, i64, f64);
type CandidateTuple = (String, String, String, Option<String>, Option<String>);

/// Per flow and fingerprint, the flow runs not settled yet: `(flow,
/// fingerprint, queued, running, paused, newest created_at)`, by flow, newest
/// first.
#[pyfunction]
pub fn code_versions(py: Python<'_>, store: &PyStore) -> PyResult<Vec<VersionTuple>> {
    let rows = py.allow_threads(|| store.inner.code_versions()).py_err()?;
    Ok(rows
        .into_iter()
        .map(|r| {
            (
                r.flow,
                r.fingerprint,
                r.queued,
                r.running,
                r.paused,
                r.newest,
            )
        })
        .collect())
}

/// `(run_id, flow, status, fingerprint, queue)` of the runs an upgrade to the
/// code in `flows` (`(name, fingerprint)`) considers: not settled and
/// stored with another fingerprint, or failed by a divergence; created at
/// or after `since`, oldest first.
#[pyfunction]
#[pyo3(signature = (store, flows, since=None))]
pub fn upgrade_candidates(
    py: Python<'_>,
    store: &PyStore,
    flows: Vec<(String, String)>,
    since: Option<f64>,
) -> PyResult<Vec<CandidateTuple>> {
    let rows = py
        .allow_threads(|| store.inner.upgrade_candidates(&flows, since))
        .py_err()?;
    Ok(rows
        .into_iter()
        .map(|c| (c.run_id, c.flow, c.status, c.fingerprint, c.queue))
        .collect())
}

/// Re-stamps run `run_id` from fingerprint `from_fp` to `to_fp` in one
/// transaction, when it still has the `status` and the `journal_rows`
/// journal rows its replay checked and no live attempt holds it. Returns
/// `("upgraded", status now)`, `("already", "")` (another process upgraded
/// it to this code) or `("refused", reason)`.
#[pyfunction]
pub fn upgrade_run(
    py: Python<'_>,
    store: &PyStore,
    run_id: &str,
    from_fp: Option<&str>,
    to_fp: &str,
    status: &str,
    journal_rows: i64,
) -> PyResult<(&'static str, String)> {
    let req = UpgradeRequest {
        run_id,
        from: from_fp,
        to: to_fp,
        status,
        journal_rows,
        at: crate::time::now(),
        due_at: crate::clock::now(),
    };
    let outcome = py
        .allow_threads(|| store.inner.upgrade_run(&req, &lease_is_live))
        .py_err()?;
    Ok(match outcome {
        UpgradeOutcome::Upgraded(status) => ("upgraded", status),
        UpgradeOutcome::AlreadyUpgraded => ("already", String::new()),
        UpgradeOutcome::Refused(reason) => ("refused", reason),
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    for f in [
        wrap_pyfunction!(code_versions, m)?,
        wrap_pyfunction!(upgrade_candidates, m)?,
        wrap_pyfunction!(upgrade_run, m)?,
    ] {
        m.add_function(f)?;
    }
    Ok(())
}
