//! Diffing a dict's keys between cells without building sets.
//!
//! A CPython dict iterates in insertion order, and an existing key keeps its place when its
//! value changes. So after a cell the keys are: the old keys that survived, in their old
//! order, then the new keys. The snapshot holds strong references to the old keys (so their
//! addresses cannot be reused) and one walk with `PyDict_Next` compares pointers against it:
//! O(n) pointer compares, no hashing, no allocation in the steady state (two buffers are
//! swapped). Strings are made only for names that changed. A key deleted and re-added in the
//! same cell shows up on both sides and is dropped from both.
//!
//! Between two cells the snapshot is the state at the end of the last one, so a background
//! thread that binds a name between cells is reported with the next cell.
//!
//! The same walk finds names *rebound*: each key's value is remembered by address (no
//! reference is held, so a deleted object is freed as usual) and compared. A name bound to a
//! new object is rebound whatever bound it (an assignment, a function's `global`, `exec`).
//! The one blind spot is an object freed and a new one made at the same address within one
//! cell (`x = None` then `x = [2]`): possible, since an address is all that is compared.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Strong references to a dict's keys, in iteration order.
#[derive(Debug, Default)]
pub struct KeyDiff {
    keys: Vec<*mut ffi::PyObject>,
    /// The value of each key, by address only (never dereferenced, no reference held).
    values: Vec<*mut ffi::PyObject>,
    next: Vec<*mut ffi::PyObject>,
    next_values: Vec<*mut ffi::PyObject>,
    added: Vec<*mut ffi::PyObject>,
    removed: Vec<*mut ffi::PyObject>,
    /// Kept keys whose value changed (borrowed from `keys`).
    rebound: Vec<*mut ffi::PyObject>,
    dunders: usize,
}

// SAFETY: the raw pointers are only dereferenced or reference-counted with the GIL held
// (every method takes `Python`).
unsafe impl Send for KeyDiff {}

use flowrepl_exec::setup::is_dunder;

fn key_name(py: Python<'_>, key: *mut ffi::PyObject) -> String {
    // SAFETY: `key` is a live object (we hold a reference) and the GIL is held.
    let obj = unsafe { Bound::from_borrowed_ptr(py, key) };
    match obj.cast::<pyo3::types::PyString>() {
        Ok(s) => s.to_string_lossy().into_owned(),
        Err(_) => obj
            .repr()
            .map(|r| r.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "<unrepresentable key>".to_owned()),
    }
}

impl KeyDiff {
    /// Names in the snapshot that are not `__dunder__`.
    pub fn non_dunder_len(&self) -> usize {
        self.keys.len() - self.dunders
    }

