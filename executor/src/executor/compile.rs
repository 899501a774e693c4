//! Compiling a cell from its text: the C API, no AST; a final expression compiled apart.

use super::Executor;
use flowrepl_exec::cell::{split_last_expression, Split};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyCode, PyTuple};
use pyo3::{ffi, intern};
use std::ffi::{c_int, CStr};

/// Whether the compiled `code` holds other code objects (functions, lambdas, classes,
/// generator expressions): code that can run after its cell has ended, so that a later
/// traceback or `inspect.getsource` needs the cell's source.
pub(super) fn holds_code(code: &Bound<'_, PyAny>) -> bool {
    let Ok(consts) = code.getattr(intern!(code.py(), "co_consts")) else {
        return true;
    };
    let Ok(consts) = consts.cast_into::<PyTuple>() else {
        return true;
    };
    consts.iter().any(|c| c.is_instance_of::<PyCode>())
}

// Values from CPython's compile.h (not exported by pyo3-ffi).
pub(super) const PYCF_SOURCE_IS_UTF8: c_int = 0x0100;
pub(super) const PYCF_IGNORE_COOKIE: c_int = 0x0800;

impl Executor {
    /// Compiles `code` into an optional `exec` part and an optional `eval` part.
    #[allow(clippy::type_complexity)]
    pub(super) fn compile<'py>(
        &mut self,
        py: Python<'py>,
        code: &str,
        name: &CStr,
    ) -> PyResult<(Option<Bound<'py, PyAny>>, Option<Bound<'py, PyAny>>)> {
        if code.contains('\0') {
            return Err(PyValueError::new_err(
                "source code string cannot contain null bytes",
            ));
        }
        if let Some(split) = split_last_expression(code) {
            if let Ok(eval) = self.compile_tail(py, &split, name) {
                if split.head.trim().is_empty() {
                    return Ok((None, Some(eval)));
                }
                if let Ok(head) = self.compile_text(py, split.head, name, ffi::Py_file_input) {
                    return Ok((Some(head), Some(eval)));
                }
            }
            // Not an expression after all, or the head does not compile alone: compile the
            // whole cell so that errors read as they would for the cell as written.
            // The failed attempt's exception, if one is still set, is not this cell's.
            drop(PyErr::take(py));
        }
        Ok((
            Some(self.compile_text(py, code, name, ffi::Py_file_input)?),
            None,
        ))
    }

    /// Compiles a split-off final statement as an expression, placed at its original line and
    /// column so that tracebacks point at the right characters. Eval mode rejects indentation
    /// after leading newlines, so a tail that starts mid-line (after `;`) is wrapped in
    /// parentheses, where indentation does not count.
    pub(super) fn compile_tail<'py>(
        &mut self,
        py: Python<'py>,
        split: &Split<'_>,
        name: &CStr,
    ) -> PyResult<Bound<'py, PyAny>> {
        let plain = self.compile_tail_as(py, split, name, split.tail_col > 0);
        // Eval mode rejects a bare starred tuple (`*a, b`), which is a valid expression
        // statement; in parentheses it means the same. (Not with `:=`, which parentheses
        // would turn from a syntax error into an assignment.)
        if plain.is_err()
            && split.tail_col == 0
            && split.tail.contains('*')
            && !split.tail.contains(":=")
        {
            // The first attempt's exception, if one is still set, is not this cell's.
            drop(PyErr::take(py));
            return self.compile_tail_as(py, split, name, true);
        }
        plain
    }

    pub(super) fn compile_tail_as<'py>(
        &mut self,
        py: Python<'py>,
        split: &Split<'_>,
        name: &CStr,
        parenthesized: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let buf = &mut self.source_buf;
        buf.clear();
        if !parenthesized {
            buf.resize(split.tail_line - 1, b'\n');
            buf.extend_from_slice(split.tail.as_bytes());
        } else {
            buf.push(b'(');
            let spaces = if split.tail_line == 1 {
                split.tail_col.saturating_sub(1)
            } else {
                split.tail_col
            };
            buf.resize(buf.len() + split.tail_line - 1, b'\n');
            buf.resize(buf.len() + spaces, b' ');
            buf.extend_from_slice(split.tail.as_bytes());
            buf.extend_from_slice(b"\n)");
        }
        self.compile_buf(py, name, ffi::Py_eval_input)
    }

    pub(super) fn compile_text<'py>(
        &mut self,
        py: Python<'py>,
        src: &str,
        name: &CStr,
        mode: c_int,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.source_buf.clear();
        self.source_buf.extend_from_slice(src.as_bytes());
        self.compile_buf(py, name, mode)
    }

    /// Compiles `source_buf` (NUL appended here).
    pub(super) fn compile_buf<'py>(
        &mut self,
        py: Python<'py>,
        name: &CStr,
        mode: c_int,
    ) -> PyResult<Bound<'py, PyAny>> {
        let buf = &mut self.source_buf;
        buf.push(0);
        let mut flags = ffi::PyCompilerFlags {
            cf_flags: PYCF_SOURCE_IS_UTF8 | PYCF_IGNORE_COOKIE,
            cf_feature_version: self.feature_version,
        };
        // SAFETY: `buf` is NUL-terminated UTF-8 without interior NUL (checked by the caller),
        // `name` is a C string, the GIL is held.
        unsafe {
            let ptr = ffi::Py_CompileStringExFlags(
                buf.as_ptr().cast(),
                name.as_ptr(),
                mode,
                &mut flags,
                -1,
            );
            Bound::from_owned_ptr_or_err(py, ptr)
        }
    }
}
