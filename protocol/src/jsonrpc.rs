//! JSON-RPC 2.0 envelopes.
//!
//! A request line is parsed in one pass into [`Request`], which borrows `method` and `params`
//! from the line so that a 50 MB `code` string is unescaped once, when the params are typed.
//! Failures are classified the way the spec asks:
//!
//! | input | code |
//! | --- | --- |
//! | not JSON, or not UTF-8 | -32700 parse error, `id: null` |
//! | JSON but not a request object (array, string, `method` missing or not a string, bad `id`) | -32600 invalid request |
//! | unknown method | -32601 |
//! | params of the wrong shape | -32602 |
//!
//! A request without `id` is a notification: it is carried out but never answered.
//! `jsonrpc` may be omitted (older clients); if present it must be `"2.0"`. Batches (JSON arrays)
//! are not supported and get -32600.

use serde::de::Deserializer;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;

/// A JSON-RPC request id: a string, a number, or null.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Id {
    /// A numeric id, kept exactly as sent.
    Number(serde_json::Number),
    /// A string id.
    String(String),
    /// `null`: allowed by the spec, and what error replies carry when the id is unknown.
    Null,
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Id::Number(n) => write!(f, "{n}"),
            Id::String(s) => write!(f, "{s:?}"),
            Id::Null => f.write_str("null"),
        }
    }
}

/// Standard JSON-RPC error codes, plus the kernel's own in the server range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// -32700: the line is not JSON (or not UTF-8).
    ParseError,
    /// -32600: JSON, but not a request object.
    InvalidRequest,
    /// -32601: no such method.
    MethodNotFound,
    /// -32602: the params do not fit the method.
    InvalidParams,
    /// -32603: the kernel failed to carry out a valid request.
    InternalError,
    /// -32001: the request line is longer than the kernel accepts.
    RequestTooLarge,
    /// -32002: a file operation was refused: a path that leads outside the workspace or into
    /// flowrepl's own folder, nothing there, not a regular file, over a limit.
    FileRefused,
    /// -32003: an install was refused or failed: packages are off, a requirement the policy
    /// does not allow, a resolution that failed; the layer is as it was.
    PackagesRefused,
}

impl ErrorCode {
    /// The numeric code sent on the wire.
    pub fn code(self) -> i64 {
        match self {
            ErrorCode::ParseError => -32700,
            ErrorCode::InvalidRequest => -32600,
            ErrorCode::MethodNotFound => -32601,
            ErrorCode::InvalidParams => -32602,
            ErrorCode::InternalError => -32603,
            ErrorCode::RequestTooLarge => -32001,
            ErrorCode::FileRefused => -32002,
            ErrorCode::PackagesRefused => -32003,
        }
    }
}

/// An error reply: the `error` member of a response, with the id to answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message} ({})", code.code())]
pub struct RpcError {
    /// What kind of failure.
    pub code: ErrorCode,
    /// A sentence for people.
    pub message: String,
    /// The id of the request, when it could be read; `None` answers with `id: null`.
    pub id: Option<Id>,
}

impl RpcError {
    /// An error of `code` with `message`, not yet tied to an id.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
            id: None,
        }
    }

    /// The same error, answering request `id`.
    pub fn with_id(mut self, id: Option<Id>) -> Self {
        self.id = id;
        self
    }

    /// A request line of `len` bytes over the `limit` (`FLOWREPL_MAX_REQUEST_BYTES`).
    pub fn request_too_large(len: u64, limit: usize) -> Self {
        RpcError::new(
            ErrorCode::RequestTooLarge,
            format!(
                "request too large: {len} bytes (limit {limit}; see FLOWREPL_MAX_REQUEST_BYTES)"
            ),
        )
    }
}

/// How much of an over-long request line is kept to find its id ([`id_in_prefix`]).
pub const ID_SEARCH_BYTES: usize = 64 << 10;

