//! Finding the final expression statement of a cell without building an AST.
//!
//! Jupyter shows the value of a cell's last statement when it is an expression. Parsing to a
//! Python AST and compiling from it costs 13–40 µs per cell; instead this module scans the
//! source once (strings, comments, brackets, continuations, `;`) to find where the last
//! top-level statement starts, and rules out the statements that are certainly not
//! expressions (keywords, assignments, annotations, compound statements). The executor then
//! compiles `head` with `exec` and `tail` with `eval`, both straight from the text.
//!
//! The scan is conservative in one direction only: when it says "maybe an expression", the
//! executor tries to compile the tail as an expression and, if that fails, compiles the whole
//! cell as before. It must never split a cell where the split changes meaning; the tests
//! below pin the cases where that could happen (`if x: a; b`, continuations, strings).

/// A cell split before its last top-level statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split<'a> {
    /// Everything before the last statement (may be empty).
    pub head: &'a str,
    /// The last statement, which may be an expression.
    pub tail: &'a str,
    /// 1-based line on which `tail` starts, to keep line numbers in tracebacks right.
    pub tail_line: usize,
    /// 0-based byte column at which `tail` starts (non-zero after a `;`).
    pub tail_col: usize,
}

/// Keywords that start a statement that is not an expression.
const STATEMENT_KEYWORDS: &[&str] = &[
    "assert", "async", "break", "class", "continue", "def", "del", "elif", "else", "except",
    "finally", "for", "from", "global", "if", "import", "nonlocal", "pass", "raise", "return",
    "try", "while", "with", "yield",
];

/// Keywords that open a compound statement: a `;` on such a line belongs to its body.
const COMPOUND_KEYWORDS: &[&str] = &[
    "async", "class", "def", "elif", "else", "except", "finally", "for", "if", "try", "while",
    "with",
];

#[derive(Clone, Copy)]
struct Candidate {
    start: usize,
    line: usize,
    /// Known not to be an expression statement.
    excluded: bool,
    /// Seen `=` that looks like assignment, or `:` at depth 0.
    assign_or_colon: bool,
    lambda: bool,
    /// Any token seen (not only whitespace and comments).
    nonempty: bool,
    first_word_seen: bool,
}

impl Candidate {
    fn new(start: usize, line: usize) -> Self {
        Candidate {
            start,
            line,
            excluded: false,
            assign_or_colon: false,
            lambda: false,
            nonempty: false,
            first_word_seen: false,
        }
    }

    fn may_be_expression(&self) -> bool {
        self.nonempty && !self.excluded && (self.lambda || !self.assign_or_colon)
    }
}

