//! Why a cell failed outside Python: the `error.type` values the kernel itself writes (see
//! the "Errors of worker mode" table of `docs/protocol.md`).

use crate::execute::{CellReport, Mode};

/// A failure of the kernel or the worker around a cell, as opposed to an exception the cell
/// raised. Its name is the result's `error.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// The worker ended during the cell (exit code or signal in the message).
    WorkerDied,
    /// The stop ladder killed the worker's process group.
    WorkerKilled,
    /// The cell used more than `FLOWREPL_CPU_SECONDS` of CPU (SIGXCPU).
    CpuLimitExceeded,
    /// Python raised `MemoryError` under `FLOWREPL_MEMORY_MB`.
    MemoryLimitExceeded,
    /// `fork` failed with EAGAIN under `FLOWREPL_MAX_PROCS`.
    ProcessLimitExceeded,
    /// No worker could be started for the cell: it did not run.
    WorkerUnavailable,
    /// In-process, the cell ignored SIGINT for the grace period; it may still be running.
    CellNotStopped,
}

impl Fault {
    /// Every fault, in the order of the docs.
    pub const ALL: [Fault; 7] = [
        Fault::WorkerDied,
        Fault::WorkerKilled,
        Fault::CpuLimitExceeded,
        Fault::MemoryLimitExceeded,
        Fault::ProcessLimitExceeded,
        Fault::WorkerUnavailable,
        Fault::CellNotStopped,
    ];

    /// The name on the wire and in the log (`error.type`, `error_type`).
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::WorkerDied => "WorkerDied",
            Fault::WorkerKilled => "WorkerKilled",
            Fault::CpuLimitExceeded => "CpuLimitExceeded",
            Fault::MemoryLimitExceeded => "MemoryLimitExceeded",
            Fault::ProcessLimitExceeded => "ProcessLimitExceeded",
            Fault::WorkerUnavailable => "WorkerUnavailable",
            Fault::CellNotStopped => "CellNotStopped",
        }
    }

    /// Whether the session's variables are gone after it.
    pub fn loses_state(self) -> bool {
        matches!(
            self,
            Fault::WorkerDied
                | Fault::WorkerKilled
                | Fault::CpuLimitExceeded
                | Fault::WorkerUnavailable
        )
    }

    /// The report of a cell that failed this way: `Type: message` is its error and traceback.
    pub fn report(self, mode: Mode, message: String) -> CellReport {
        CellReport::failed(mode, self.as_str(), message)
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_documented_ones() {
        let docs = include_str!("../../docs/protocol.md");
        for f in Fault::ALL {
            assert!(
                docs.contains(&format!("`{f}`")),
                "{f} is not in docs/protocol.md"
            );
            let r = f.report(Mode::Worker, "why".into());
            let e = r.error.unwrap();
            assert_eq!(
                (e.kind.as_str(), e.traceback.as_str()),
                (f.as_str(), &*format!("{f}: why\n"))
            );
        }
    }
}
