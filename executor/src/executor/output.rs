//! A cell's output: fds 1 and 2 from the capture files (or streamed to the sink), and its
//! images.

use super::{CellOutcome, Executor, ImageLimits};
use flowrepl_exec::capture::Collected;
use flowrepl_exec::sink::Streamer;
use flowrepl_protocol::{Image, ImageInfo};
use pyo3::prelude::*;
use pyo3::{ffi, intern};

impl Executor {
    pub(super) fn collect_output(&mut self, py: Python<'_>, out: &mut CellOutcome) {
        if !flush_std_streams(py) {
            // Closed, replaced by something without flush(), or None: the support code
            // puts fresh streams on fds 1 and 2.
            if let Err(e) = self.support.flush_std.bind(py).call0() {
                out.report
                    .warnings
                    .push(format!("flushing sys.stdout/sys.stderr failed: {e}"));
            }
        }
        flowrepl_os::flush_c_stdio();
        if let Some(streamer) = self.streamer.clone() {
            return self.stream_output(&streamer, out);
        }
        for (stream, target, label) in [
            (&mut self.capture.stdout, &mut out.stdout, "stdout"),
            (&mut self.capture.stderr, &mut out.stderr, "stderr"),
        ] {
            let mut bytes = Vec::new();
            match stream.collect(&mut bytes, self.max_output_bytes) {
                Ok(Collected {
                    dropped,
                    restored_fd,
                }) => {
                    if dropped > 0 {
                        out.report.warnings.push(format!(
                            "{label}: {dropped} bytes were dropped from the middle (output limit per cell)"
                        ));
                    }
                    if restored_fd {
                        out.report.warnings.push(format!(
                            "the cell closed or redirected fd {}; it was pointed back at the {label} capture",
                            if label == "stdout" { 1 } else { 2 }
                        ));
                    }
                }
                Err(e) => out
                    .report
                    .warnings
                    .push(format!("reading captured {label} failed: {e}")),
            }
            *target = flowrepl_exec::capture::decode_output(bytes, label, &mut out.report.warnings);
        }
    }

    /// Worker mode: sends the rest of the cell's output to the sink.
    pub(super) fn stream_output(&mut self, streamer: &Streamer, out: &mut CellOutcome) {
        let mut sizes = [0; 2];
        let streams = [&mut self.capture.stdout, &mut self.capture.stderr];
        for (i, (stream, label)) in streams.into_iter().zip(["stdout", "stderr"]).enumerate() {
            match stream.settle() {
                Ok((size, restored)) => {
                    sizes[i] = size;
                    if restored {
                        out.report.warnings.push(format!(
                            "the cell closed or redirected fd {}; it was pointed back at the {label} capture",
                            i + 1
                        ));
                    }
                }
                Err(e) => {
                    sizes[i] = stream.cursor();
                    out.report
                        .warnings
                        .push(format!("reading captured {label} failed: {e}"));
                }
            }
        }
        let finished = streamer.finish(sizes);
        for (f, label) in finished.iter().zip(["stdout", "stderr"]) {
            if f.dropped > 0 {
                out.report.warnings.push(format!(
                    "{label}: {} bytes were dropped from the middle (output limit per cell)",
                    f.dropped
                ));
            }
        }
        self.capture.stdout.advance(sizes[0]);
        self.capture.stderr.advance(sizes[1]);
    }

    /// Renders open matplotlib figures (then closes them) and a final value's
    /// `_repr_png_()`. Costs one dict lookup unless pyplot is loaded or the value has
    /// something to render.
    pub(super) fn collect_images(
        &mut self,
        py: Python<'_>,
        value: Option<&Bound<'_, PyAny>>,
        limits: ImageLimits,
        out: &mut CellOutcome,
    ) {
        let value = value.filter(|v| {
            let t = v.get_type();
            t.hasattr(intern!(py, "_repr_png_")).unwrap_or(false)
                || t.hasattr(intern!(py, "savefig")).unwrap_or(false)
        });
        let pyplot = self
            .modules
            .bind(py)
            .contains(intern!(py, "matplotlib.pyplot"))
            .unwrap_or(false);
        if value.is_none() && !pyplot {
            return;
        }
        let collected = self
            .support
            .collect_images
            .bind(py)
            .call1((value, limits.max_images, limits.max_pixels))
            .and_then(|r| r.extract::<(Vec<(String, String, u32, u32, u64)>, Vec<String>)>());
        match collected {
            Ok((images, notes)) => {
                out.images = images
                    .into_iter()
                    .map(|(source, data, width, height, bytes)| Image {
                        info: ImageInfo {
                            mime: "image/png".into(),
                            width,
                            height,
                            bytes,
                            source,
                        },
                        data,
                    })
                    .collect();
                out.report.warnings.extend(notes);
            }
            Err(e) => out
                .report
                .warnings
                .push(format!("collecting figures failed: {e}")),
        }
    }

    pub(super) fn discard_output(&mut self) {
        let mut sink = Vec::new();
        let _ = self.capture.stdout.collect(&mut sink, u64::MAX);
        let _ = self.capture.stderr.collect(&mut sink, u64::MAX);
        if !sink.is_empty() {
            tracing::debug!(
                bytes = sink.len(),
                "discarded output written during start-up"
            );
        }
    }
}

/// Flushes `sys.stdout` and `sys.stderr` through the C API (no Python frame on the hot path).
/// False if either is missing or its `flush()` raised.
pub(super) fn flush_std_streams(py: Python<'_>) -> bool {
    let mut ok = true;
    for name in [c"stdout", c"stderr"] {
        // SAFETY: GIL held; PySys_GetObject returns a borrowed reference or NULL.
        let stream = unsafe { ffi::PySys_GetObject(name.as_ptr()) };
        if stream.is_null() || stream == py.None().as_ptr() {
            ok = false;
            continue;
        }
        // SAFETY: `stream` is alive (owned by sys) while we hold the GIL.
        let stream = unsafe { Bound::from_borrowed_ptr(py, stream) };
        if stream.call_method0(intern!(py, "flush")).is_err() {
            ok = false;
        }
    }
    ok
}