    /// Compares `dict` with the snapshot, appends the names added and removed (each sorted),
    /// and makes `dict`'s keys the new snapshot. With `rebound`, also the names (not
    /// `__dunder__`) kept with another value, sorted.
    pub fn update(
        &mut self,
        py: Python<'_>,
        dict: &Bound<'_, PyDict>,
        added: &mut Vec<String>,
        removed: &mut Vec<String>,
        mut rebound: Option<&mut Vec<String>>,
    ) {
        let d = dict.as_ptr();
        let mut i = 0;
        let mut pos: ffi::Py_ssize_t = 0;
        let mut key: *mut ffi::PyObject = std::ptr::null_mut();
        let mut value: *mut ffi::PyObject = std::ptr::null_mut();
        // Becomes true at the first snapshot key found gone. Until then the walk only reads
        // (an unchanged prefix) or appends (new keys after all old ones); from then on the
        // new snapshot is built in `next`.
        let mut rebuilding = false;
        // SAFETY: GIL held; PyDict_Next yields borrowed pointers and runs no Python code, so
        // the dict cannot change during the walk. Each old key's reference stays in `keys`,
        // moves to `next` (kept) or to `removed` (released below); new keys get a fresh one.
        unsafe {
            while ffi::PyDict_Next(d, &mut pos, &mut key, &mut value) != 0 {
                if i < self.keys.len() && self.keys[i] == key {
                    if self.values[i] != value {
                        self.rebound.push(key);
                        self.values[i] = value;
                    }
                    if rebuilding {
                        self.next.push(key);
                        self.next_values.push(value);
                    }
                    i += 1;
                    continue;
                }
                if i < self.keys.len() {
                    if !rebuilding {
                        rebuilding = true;
                        self.next.clear();
                        self.next.extend_from_slice(&self.keys[..i]);
                        self.next_values.clear();
                        self.next_values.extend_from_slice(&self.values[..i]);
                    }
                    // Old keys before this one in the snapshot are gone (survivors keep
                    // their order, and new keys come after all of them).
                    while i < self.keys.len() && self.keys[i] != key {
                        self.removed.push(self.keys[i]);
                        i += 1;
                    }
                    if i < self.keys.len() {
                        if self.values[i] != value {
                            self.rebound.push(key);
                        }
                        self.next.push(key);
                        self.next_values.push(value);
                        i += 1;
                        continue;
                    }
                }
                ffi::Py_INCREF(key);
                self.added.push(key);
                if rebuilding {
                    self.next.push(key);
                    self.next_values.push(value);
                } else {
                    self.values.push(value);
                }
            }
        }
        if i < self.keys.len() {
            // Trailing snapshot keys are gone.
            if !rebuilding {
                rebuilding = true;
                self.next.clear();
                self.next.extend_from_slice(&self.keys[..i]);
                self.next_values.clear();
                self.next_values.extend_from_slice(&self.values[..i]);
            }
            self.removed.extend_from_slice(&self.keys[i..]);
        }
        if rebuilding {
            std::mem::swap(&mut self.keys, &mut self.next);
            std::mem::swap(&mut self.values, &mut self.next_values);
            self.next.clear();
            self.next_values.clear();
        } else {
            self.keys.extend_from_slice(&self.added);
        }
        if let Some(out) = rebound.as_deref_mut() {
            // Before anything is released: these keys are in `keys`, so alive.
            let r0 = out.len();
            for &k in &self.rebound {
                let name = key_name(py, k);
                if !is_dunder(&name) {
                    out.push(name);
                }
            }
            out[r0..].sort_unstable();
        }
        self.rebound.clear();
        if self.added.is_empty() && self.removed.is_empty() {
            return;
        }
        // Python code (a key's __repr__, a __del__) may run from here on: the walk is over.
        let (a0, r0) = (added.len(), removed.len());
        for &k in &self.added {
            added.push(key_name(py, k));
        }
        for &k in &self.removed {
            removed.push(key_name(py, k));
        }
        self.added.clear();
        for k in self.removed.drain(..) {
            // SAFETY: we owned this reference.
            unsafe { ffi::Py_DECREF(k) };
        }
        let mut new_a = added.split_off(a0);
        let mut new_r = removed.split_off(r0);
        new_a.sort_unstable();
        new_r.sort_unstable();
        let dunders_gone = new_r.iter().filter(|n| is_dunder(n)).count();
        let dunders_new = new_a.iter().filter(|n| is_dunder(n)).count();
        self.dunders = self.dunders + dunders_new - dunders_gone;
        if !new_a.is_empty() && !new_r.is_empty() {
            // Deleted and bound again in the same cell: neither added nor removed.
            let in_both = |n: &String, other: &[String]| other.binary_search(n).is_ok();
            let a_copy = new_a.clone();
            if let Some(out) = rebound {
                // ... but bound to another object.
                let r0 = out.len();
                out.extend(
                    a_copy
                        .iter()
                        .filter(|n| in_both(n, &new_r) && !is_dunder(n))
                        .cloned(),
                );
                if out.len() > r0 {
                    out.sort_unstable(); // with the kept ones found above
                }
            }
            new_a.retain(|n| !in_both(n, &new_r));
            new_r.retain(|n| !in_both(n, &a_copy));
        }
        added.append(&mut new_a);
        removed.append(&mut new_r);
    }

    /// Drops every reference. Needs the GIL.
    pub fn clear(&mut self, _py: Python<'_>) {
        for k in self.keys.drain(..) {
            // SAFETY: we owned this reference and the GIL is held.
            unsafe { ffi::Py_DECREF(k) };
        }
        self.values.clear();
        self.dunders = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    use crate::interpreter::test_python as python;

    /// A small deterministic PRNG (xorshift), so failures are reproducible.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn keys(d: &Bound<'_, PyDict>) -> BTreeSet<String> {
        d.keys()
            .iter()
            .map(|k| k.extract::<String>().unwrap())
            .collect()
    }

