//! Text for people: tables that fit the terminal, colours only on a terminal (and never
//! with `NO_COLOR`), and heads of long texts.

use comfy_table::{presets, ContentArrangement, Table};
use std::io::IsTerminal;

/// Whether stdout is a terminal that takes colours.
pub fn colours() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// Terminal colours used.
#[derive(Debug, Clone, Copy)]
pub enum Colour {
    /// Success.
    Green,
    /// Failure.
    Red,
    /// Secondary text.
    Dim,
    /// Headings.
    Bold,
}

/// `text` in `colour` when stdout takes colours.
pub fn paint(text: &str, colour: Colour) -> String {
    if !colours() {
        return text.to_owned();
    }
    let code = match colour {
        Colour::Green => "32",
        Colour::Red => "31",
        Colour::Dim => "2",
        Colour::Bold => "1",
    };
    format!("\x1b[{code}m{text}\x1b[0m")
}

/// The terminal's width in columns, when stdout is one.
fn terminal_width() -> Option<u16> {
    if !std::io::stdout().is_terminal() {
        return None;
    }
    terminal_size::terminal_size_of(std::io::stdout())
        .map(|(w, _)| w.0)
        .filter(|&w| w > 0)
}

/// A table with these headers, as wide as the terminal (unbounded when not on one).
pub fn table(headers: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_style(presets::UTF8_FULL_CONDENSED);
    match terminal_width() {
        Some(w) => {
            t.set_width(w);
            t.set_content_arrangement(ContentArrangement::Dynamic);
        }
        None => {
            t.set_content_arrangement(ContentArrangement::Disabled);
        }
    }
    t.set_header(headers.iter().map(|h| paint(h, Colour::Bold)));
    t
}

/// The first `lines` lines of `text`, at most `chars` characters, with `…` when cut.
pub fn head(text: &str, lines: usize, chars: usize) -> String {
    let mut out: String = text.lines().take(lines).collect::<Vec<_>>().join("\n");
    let mut cut = text.lines().nth(lines).is_some();
    if out.chars().count() > chars {
        out = out.chars().take(chars).collect();
        cut = true;
    }
    if cut {
        out.push('…');
    }
    out
}

/// Milliseconds for people: `12.3 ms`, `4.56 s`.
pub fn ms(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.2} s", v / 1000.0)
    } else {
        format!("{v:.1} ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_say_when_they_cut() {
        assert_eq!(head("a\nb\nc", 2, 100), "a\nb…");
        assert_eq!(head("abcdef", 5, 3), "abc…");
        assert_eq!(head("ab", 5, 3), "ab");
        assert_eq!(ms(12.34), "12.3 ms");
        assert_eq!(ms(4560.0), "4.56 s");
    }
}
