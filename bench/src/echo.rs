//! `echo` mode: the raw pipe peer, the floor for any request/reply over pipes. Replies to each
//! line with the same line, or with `N` bytes when the line is `SIZE N`.

use std::io::{BufRead, Write};

/// Serves until stdin closes.
pub fn run() {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let mut line = Vec::new();
    let mut big = Vec::new();
    let mut r = stdin.lock();
    loop {
        line.clear();
        if r.read_until(b'\n', &mut line).unwrap() == 0 {
            return;
        }
        if let Some(n) = line.strip_prefix(b"SIZE ") {
            let n: usize = std::str::from_utf8(n).unwrap().trim().parse().unwrap();
            big.clear();
            big.resize(n, b'a');
            big.push(b'\n');
            out.write_all(&big).unwrap();
        } else {
            out.write_all(&line).unwrap();
        }
        out.flush().unwrap();
    }
}