/// A request line over the limit, as both fronts' readers keep it while they read it to its
/// end: its length, and its first [`ID_SEARCH_BYTES`] (where a client writes the `id`), never
/// more, so memory stays bounded however long the line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OversizedLine {
    /// Bytes of the line so far.
    pub len: u64,
    /// Its head.
    pub head: Vec<u8>,
}

impl OversizedLine {
    /// A line found over the limit, whose bytes so far are `start`.
    pub fn new(start: &[u8]) -> OversizedLine {
        let mut line = OversizedLine::default();
        line.push(start);
        line
    }

    /// More of the line.
    pub fn push(&mut self, more: &[u8]) {
        self.len += more.len() as u64;
        self.keep(more);
    }

    fn keep(&mut self, bytes: &[u8]) {
        let room = ID_SEARCH_BYTES.saturating_sub(self.head.len());
        self.head.extend_from_slice(&bytes[..room.min(bytes.len())]);
    }

    /// The answer both fronts give it: -32001, with the request's id when its head holds it.
    pub fn error(&self, limit: usize) -> RpcError {
        RpcError::request_too_large(self.len, limit).with_id(id_in_prefix(&self.head))
    }
}

/// The `id` of a request from the first bytes of its line (which may end anywhere), when the
/// id comes before the cut: clients write `jsonrpc`, `id` and `method` before `params`.
pub fn id_in_prefix(prefix: &[u8]) -> Option<Id> {
    use serde::de::{IgnoredAny, MapAccess, Visitor};
    struct Find<'a>(&'a mut Option<Id>);
    impl<'de> Visitor<'de> for Find<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON-RPC request object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if key == "id" {
                    *self.0 = Some(map.next_value::<Id>()?);
                    return Ok(());
                }
                map.next_value::<IgnoredAny>()?;
            }
            Ok(())
        }
    }
    let mut found = None;
    let mut de = serde_json::Deserializer::from_slice(prefix);
    // A cut line fails to parse after the id was seen (or before: then there is none).
    let _ = serde::Deserializer::deserialize_map(&mut de, Find(&mut found));
    found
}

/// One parsed request line. `method` and `params` borrow from the line.
#[derive(Debug)]
pub struct Request<'a> {
    /// `None` for a notification (no `id` member): carried out, never answered.
    pub id: Option<Id>,
    /// The method name.
    pub method: Cow<'a, str>,
    /// The raw params, typed later by [`crate::Call::from_request`].
    pub params: Option<&'a RawValue>,
}

/// `id` member: absent (notification) is told apart from `null`.
#[derive(Default)]
enum IdField {
    #[default]
    Absent,
    Present(Value),
}

impl<'de> Deserialize<'de> for IdField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(IdField::Present)
    }
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(default, borrow)]
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(default)]
    id: IdField,
    /// Kept raw: a string is read from it below, anything else is an invalid request.
    /// (An untagged enum here would make serde buffer the value.)
    #[serde(default, borrow)]
    method: Option<&'a RawValue>,
    #[serde(default, borrow)]
    params: Option<&'a RawValue>,
}

