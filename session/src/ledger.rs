//! What each cell changed in the namespace, so that a restore tells the whole truth.
//!
//! A checkpoint holds the state after one cell (`checkpoint_execution_count`). Cells that ran
//! after it bound, rebound or deleted names whose newer state a restore cannot bring back:
//! the executor's diffs say which (`added_vars`, `rebound_vars`, `removed_vars`). The ledger
//! keeps, per name, the last cell that changed it, and [`Ledger::amend`] adds to a restore's
//! `lost_vars` every name changed after the checkpoint, with the cell that did it.
//!
//! A kernel started with `--resume` has no diffs of the session that wrote the checkpoint:
//! [`Ledger::amend_from_log`] reads them from the task log (that session's cells after the
//! checkpoint, and every cell of the sessions after it).
//!
//! What no diff shows: a change made in place without rebinding (`data.append(1)`), and what
//! the cell that crashed did before it crashed (it never reported).

use flowrepl_protocol::{CellReport, RestoreReport};
use std::collections::HashMap;
use std::path::Path;

/// How a cell changed a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    Bound,
    Rebound,
    Deleted,
}

/// The last change of each name, by execution count.
#[derive(Debug, Default)]
pub struct Ledger {
    changes: HashMap<String, (u64, How)>,
    /// Whose execution counts these are.
    session: String,
}

impl Ledger {
    /// An empty ledger of session `session`.
    pub fn new(session: &str) -> Ledger {
        Ledger {
            changes: HashMap::new(),
            session: session.to_owned(),
        }
    }

    /// Cell `cell` ended with `report`.
    pub fn note(&mut self, cell: u64, report: &CellReport) {
        self.note_names(cell, &report.added_vars, How::Bound);
        self.note_names(cell, &report.rebound_vars, How::Rebound);
        self.note_names(cell, &report.removed_vars, How::Deleted);
    }

    fn note_names(&mut self, cell: u64, names: &[String], how: How) {
        // `__warningregistry__` and the like are the interpreter's, not the session's.
        for n in names.iter().filter(|n| !flowrepl_exec::setup::is_dunder(n)) {
            match self.changes.get_mut(n.as_str()) {
                Some(c) => *c = (cell, how),
                None => {
                    self.changes.insert(n.clone(), (cell, how));
                }
            }
        }
    }

    /// The namespace became a checkpoint's: nothing changed since.
    pub fn forget(&mut self) {
        self.changes.clear();
    }

    /// Adds to `r.lost_vars` every name changed after the checkpoint (when the checkpoint is
    /// this session's; see [`Ledger::amend_from_log`] otherwise).
    pub fn amend(&self, r: &mut RestoreReport) {
        let after = match r.checkpoint_session_id.as_deref() {
            Some(s) if s != self.session => 0,
            _ => r.checkpoint_execution_count,
        };
        self.amend_after(r, after);
    }

    fn amend_after(&self, r: &mut RestoreReport, after: u64) {
        let k = r.checkpoint_execution_count;
        for (name, &(cell, how)) in &self.changes {
            if cell <= after || r.lost_vars.contains_key(name) {
                continue;
            }
            let why = match how {
                How::Bound if !r.restored_vars.contains(name) => {
                    format!("bound in cell {cell}, after the checkpoint of cell {k}")
                }
                How::Bound | How::Rebound => format!(
                    "bound again in cell {cell}, after the checkpoint of cell {k}: restored with its value from then"
                ),
                How::Deleted if r.restored_vars.contains(name) => format!(
                    "deleted in cell {cell}, after the checkpoint of cell {k}: it is back with its value from then"
                ),
                How::Deleted => continue,
            };
            r.lost_vars.insert(name.clone(), why);
        }
    }