/// Splits `code` before its last top-level statement when that statement may be an
/// expression; `None` when it certainly is not (or the cell is empty).
pub fn split_last_expression(code: &str) -> Option<Split<'_>> {
    let b = code.as_bytes();
    let n = b.len();
    let mut i = 0;
    let mut line = 1;
    let mut depth: usize = 0;
    // The statement being scanned, if it started at column 0 of a logical line.
    let mut cur: Option<Candidate> = None;
    // Whether the current logical line opened with a compound keyword.
    let mut compound_line = false;
    let mut at_line_start = true;
    while i < n {
        let c = b[i];
        if at_line_start {
            // Start of a physical line that begins a logical line: measure indentation.
            let mut j = i;
            while j < n && (b[j] == b' ' || b[j] == b'\t' || b[j] == b'\x0c') {
                j += 1;
            }
            if j >= n {
                break;
            }
            if b[j] == b'\n' || b[j] == b'\r' || b[j] == b'#' {
                // Blank or comment-only line: does not start a statement.
                i = j;
                at_line_start = false;
                if b[j] == b'#' {
                    while i < n && b[i] != b'\n' {
                        i += 1;
                    }
                }
                continue;
            }
            at_line_start = false;
            compound_line = false;
            if j > i {
                // An indented logical line: the statement before is a compound statement
                // (or the cell is malformed); either way it is not an expression.
                if let Some(c) = cur.as_mut() {
                    c.excluded = true;
                }
                // Keep `cur` so that it stays excluded; nothing on this line is top-level.
                i = j;
                // Skip the rest of this logical line, tracking strings and brackets.
                i = skip_logical_line(b, i, &mut line, &mut depth);
                at_line_start = true;
                continue;
            }
            cur = Some(Candidate::new(j, line));
            i = j;
            continue;
        }
        match c {
            b'\n' => {
                line += 1;
                i += 1;
                if depth == 0 {
                    at_line_start = true;
                }
            }
            b'#' => {
                while i < n && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'\\' if i + 1 < n && b[i + 1] == b'\n' => {
                line += 1;
                i += 2;
            }
            b'\\' if i + 2 < n && b[i + 1] == b'\r' && b[i + 2] == b'\n' => {
                line += 1;
                i += 3;
            }
            b'\'' | b'"' => {
                mark_token(&mut cur);
                i = skip_string(b, i, &mut line);
            }
            b'(' | b'[' | b'{' => {
                mark_token(&mut cur);
                depth += 1;
                i += 1;
            }
            b')' | b']' | b'}' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b';' if depth == 0 => {
                i += 1;
                while i < n && (b[i] == b' ' || b[i] == b'\t') {
                    i += 1;
                }
                if !compound_line {
                    cur = Some(Candidate::new(i, line));
                }
            }
            b'=' if depth == 0 => {
                let next = b.get(i + 1).copied();
                let prev = if i > 0 { b[i - 1] } else { b' ' };
                if next == Some(b'=') {
                    i += 2; // `==`
                    continue;
                }
                if !matches!(prev, b'=' | b'!' | b'<' | b'>' | b':') {
                    if let Some(c) = cur.as_mut() {
                        c.assign_or_colon = true;
                    }
                }
                mark_token(&mut cur);
                i += 1;
            }
            b':' if depth == 0 => {
                if b.get(i + 1) != Some(&b'=') {
                    if let Some(c) = cur.as_mut() {
                        c.assign_or_colon = true;
                    }
                }
                i += 1;
            }
            b'@' if depth == 0 => {
                if let Some(c) = cur.as_mut() {
                    if !c.nonempty {
                        c.excluded = true; // a decorator
                    }
                }
                mark_token(&mut cur);
                i += 1;
            }
            c if c == b'_' || c.is_ascii_alphanumeric() || c >= 0x80 => {
                let start = i;
                while i < n && (b[i] == b'_' || b[i].is_ascii_alphanumeric() || b[i] >= 0x80) {
                    i += 1;
                }
                // A string prefix (r"", b'', f"", rb"", …) belongs to the string.
                if i < n && (b[i] == b'\'' || b[i] == b'"') && i - start <= 2 {
                    continue;
                }
                let word = &code[start..i];
                if let Some(c) = cur.as_mut() {
                    if !c.first_word_seen && !c.nonempty {
                        c.first_word_seen = true;
                        if STATEMENT_KEYWORDS.contains(&word) {
                            c.excluded = true;
                        }
                        if COMPOUND_KEYWORDS.contains(&word) {
                            compound_line = true;
                        }
                    }
                    if word == "lambda" {
                        c.lambda = true;
                    }
                }
                mark_token(&mut cur);
            }
            b' ' | b'\t' | b'\r' | b'\x0c' => i += 1,
            _ => {
                mark_token(&mut cur);
                i += 1;
            }
        }
    }
    let cand = cur?;
    if !cand.may_be_expression() {
        return None;
    }
    let line_start = code[..cand.start].rfind('\n').map_or(0, |i| i + 1);
    Some(Split {
        head: &code[..cand.start],
        tail: &code[cand.start..],
        tail_line: cand.line,
        tail_col: cand.start - line_start,
    })
}

fn mark_token(cur: &mut Option<Candidate>) {
    if let Some(c) = cur.as_mut() {
        c.nonempty = true;
    }
}