impl<'a> Request<'a> {
    /// Parses one line (without its `\n`). Errors carry the request id when one was readable.
    pub fn parse(line: &'a [u8]) -> Result<Request<'a>, RpcError> {
        // Checked first: inside untagged fields serde would report bad UTF-8 as a shape error.
        let line = std::str::from_utf8(line).map_err(|e| {
            RpcError::new(
                ErrorCode::ParseError,
                format!("parse error: request is not UTF-8 ({e})"),
            )
        })?;
        let env: Envelope<'a> = match serde_json::from_str(line) {
            Ok(env) => env,
            Err(e) => {
                // A syntax error inside a field can surface as a shape error: check the syntax.
                let syntax_ok = e.classify() == serde_json::error::Category::Data
                    && serde_json::from_str::<serde::de::IgnoredAny>(line).is_ok();
                return Err(match syntax_ok {
                    true => RpcError::new(
                        ErrorCode::InvalidRequest,
                        "invalid request: expected a JSON-RPC request object with a string `method`",
                    ),
                    false => RpcError::new(ErrorCode::ParseError, format!("parse error: {e}")),
                });
            }
        };
        let id = match env.id {
            IdField::Absent => None,
            IdField::Present(v) => Some(match v {
                Value::Null => Id::Null,
                Value::Number(n) => Id::Number(n),
                Value::String(s) => Id::String(s),
                _ => {
                    return Err(RpcError::new(
                        ErrorCode::InvalidRequest,
                        "invalid request: `id` must be a string, a number or null",
                    ))
                }
            }),
        };
        if let Some(v) = env.jsonrpc.as_deref() {
            if v != "2.0" {
                return Err(RpcError::new(
                    ErrorCode::InvalidRequest,
                    format!(
                        "invalid request: unsupported jsonrpc version {v:?} (expected \"2.0\")"
                    ),
                )
                .with_id(id));
            }
        }
        let method = match env
            .method
            .map(|m| serde_json::from_str::<Cow<'a, str>>(m.get()))
        {
            Some(Ok(m)) => m,
            Some(Err(_)) => {
                return Err(RpcError::new(
                    ErrorCode::InvalidRequest,
                    "invalid request: `method` must be a string",
                )
                .with_id(id))
            }
            None => {
                return Err(RpcError::new(
                    ErrorCode::InvalidRequest,
                    "invalid request: `method` is missing",
                )
                .with_id(id))
            }
        };
        Ok(Request {
            id,
            method,
            params: env.params,
        })
    }
}

/// `{"jsonrpc":"2.0","id":…,"result":…}`.
#[derive(Serialize)]
pub struct Response<'a, T: Serialize> {
    /// Always `"2.0"`.
    pub jsonrpc: &'static str,
    /// The id of the request answered.
    pub id: &'a Id,
    /// The method's result.
    pub result: &'a T,
}

impl<'a, T: Serialize> Response<'a, T> {
    /// A success reply to `id`.
    pub fn new(id: &'a Id, result: &'a T) -> Self {
        Response {
            jsonrpc: "2.0",
            id,
            result,
        }
    }
}

/// `{"jsonrpc":"2.0","id":…,"error":{"code":…,"message":…}}`.
#[derive(Serialize)]
pub struct ErrorResponse<'a> {
    /// Always `"2.0"`.
    pub jsonrpc: &'static str,
    /// The id of the request, or null when it could not be read.
    pub id: &'a Id,
    /// The error object.
    pub error: ErrorObject<'a>,
}

/// The `error` member of an error reply.
#[derive(Serialize)]
pub struct ErrorObject<'a> {
    /// The numeric code ([`ErrorCode::code`]).
    pub code: i64,
    /// A sentence for people.
    pub message: &'a str,
}

impl<'a> ErrorResponse<'a> {
    /// The reply for `err`; `id: null` when the error has no id.
    pub fn new(err: &'a RpcError) -> Self {
        static NULL: Id = Id::Null;
        ErrorResponse {
            jsonrpc: "2.0",
            id: err.id.as_ref().unwrap_or(&NULL),
            error: ErrorObject {
                code: err.code.code(),
                message: &err.message,
            },
        }
    }
}