    /// `--resume`: the changes made after checkpoint `r` by earlier kernels of the task, read
    /// from the task log at `log` (cells of the checkpoint's session after it, and every cell
    /// of the sessions logged after that one), added to `r.lost_vars`. A checkpoint that
    /// does not name its session (written before flowrepl 0.1.1) is left as it is.
    pub fn amend_from_log(r: &mut RestoreReport, log: &Path, me: &str) {
        let Some(writer) = r.checkpoint_session_id.clone() else {
            return;
        };
        let Ok(file) = std::fs::File::open(log) else {
            return;
        };
        let mut ledger = Ledger::new(me);
        // Execution counts restart with each session: number the cells after the checkpoint
        // in log order instead, and say which session's cell it was.
        let mut seen_writer = false;
        let mut order = 0u64;
        let mut label: HashMap<u64, String> = HashMap::new();
        let _ = flowrepl_task_logger::for_each_line(file, |_, line| {
            let Ok(flowrepl_task_logger::Record::Execution(rec)) =
                flowrepl_task_logger::parse_line(line)
            else {
                return;
            };
            let sid: &str = &rec.session_id;
            let counts = if sid == me {
                false
            } else if sid == writer {
                seen_writer = true;
                rec.execution_count > r.checkpoint_execution_count
            } else {
                seen_writer
            };
            if !counts {
                return;
            }
            order += 1;
            let mut report = CellReport::new(flowrepl_protocol::Mode::InProcess);
            report.added_vars = rec.added_vars.to_vec();
            report.rebound_vars = rec.rebound_vars.to_vec();
            report.removed_vars = rec.removed_vars.to_vec();
            ledger.note(order, &report);
            let who = if sid == writer {
                String::new()
            } else {
                format!(" of session {}", sid.get(..8).unwrap_or(sid))
            };
            label.insert(order, format!("{}{who}", rec.execution_count));
        });
        let before = r.lost_vars.clone();
        ledger.amend_after(r, 0);
        // Name the cells as the log does, not by their order here.
        for (name, why) in r.lost_vars.iter_mut() {
            if before.contains_key(name) {
                continue;
            }
            let (cell, _) = ledger.changes[name.as_str()];
            *why = why.replacen(
                &format!("cell {cell},"),
                &format!("cell {},", label[&cell]),
                1,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(added: &[&str], rebound: &[&str], removed: &[&str]) -> CellReport {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect();
        let mut r = CellReport::new(flowrepl_protocol::Mode::Worker);
        (r.added_vars, r.rebound_vars, r.removed_vars) = (v(added), v(rebound), v(removed));
        r
    }

    fn restored(count: u64, names: &[&str], session: &str) -> RestoreReport {
        RestoreReport {
            restored: true,
            checkpoint: "auto".into(),
            checkpoint_execution_count: count,
            checkpoint_session_id: Some(session.into()),
            restored_vars: names.iter().map(|s| s.to_string()).collect(),
            ..RestoreReport::default()
        }
    }

    #[test]
    fn names_changed_after_the_checkpoint_are_lost_with_their_cell() {
        let mut l = Ledger::new("s1");
        l.note(1, &report(&["a", "c", "d"], &[], &[]));
        l.note(2, &report(&["b"], &["c"], &["d"]));
        l.note(3, &report(&[], &[], &[]));
        let mut r = restored(1, &["a", "c", "d"], "s1");
        l.amend(&mut r);
        let lost: Vec<_> = r.lost_vars.keys().map(String::as_str).collect();
        assert_eq!(lost, ["b", "c", "d"]);
        assert_eq!(
            r.lost_vars["b"],
            "bound in cell 2, after the checkpoint of cell 1"
        );
        assert!(r.lost_vars["c"].starts_with("bound again in cell 2"));
        assert!(r.lost_vars["d"].starts_with("deleted in cell 2"));
        // A checkpoint after every change: nothing lost; a reason already given stays.
        let mut r = restored(2, &["a", "b", "c"], "s1");
        r.lost_vars.insert("a".into(), "a generator".into());
        l.amend(&mut r);
        assert_eq!(r.lost_vars.len(), 1);
        assert_eq!(r.lost_vars["a"], "a generator");
        // After a restore, earlier changes no longer count.
        l.forget();
        let mut r = restored(1, &["a"], "s1");
        l.amend(&mut r);
        assert!(r.complete());
    }
}
