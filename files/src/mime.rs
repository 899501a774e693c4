//! A file's MIME type, from its first bytes (for the formats that say what they are) and then
//! its name. Nothing here trusts either for anything but how the file is shown.

/// How many first bytes [`guess`] looks at.
pub const SNIFF_BYTES: usize = 512;

/// Formats that start with a signature.
const MAGIC: [(&[u8], &str); 9] = [
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
    (b"PAR1", "application/vnd.apache.parquet"),
    (b"\x1f\x8b", "application/gzip"),
    (b"PK\x03\x04", "application/zip"),
    (b"SQLite format 3\0", "application/vnd.sqlite3"),
];

/// Types by extension (lowercase), for files without a signature.
const BY_EXTENSION: [(&str, &str); 22] = [
    ("csv", "text/csv"),
    ("tsv", "text/tab-separated-values"),
    ("txt", "text/plain"),
    ("log", "text/plain"),
    ("md", "text/markdown"),
    ("py", "text/x-python"),
    ("json", "application/json"),
    ("jsonl", "application/jsonl"),
    ("ndjson", "application/jsonl"),
    ("html", "text/html"),
    ("htm", "text/html"),
    ("xml", "application/xml"),
    ("yaml", "application/yaml"),
    ("yml", "application/yaml"),
    ("toml", "application/toml"),
    ("svg", "image/svg+xml"),
    ("js", "text/javascript"),
    ("css", "text/css"),
    ("sql", "application/sql"),
    ("ipynb", "application/x-ipynb+json"),
    (
        "xlsx",
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    ),
    ("parquet", "application/vnd.apache.parquet"),
];

/// The MIME type of a file named `name` starting with `head` (its first [`SNIFF_BYTES`]).
pub fn guess(name: &str, head: &[u8]) -> &'static str {
    if head.len() >= 12 && &head[..4] == b"RIFF" && &head[8..12] == b"WEBP" {
        return "image/webp";
    }
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    if let Some((_, mime)) = MAGIC.iter().find(|(m, _)| head.starts_with(m)) {
        // A zip is often a format of its own: its name says which.
        if *mime != "application/zip" || ext.is_empty() {
            return mime;
        }
    }
    if let Some((_, mime)) = BY_EXTENSION.iter().find(|(e, _)| *e == ext) {
        return mime;
    }
    if looks_like_text(head) {
        "text/plain"
    } else {
        "application/octet-stream"
    }
}

/// UTF-8 without NUL (a character cut at the end of `head` allowed).
fn looks_like_text(head: &[u8]) -> bool {
    if head.contains(&0) {
        return false;
    }
    match std::str::from_utf8(head) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none() && head.len() - e.valid_up_to() < 4,
    }
}

/// Whether a type is shown as text (`text/*` and the structured text formats).
pub fn is_text(mime: &str) -> bool {
    mime.starts_with("text/")
        || matches!(
            mime,
            "application/json"
                | "application/jsonl"
                | "application/xml"
                | "application/yaml"
                | "application/toml"
                | "application/sql"
                | "application/x-ipynb+json"
                | "image/svg+xml"
        )
}

/// Whether MCP clients take a type as an image block (what models can look at).
pub fn is_image(mime: &str) -> bool {
    matches!(
        mime,
        "image/png" | "image/jpeg" | "image/gif" | "image/webp"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_come_before_names() {
        assert_eq!(guess("plot.txt", b"\x89PNG\r\n\x1a\n...."), "image/png");
        assert_eq!(
            guess("x.parquet", b"PAR1...."),
            "application/vnd.apache.parquet"
        );
        assert_eq!(guess("data", b"PAR1...."), "application/vnd.apache.parquet");
        assert_eq!(guess("a.CSV", b"a,b\n1,2\n"), "text/csv");
        assert_eq!(guess("book.xlsx", b"PK\x03\x04"), BY_EXTENSION[20].1);
        assert_eq!(guess("archive", b"PK\x03\x04"), "application/zip");
        assert_eq!(guess("notes", "héllo".as_bytes()), "text/plain");
        assert_eq!(guess("notes", &"é".as_bytes()[..1]), "text/plain");
        assert_eq!(guess("blob", b"\x00\x01\x02"), "application/octet-stream");
        assert_eq!(
            guess("blob", b"\xff\xfe\xfd\xfc\xfb"),
            "application/octet-stream"
        );
        assert!(is_text("text/csv") && is_text("application/json") && !is_text("image/png"));
        assert!(is_image("image/png") && !is_image("image/svg+xml"));
    }
}