/// `{"jsonrpc":"2.0","method":…,"params":…}`: a message from the kernel that expects no reply.
#[derive(Serialize)]
pub struct Notification<'a, T: Serialize> {
    /// Always `"2.0"`.
    pub jsonrpc: &'static str,
    /// The notification's name, e.g. `ready`.
    pub method: &'a str,
    /// Its params.
    pub params: &'a T,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_line_keeps_only_its_head_and_answers_with_its_id() {
        let start = br#"{"jsonrpc":"2.0","id":"big-1","method":"execute_code","params":{"code":"#;
        let mut over = OversizedLine::new(start);
        for _ in 0..10 {
            over.push(&[b'x'; 20_000]);
        }
        assert_eq!(over.len, start.len() as u64 + 200_000);
        assert_eq!(over.head.len(), ID_SEARCH_BYTES);
        assert_eq!(&over.head[..start.len()], start);
        let err = over.error(1000);
        assert_eq!(err.code, ErrorCode::RequestTooLarge);
        assert_eq!(err.id, Some(Id::String("big-1".into())));
    }

    #[test]
    fn ids_from_cut_lines() {
        let line =
            br#"{"jsonrpc":"2.0","id":"req_7","method":"tools/call","params":{"code":"xxxxxxxx"#;
        assert_eq!(id_in_prefix(line), Some(Id::String("req_7".into())));
        assert_eq!(
            id_in_prefix(br#"{"id":12,"params":"#),
            Some(Id::Number(12.into()))
        );
        assert_eq!(id_in_prefix(br#"{"method":"x","id":null}"#), Some(Id::Null));
        assert_eq!(id_in_prefix(br#"{"params":{"code":"aaaa"#), None);
        assert_eq!(
            id_in_prefix(br#"{"params":{"id":3},"id":4}"#),
            Some(Id::Number(4.into()))
        );
        assert_eq!(id_in_prefix(b"not json"), None);
        assert_eq!(id_in_prefix(b"[1,2]"), None);
    }

    fn code_of(line: &str) -> i64 {
        Request::parse(line.as_bytes()).unwrap_err().code.code()
    }

    #[test]
    fn parses_a_request_and_borrows_params() {
        let line = br#"{"jsonrpc":"2.0","id":7,"method":"execute","params":{"code":"x = 1"}}"#;
        let req = Request::parse(line).unwrap();
        assert_eq!(req.id, Some(Id::Number(7.into())));
        assert_eq!(req.method, "execute");
        assert_eq!(req.params.unwrap().get(), r#"{"code":"x = 1"}"#);
    }

    #[test]
    fn tells_null_id_from_missing_id() {
        let null = Request::parse(br#"{"id":null,"method":"status"}"#).unwrap();
        assert_eq!(null.id, Some(Id::Null));
        let missing = Request::parse(br#"{"method":"status"}"#).unwrap();
        assert_eq!(missing.id, None);
    }

    #[test]
    fn classifies_failures() {
        assert_eq!(code_of("not json"), -32700);
        assert_eq!(code_of("{\"method\": \"x\""), -32700);
        assert_eq!(code_of("{\"id\":1,\"method\":"), -32700);
        assert_eq!(code_of("{\"id\":1,\"method\":[1,"), -32700);
        assert_eq!(code_of("[1, 2]"), -32600);
        assert_eq!(code_of("\"status\""), -32600);
        assert_eq!(code_of(r#"{"id":1}"#), -32600);
        assert_eq!(code_of(r#"{"id":1,"method":5}"#), -32600);
        assert_eq!(code_of(r#"{"id":{},"method":"status"}"#), -32600);
        assert_eq!(
            code_of(r#"{"jsonrpc":"1.0","id":1,"method":"status"}"#),
            -32600
        );
        let bad_utf8 = b"{\"id\":1,\"method\":\"st\xffatus\"}";
        assert_eq!(Request::parse(bad_utf8).unwrap_err().code.code(), -32700);
    }

    #[test]
    fn invalid_request_keeps_the_id_when_readable() {
        let err = Request::parse(br#"{"id":"a","method":[]}"#).unwrap_err();
        assert_eq!(err.id, Some(Id::String("a".into())));
    }

    #[test]
    fn error_response_shape() {
        let err =
            RpcError::new(ErrorCode::MethodNotFound, "no").with_id(Some(Id::Number(3.into())));
        let s = serde_json::to_string(&ErrorResponse::new(&err)).unwrap();
        assert_eq!(
            s,
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"no"}}"#
        );
        let anon = RpcError::new(ErrorCode::ParseError, "bad");
        let s = serde_json::to_string(&ErrorResponse::new(&anon)).unwrap();
        assert!(s.contains(r#""id":null"#), "{s}");
    }
}
