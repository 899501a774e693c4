//! Which imports a cell made: the `sys.modules` baseline, and the modules the executor's
//! own code imported.

use super::Executor;
use pyo3::prelude::*;

impl Executor {
    pub(super) fn rebaseline(&mut self, py: Python<'_>) {
        let mut scratch = (Vec::new(), Vec::new());
        let globals = self.globals.bind(py).clone();
        self.var_keys
            .update(py, &globals, &mut scratch.0, &mut scratch.1, None);
        self.rebaseline_modules(py);
    }

    /// Modules the executor's own code imported (pickle, json, cloudpickle and what it needs;
    /// what unpickling needed) join the baseline, and are remembered: a later cell whose
    /// `import` statement names one still reports it in `added_imports`.
    pub(super) fn absorb_own_imports(&mut self, py: Python<'_>) {
        let mut added = Vec::new();
        let modules = self.modules.bind(py).clone();
        self.module_keys
            .update(py, &modules, &mut added, &mut Vec::new(), None);
        self.own_imports.extend(added);
    }

    /// Adds to `added_imports` the modules the cell's `import` statements name that the
    /// executor's own code had imported first (so that the diff of `sys.modules` misses them).
    pub(super) fn claim_own_imports(&mut self, code: &str, added: &mut Vec<String>) {
        if self.own_imports.is_empty() || !code.contains("import") {
            return;
        }
        for name in flowrepl_exec::cell::imported_modules(code) {
            let mut end = name.len();
            loop {
                let module = &name[..end];
                if self.own_imports.remove(module) && !added.iter().any(|a| a == module) {
                    added.push(module.to_owned());
                }
                match module.rfind('.') {
                    Some(dot) => end = dot,
                    None => break,
                }
            }
        }
        added.sort();
    }

    pub(super) fn rebaseline_modules(&mut self, py: Python<'_>) {
        let mut scratch = (Vec::new(), Vec::new());
        let modules = self.modules.bind(py).clone();
        self.module_keys
            .update(py, &modules, &mut scratch.0, &mut scratch.1, None);
    }
}
