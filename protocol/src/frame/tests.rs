//! Every kind round-trips; bad frames are refused; the reader splits a stream.

use super::*;
use crate::execute::{CellReport, Image, VariableInfo};

fn payload(frame: &[u8]) -> &[u8] {
    let len = frame_len(frame[..4].try_into().unwrap()).unwrap();
    assert_eq!(len, frame.len() - 4);
    &frame[4..]
}

fn encoded(frame: &Frame<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    frame.encode(&mut out).unwrap();
    out
}

fn report() -> DoneReport {
    let mut report = CellReport::new(crate::Mode::Worker);
    report.result = Some("2".into());
    report.added_vars = vec!["x".into()];
    report.variable_count = 1;
    report.usage = crate::ResourceUsage {
        pid: 7,
        cpu_ms: 0.5,
        peak_rss_kb: 1000,
    };
    DoneReport {
        report,
        cpu_total_ms: 12.0,
        images: vec![Image {
            info: crate::ImageInfo {
                mime: "image/png".into(),
                width: 2,
                height: 1,
                bytes: 3,
                source: "result".into(),
            },
            data: "AAAA".into(),
        }],
        capture_ends: [10, 20],
        output_in_capture: true,
        checkpoint: Some(crate::CheckpointHealth {
            auto_execution_count: Some(3),
            last_error: None,
            failing: false,
        }),
    }
}

/// One frame of every kind, with bodies that exercise each field form.
fn one_of_each() -> Vec<Frame<'static>> {
    let event = CellEvent {
        name: "step_start".into(),
        data: crate::EventData::from_json(r#"{"n":1}"#.into()).unwrap(),
        timestamp: "2026-11-23T00:00:00.000Z".into(),
        step: Some("outer".into()),
        offset: 12,
    };
    let request = ApprovalRequest {
        approval_id: "4-1".into(),
        message: "go?".into(),
        data: crate::EventData::from_json("{}".into()).unwrap(),
        timeout_s: Some(2.5),
    };
    let answer =
        ApprovalAnswer::without_person("4-1", crate::ApprovalOutcome::Unavailable, "nobody to ask");
    let health = CheckpointHealth {
        auto_execution_count: Some(4),
        last_error: Some(crate::CheckpointFailure {
            execution_count: 5,
            error: "OSError: [Errno 28] No space left on device".into(),
            time: "t".into(),
        }),
        failing: true,
    };
    let listing = VariablesReport {
        variables: vec![VariableInfo {
            name: "df".into(),
            kind: "DataFrame".into(),
            module: Some("pandas.core.frame".into()),
            repr: "   a\n0  1".into(),
            len: Some(1),
            shape: Some(vec![1, 1]),
        }],
        error: None,
    };
    let hello = WorkerHello {
        pid: 12,
        python: crate::PythonInfo {
            python_version: "3.12.1".into(),
            python_executable: "/usr/bin/python3".into(),
            python_prefix: "/usr".into(),
        },
        capture_starts: [1, 2],
        restored: None,
        restore_error: Some("gone".into()),
        sandbox: Some(crate::sandbox::SandboxReport {
            level: "strict".into(),
            network: "none".into(),
            rules: vec![],
            layers: vec![crate::sandbox::SandboxLayer {
                layer: "seccomp".into(),
                enforced: true,
                wanted: true,
                detail: "33 calls denied".into(),
            }],
        }),
    };
    vec![
        Frame::Execute {
            id: 9,
            timeout_ms: 1500,
            execution_count: 4,
            code: "print('é')",
        },
        Frame::Shutdown {},
        Frame::Variables { id: 5 },
        Frame::ApprovalAnswer {
            answer: Cow::Owned(answer),
        },
        Frame::Checkpoint {
            id: 6,
            name: "before-merge",
        },
        Frame::Health { id: 8 },
        Frame::Packages {
            id: 9,
            modules: Cow::Owned(vec!["tinypkg".into(), "tinydep".into()]),
        },
        Frame::Ready {
            hello: Cow::Owned(hello),
        },
        Frame::Output {
            id: 3,
            stream: OutputStream::Stderr,
            bytes: b"\xffab",
        },
        Frame::Done {
            id: 4,
            report: Cow::Owned(report()),
        },
        Frame::VariablesReply {
            id: 5,
            report: Cow::Owned(listing),
        },
        Frame::Event {
            id: 9,
            event: Cow::Owned(event),
        },
        Frame::Context {
            id: 9,
            json: r#"{"a":1}"#,
        },
        Frame::ApprovalRequest {
            id: 9,
            request: Cow::Owned(request),
        },
        Frame::ApprovalEnded {
            id: 9,
            approval_id: "4-1",
        },
        Frame::CheckpointReply {
            id: 6,
            outcome: Cow::Owned(CheckpointOutcome::Failed("disk full".into())),
        },
        Frame::CheckpointReply {
            id: 6,
            outcome: Cow::Owned(CheckpointOutcome::Written(crate::CheckpointSummary {
                checkpoint: "auto".into(),
                execution_count: 3,
                saved: vec!["a".into()],
                unsaved: [("g".to_owned(), "a generator".to_owned())].into(),
                ..Default::default()
            })),
        },
        Frame::HealthReply {
            id: 8,
            health: Cow::Owned(health),
        },
        Frame::PackagesReply {
            id: 9,
            imported: Cow::Owned(vec!["tinypkg".into()]),
        },
    ]
}

