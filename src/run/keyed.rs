//! Starting a run under a caller's run id (OPS-10): the store's unique key
//! on run ids decides which caller creates it; every other caller is
//! handed the run that holds the id.

use super::{claim_in_process, Attempt};
use crate::error::{CoreError, CoreResult};
use crate::journal::Journal;
use crate::owner::{lease_is_live, owner_id};
use crate::store::{KeyedRow, NewRun, RunRow, Store};
use crate::time::now;
use std::sync::Arc;

/// What a start under a caller's run id found.
pub enum Keyed {
    /// The run was created under the id; this attempt executes it.
    New(Box<Attempt>),
    /// A run of the same flow and arguments holds the id; `live` says
    /// whether a live process holds its lease.
    Existing { row: Box<RunRow>, live: bool },
}

impl Attempt {
    /// Creates the run `new` under its caller-chosen id, or finds the run
    /// that already holds it. That run must be of the same kind, name and
    /// encoded arguments, else nothing is stored and the caller is told.
    pub fn start_keyed(store: Arc<dyn Store>, new: NewRun) -> CoreResult<Keyed> {
        crate::ids::check_run_id(&new.run_id).map_err(CoreError::Config)?;
        let seconds = crate::lease::lease_seconds()?;
        match store.create_run_keyed(&new, owner_id(), now() + seconds)? {
            KeyedRow::Created(run) => {
                claim_in_process(&new.run_id)?;
                Ok(Keyed::New(Box::new(Attempt::new(
                    store,
                    run,
                    Journal::default(),
                    true,
                    seconds,
                ))))
            }
            KeyedRow::Exists(row, holder) => {
                same_start(&row, &new)?;
                let live = holder.is_some_and(|(h, until)| lease_is_live(&h, until));
                Ok(Keyed::Existing {
                    row: Box::new(row),
                    live,
                })
            }
        }
    }
}

/// Refuses a start whose id is held by a run of another flow or with other
/// arguments. Arguments are compared as decoded JSON, so keyword order
/// does not matter.
pub fn same_start(row: &RunRow, new: &NewRun) -> CoreResult<()> {
    if row.kind != new.kind || row.name != new.name {
        return Err(CoreError::Config(format!(
            "run '{}' already exists for {} '{}', not {} '{}' -- a run id names one run; pass \
             another run_id",
            row.run_id, row.kind, row.name, new.kind, new.name
        )));
    }
    if !same_args(row.args_json.as_deref(), new.args_json.as_deref()) {
        return Err(CoreError::Config(format!(
            "run '{}' already exists for {} '{}' with other arguments -- a run id names one \
             start of one flow with one set of arguments; pass the same arguments to get that \
             run, or another run_id",
            row.run_id, row.kind, row.name
        )));
    }
    Ok(())
}

fn same_args(stored: Option<&str>, given: Option<&str>) -> bool {
    if stored == given {
        return true;
    }
    let parse = |s: Option<&str>| s.map(serde_json::from_str::<serde_json::Value>);
    match (parse(stored), parse(given)) {
        (Some(Ok(a)), Some(Ok(b))) => a == b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_run(name: &str, args: &str) -> NewRun {
        NewRun {
            run_id: "order-1".into(),
            kind: "flow".into(),
            name: name.into(),
            args_json: Some(args.into()),
            ..Default::default()
        }
    }

    #[test]
    fn same_start_compares_flow_and_decoded_arguments() {
        let row = RunRow {
            run_id: "order-1".into(),
            kind: "flow".into(),
            name: "ship".into(),
            args_json: Some(r#"{"args":[],"kwargs":{"a":1,"b":2}}"#.into()),
            ..Default::default()
        };
        assert!(same_start(
            &row,
            &new_run("ship", r#"{"args":[],"kwargs":{"b":2,"a":1}}"#)
        )
        .is_ok());
        let other = same_start(
            &row,
            &new_run("ship", r#"{"args":[],"kwargs":{"a":2,"b":2}}"#),
        );
        assert!(other.unwrap_err().to_string().contains("other arguments"));
        let flow = same_start(
            &row,
            &new_run("bill", r#"{"args":[],"kwargs":{"a":1,"b":2}}"#),
        );
        assert!(flow.unwrap_err().to_string().contains("not flow 'bill'"));
    }

    #[test]
    fn run_ids_are_checked() {
        assert!(crate::ids::check_run_id("sched:nightly:2026-01-01T00:00:00Z").is_ok());
        assert!(crate::ids::check_run_id("a@b.c/d-e_f").is_ok());
        assert!(crate::ids::check_run_id("").is_err());
        assert!(crate::ids::check_run_id(&"x".repeat(129)).is_err());
        assert!(crate::ids::check_run_id(&"x".repeat(128)).is_ok());
        assert!(crate::ids::check_run_id("a b").is_err());
        assert!(crate::ids::check_run_id("é").is_err());
    }
}