/// Skips a string literal starting at the quote at `i`; returns the index after it.
fn skip_string(b: &[u8], mut i: usize, line: &mut usize) -> usize {
    let q = b[i];
    let triple = i + 2 < b.len() && b[i + 1] == q && b[i + 2] == q;
    i += if triple { 3 } else { 1 };
    while i < b.len() {
        match b[i] {
            b'\\' => {
                if b.get(i + 1) == Some(&b'\n') {
                    *line += 1;
                }
                i += 2;
            }
            b'\n' => {
                *line += 1;
                i += 1;
                if !triple {
                    return i; // unterminated: let the compiler report it
                }
            }
            c if c == q => {
                if !triple {
                    return i + 1;
                }
                if i + 2 < b.len() && b[i + 1] == q && b[i + 2] == q {
                    return i + 3;
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    b.len()
}

/// Skips to the end of the logical line that starts at `i` (past its `\n`).
fn skip_logical_line(b: &[u8], mut i: usize, line: &mut usize, depth: &mut usize) -> usize {
    while i < b.len() {
        match b[i] {
            b'\n' => {
                *line += 1;
                i += 1;
                if *depth == 0 {
                    return i;
                }
            }
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'\\' if b.get(i + 1) == Some(&b'\n') => {
                *line += 1;
                i += 2;
            }
            b'\'' | b'"' => i = skip_string(b, i, line),
            b'(' | b'[' | b'{' => {
                *depth += 1;
                i += 1;
            }
            b')' | b']' | b'}' => {
                *depth = depth.saturating_sub(1);
                i += 1;
            }
            _ => i += 1,
        }
    }
    i
}

/// The modules a cell's `import` statements name (`import a.b as c, d` → `a.b`, `d`;
/// `from a.b import c` → `a.b`; relative imports are left out), read from its text: the
/// statements that start a line or follow a `;`. A cheap scan, not a parse: a string that
/// holds such a line counts too.
pub fn imported_modules(code: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for line in code.lines() {
        for stmt in line.split(';') {
            let stmt = stmt.trim_start();
            if let Some(rest) = stmt.strip_prefix("import ") {
                let rest = rest.split('#').next().unwrap_or("");
                for part in rest.trim_matches(|c| c == '(' || c == ')').split(',') {
                    let name = part.split_whitespace().next().unwrap_or("");
                    if is_module_name(name) {
                        out.push(name);
                    }
                }
            } else if let Some(rest) = stmt.strip_prefix("from ") {
                let mut words = rest.split_whitespace();
                if let (Some(name), Some("import")) = (words.next(), words.next()) {
                    if is_module_name(name) {
                        out.push(name);
                    }
                }
            }
        }
    }
    out
}

fn is_module_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_alphanumeric() || c == '_'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tail(code: &str) -> Option<&str> {
        split_last_expression(code).map(|s| s.tail)
    }

    #[test]
    fn not_expressions() {
        for code in [
            "",
            "   \n\n",
            "# just a comment",
            "x = 1",
            "x += 1",
            "x: int = 5",
            "x: int",
            "import os",
            "from a import b",
            "def f():\n    return 1",
            "class A:\n    pass",
            "for i in range(3):\n    i",
            "if x:\n    y\nelse:\n    z",
            "if x: a; b",
            "@dec\ndef f(): pass",
            "x = 1;",
            "del x",
            "a = b = 3",
            "x = (1 +\n 2)",
            "x = 1 + \\\n  2",
            "with open('f') as f:\n    f.read()",
            "try:\n  x\nexcept E:\n  y",
            "print(1)\nx = 1",
            "async def f():\n  pass",
            "while True: break",
            "d = {'a': 1}",
            "x = '''\nabc\n'''",
            "s = \"a;b\"",
            "x = f(a=1)\n# trailing comment\n",
            "pass",
            "raise ValueError",
            "assert x",
            "global g",
            "return",
        ] {
            assert_eq!(tail(code), None, "{code:?}");
        }
    }

    #[test]
    fn maybe_expressions() {
        let cases = [
            ("x", "x"),
            ("1 + 1", "1 + 1"),
            ("x = 1\nx", "x"),
            ("x = 1; x", "x"),
            ("import math; math.pi", "math.pi"),
            ("f(a=1)", "f(a=1)"),
            ("x == 1", "x == 1"),
            ("x <= 1", "x <= 1"),
            ("lambda x=1: x", "lambda x=1: x"),
            ("print('a = b')", "print('a = b')"),
            ("y = 2\n(y +\n 1)", "(y +\n 1)"),
            ("s = '''\nx = 1\n'''\ns", "s"),
            ("def f():\n    return 1\nf()", "f()"),
            ("x = 1\nx  # comment\n", "x  # comment\n"),
            ("d[1:2]", "d[1:2]"),
            ("await f()", "await f()"),
            ("r'\\'' + 'a'", "r'\\'' + 'a'"),
            ("f'{x!r:>10}'", "f'{x!r:>10}'"),
            ("x = 1 + \\\n 2\nx", "x"),
            ("match(x)", "match(x)"),
        ];
        for (code, want) in cases {
            assert_eq!(tail(code), Some(want), "{code:?}");
        }
    }

    #[test]
    fn tail_line_is_where_the_statement_starts() {
        let s = split_last_expression("a = 1\n\nb = '''\n\n'''\nb").unwrap();
        assert_eq!(s.tail_line, 6);
        assert_eq!(s.head, "a = 1\n\nb = '''\n\n'''\n");
        let s = split_last_expression("a = 1; a").unwrap();
        assert_eq!((s.tail_line, s.tail_col), (1, 7));
    }

    #[test]
    fn finds_the_modules_import_statements_name() {
        assert_eq!(
            imported_modules(
                "import json\nimport os.path as p, sys  # c\nx = 1; from a.b import c\n    import zlib\nfrom . import rel\nfrom .x import y\nimported = 2\nfrom (x) import y"
            ),
            ["json", "os.path", "sys", "a.b", "zlib"]
        );
        assert!(imported_modules("x = 'no imports here'").is_empty());
    }
}