#[test]
fn every_kind_round_trips() {
    let frames = one_of_each();
    let mut kinds: Vec<u8> = frames.iter().map(Frame::kind).collect();
    kinds.dedup();
    assert_eq!(kinds, KINDS.iter().map(|k| k.0).collect::<Vec<_>>());
    for frame in &frames {
        let bytes = encoded(frame);
        assert_eq!(bytes[4], frame.kind());
        assert_eq!(&decode(payload(&bytes)).unwrap(), frame);
    }
    assert_eq!(encoded(&Frame::Shutdown {}), [0, 0, 0, 1, kind::SHUTDOWN]);
    // Borrowed to encode, the same bytes.
    let r = report();
    assert_eq!(
        encoded(&Frame::Done {
            id: 4,
            report: Cow::Borrowed(&r)
        }),
        encoded(&Frame::Done {
            id: 4,
            report: Cow::Owned(report())
        })
    );
}

#[test]
fn rejects_bad_frames() {
    assert_eq!(frame_len([0, 0, 0, 0]), Err(FrameError::Empty));
    assert_eq!(
        frame_len([0xff, 0xff, 0xff, 0xff]),
        Err(FrameError::TooLarge(u32::MAX as u64))
    );
    assert_eq!(decode(&[0x7f]), Err(FrameError::UnknownKind(0x7f)));
    assert!(matches!(
        decode(&[kind::OUTPUT, 0, 0]),
        Err(FrameError::Malformed { .. })
    ));
    let mut bad_utf8 = vec![kind::EXECUTE];
    bad_utf8.extend([0; 24]);
    bad_utf8.push(0xff);
    assert!(matches!(
        decode(&bad_utf8),
        Err(FrameError::Malformed {
            kind: kind::EXECUTE,
            ..
        })
    ));
    let mut trailing = vec![kind::VARIABLES];
    trailing.extend([0; 9]);
    assert!(matches!(
        decode(&trailing),
        Err(FrameError::Malformed {
            kind: kind::VARIABLES,
            ..
        })
    ));
    assert!(matches!(
        decode(&[kind::OUTPUT, 0, 0, 0, 0, 0, 0, 0, 1, 3]),
        Err(FrameError::Malformed {
            kind: kind::OUTPUT,
            ..
        })
    ));
}

/// docs/protocol.md's frame table lists every kind, with its byte, name and direction,
/// in the table's order.
#[test]
fn the_docs_table_is_this_table() {
    let doc = include_str!("../../../docs/protocol.md");
    let rows: Vec<(u8, String, Direction)> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `0x"))
        .map(|l| {
            let (code, rest) = l.split_once("` ").unwrap();
            let (name, rest) = rest.split_once(" | ").unwrap();
            let dir = if rest.starts_with("kernel → worker") {
                Direction::ToWorker
            } else {
                assert!(rest.starts_with("worker → kernel"), "{l}");
                Direction::ToKernel
            };
            (u8::from_str_radix(code, 16).unwrap(), name.to_owned(), dir)
        })
        .collect();
    let table: Vec<(u8, String, Direction)> = KINDS
        .iter()
        .map(|&(c, n, d)| (c, n.to_owned(), d))
        .collect();
    assert_eq!(rows, table);
}

/// Hands out its bytes one at a time.
struct Trickle<'a>(&'a [u8]);

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        match (self.0.split_first(), out.first_mut()) {
            (Some((b, rest)), Some(o)) => {
                *o = *b;
                self.0 = rest;
                Ok(1)
            }
            _ => Ok(0),
        }
    }
}

fn output(bytes: &[u8]) -> Frame<'_> {
    Frame::Output {
        id: 1,
        stream: OutputStream::Stdout,
        bytes,
    }
}

#[test]
fn reader_splits_frames_arriving_byte_by_byte() {
    let mut stream = encoded(&output(&[b'a'; 1000]));
    Frame::Done {
        id: 1,
        report: Cow::Owned(report()),
    }
    .encode(&mut stream)
    .unwrap();
    Frame::Shutdown {}.encode(&mut stream).unwrap();
    let mut r = FrameReader::new(Trickle(&stream));
    let mut got = Vec::new();
    while let Some(p) = r.read_frame().unwrap() {
        got.push(match decode(&p).unwrap() {
            Frame::Output { bytes, .. } => bytes.len(),
            Frame::Done { report: d, .. } => {
                assert_eq!(*d, report());
                0
            }
            Frame::Shutdown {} => 1,
            other => panic!("{other:?}"),
        });
    }
    assert_eq!(got, [1000, 0, 1]);
    assert_eq!(r.pending(), 0);
}

#[test]
fn reader_reports_truncation_and_oversized_frames() {
    let mut stream = encoded(&output(b"abc"));
    stream.truncate(stream.len() - 1);
    let mut r = FrameReader::new(&stream[..]);
    assert!(matches!(r.read_frame(), Err(ReadError::Truncated(n)) if n == stream.len()));
    let big = (MAX_FRAME_BYTES + 1).to_be_bytes();
    let mut r = FrameReader::new(&big[..]);
    assert!(matches!(
        r.read_frame(),
        Err(ReadError::Frame(FrameError::TooLarge(n))) if n == MAX_FRAME_BYTES as u64 + 1
    ));
    let mut r = FrameReader::new(&[0u8, 0, 0, 0][..]);
    assert!(matches!(
        r.read_frame(),
        Err(ReadError::Frame(FrameError::Empty))
    ));
}