    #[test]
    fn matches_a_set_diff_under_random_changes() {
        python();
        Python::attach(|py| {
            let d = PyDict::new(py);
            let mut snap = KeyDiff::default();
            let (mut a, mut r) = (Vec::new(), Vec::new());
            snap.update(py, &d, &mut a, &mut r, None);
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
            for round in 0..2_000 {
                let before = keys(&d);
                // A "cell": a few inserts, deletes, value updates and re-inserts.
                for _ in 0..rng.below(6) {
                    let name = format!("k{}", rng.below(40));
                    match rng.below(4) {
                        0 | 1 => d.set_item(&name, round).unwrap(),
                        2 => {
                            let _ = d.del_item(&name);
                        }
                        _ => {
                            if d.contains(&name).unwrap() {
                                d.del_item(&name).unwrap();
                                d.set_item(&name, -1).unwrap(); // moves to the end
                            }
                        }
                    }
                }
                if rng.below(50) == 0 {
                    d.clear();
                }
                let after = keys(&d);
                let (mut added, mut removed) = (Vec::new(), Vec::new());
                snap.update(py, &d, &mut added, &mut removed, None);
                let want_added: Vec<String> = after.difference(&before).cloned().collect();
                let want_removed: Vec<String> = before.difference(&after).cloned().collect();
                assert_eq!(added, want_added, "round {round}");
                assert_eq!(removed, want_removed, "round {round}");
                assert_eq!(snap.non_dunder_len(), after.len(), "round {round}");
            }
            snap.clear(py);
        });
    }

    #[test]
    fn finds_names_bound_to_another_object() {
        python();
        Python::attach(|py| {
            let d = PyDict::new(py);
            let list = || pyo3::types::PyList::empty(py);
            for k in ["a", "b", "c", "d", "__x__"] {
                d.set_item(k, list()).unwrap();
            }
            let mut snap = KeyDiff::default();
            let (mut a, mut r, mut rb) = (Vec::new(), Vec::new(), Vec::new());
            snap.update(py, &d, &mut a, &mut r, Some(&mut rb));
            assert!(rb.is_empty());
            let keep = d.get_item("a").unwrap().unwrap();
            // a: the same object again; b: another; c: deleted and bound again (moves to
            // the end); d: deleted; e: new; a dunder rebound is not reported.
            d.set_item("a", keep).unwrap();
            d.set_item("b", list()).unwrap();
            d.del_item("c").unwrap();
            d.set_item("c", list()).unwrap();
            d.del_item("d").unwrap();
            d.set_item("e", list()).unwrap();
            d.set_item("__x__", list()).unwrap();
            let (mut a, mut r, mut rb) = (Vec::new(), Vec::new(), Vec::new());
            snap.update(py, &d, &mut a, &mut r, Some(&mut rb));
            assert_eq!(
                (a, r, rb),
                (
                    vec!["e".to_owned()],
                    vec!["d".to_owned()],
                    vec!["b".to_owned(), "c".to_owned()]
                )
            );
            // Nothing changed: nothing reported; then a rebind in a prefix-only cell.
            let (mut a, mut r, mut rb) = (Vec::new(), Vec::new(), Vec::new());
            snap.update(py, &d, &mut a, &mut r, Some(&mut rb));
            assert!(a.is_empty() && r.is_empty() && rb.is_empty());
            d.set_item("e", list()).unwrap();
            snap.update(py, &d, &mut a, &mut r, Some(&mut rb));
            assert_eq!(rb, ["e"]);
            snap.clear(py);
        });
    }

    #[test]
    fn counts_dunders_apart_and_reports_non_string_keys() {
        python();
        Python::attach(|py| {
            let d = PyDict::new(py);
            d.set_item("__name__", "m").unwrap();
            d.set_item("x", 1).unwrap();
            let mut snap = KeyDiff::default();
            let (mut a, mut r) = (Vec::new(), Vec::new());
            snap.update(py, &d, &mut a, &mut r, None);
            assert_eq!(a, ["__name__", "x"]);
            assert_eq!(snap.non_dunder_len(), 1);
            d.set_item(7, "int key").unwrap();
            d.del_item("__name__").unwrap();
            let (mut a, mut r) = (Vec::new(), Vec::new());
            snap.update(py, &d, &mut a, &mut r, None);
            assert_eq!(a, ["7"]);
            assert_eq!(r, ["__name__"]);
            assert_eq!(snap.non_dunder_len(), 2);
            snap.clear(py);
        });
    }
}
