//! The operator's allow rules: which names (and ports) a sandboxed task may reach.
//!
//! A rule is one of
//! - `host`: that name, on any port (`api.example.com`, an IPv4 literal `10.0.0.5`, an IPv6
//!   literal in brackets `[fd00::1]`);
//! - `host:port`: that name on that port only;
//! - `*.domain` (and `*.domain:port`): every name *under* `domain`, not `domain` itself
//!   (`*.example.com` allows `a.example.com` and `a.b.example.com`, not `example.com`).
//!
//! Names are compared in lowercase ASCII with a final dot dropped; a name with other
//! characters is written as the DNS carries it (`xn--…`). A rule that names a host itself
//! (not a `*.` one) is *explicit*: only explicit rules let a connection reach an internal
//! address (loopback, private, a special-purpose range, one of the host's own interfaces:
//! [`crate::address`]). Lookups cost one hash probe per label
//! of the name asked for, whatever the number of rules.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

/// A rule that does not parse, or a rules file that cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RuleError {
    /// A rule that is not `host`, `*.domain` or either with `:port`.
    #[error(
        "{rule:?} is not a network rule: {why} (a rule is host, *.domain, or either with :port)"
    )]
    Invalid {
        /// The rule as written.
        rule: String,
        /// What is wrong with it.
        why: String,
    },
    /// A rules file (`@FILE`) that cannot be read.
    #[error("cannot read the network rules file {path}: {why}")]
    File {
        /// Its path.
        path: String,
        /// The error.
        why: String,
    },
}

/// The ports a rule allows.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ports {
    Any,
    Some(Vec<u16>),
}

impl Ports {
    fn allows(&self, port: u16) -> bool {
        match self {
            Ports::Any => true,
            Ports::Some(p) => p.contains(&port),
        }
    }

    fn add(&mut self, port: Option<u16>) {
        match (port, &mut *self) {
            (None, _) => *self = Ports::Any,
            (Some(_), Ports::Any) => {}
            (Some(p), Ports::Some(v)) => {
                if !v.contains(&p) {
                    v.push(p);
                }
            }
        }
    }
}

/// One rule, parsed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// `true` for `*.domain`.
    wildcard: bool,
    /// The host (for a wildcard, the domain), lowercase, without brackets or a final dot.
    host: String,
    /// `None`: any port.
    port: Option<u16>,
}

impl Rule {
    /// Parses one rule.
    pub fn parse(text: &str) -> Result<Rule, RuleError> {
        let bad = |why: &str| RuleError::Invalid {
            rule: text.chars().take(200).collect(),
            why: why.into(),
        };
        let t = text.trim();
        if t.is_empty() {
            return Err(bad("it is empty"));
        }
        if t.contains("://") || t.contains('/') {
            return Err(bad("a rule names a host, not a URL or a path"));
        }
        let (wildcard, rest) = match t.strip_prefix("*.") {
            Some(r) => (true, r),
            None => (false, t),
        };
        let (host, port) = split_port(rest).map_err(|why| bad(&why))?;
        let host = canonical_host(host).map_err(|why| bad(&why))?;
        if wildcard && host.parse::<std::net::IpAddr>().is_ok() {
            return Err(bad("*. goes before a domain name, not an address"));
        }
        Ok(Rule {
            wildcard,
            host,
            port,
        })
    }

    /// Whether it names one host (not `*.domain`).
    pub fn explicit(&self) -> bool {
        !self.wildcard
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wildcard {
            f.write_str("*.")?;
        }
        if self.host.contains(':') {
            write!(f, "[{}]", self.host)?;
        } else {
            f.write_str(&self.host)?;
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

/// `host[:port]` (IPv6 in brackets) split; the port checked.
fn split_port(text: &str) -> Result<(&str, Option<u16>), String> {
    let port = |p: &str| -> Result<u16, String> {
        match p.parse::<u16>() {
            Ok(n) if n > 0 && !p.starts_with('+') => Ok(n),
            _ => Err(format!("{p:?} is not a port (1 to 65535)")),
        }
    };
    if let Some(inner) = text.strip_prefix('[') {
        let (host, after) = inner
            .split_once(']')
            .ok_or_else(|| "an opening [ without its ]".to_string())?;
        return match after {
            "" => Ok((host, None)),
            a => match a.strip_prefix(':') {
                Some(p) => Ok((host, Some(port(p)?))),
                None => Err(format!("{a:?} after ]")),
            },
        };
    }
    match text.rsplit_once(':') {
        Some((h, _)) if h.contains(':') => Err("an IPv6 address goes in brackets: [addr]".into()),
        Some((h, p)) => Ok((h, Some(port(p)?))),
        None => Ok((text, None)),
    }
}

/// The form names are compared in: lowercase, no final dot; a host name's labels checked
/// (letters, digits, `-`, `_`; 1 to 63 each, 253 in all), an address written canonically.
pub fn canonical_host(host: &str) -> Result<String, String> {
    let host = host.strip_suffix('.').unwrap_or(host);
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(ip.to_string());
    }
    if host.is_empty() {
        return Err("no host".into());
    }
    if host.len() > 253 {
        return Err("a host name is at most 253 characters".into());
    }
    for label in host.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err("each dot-separated label of a host name has 1 to 63 characters".into());
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
        {
            return Err(if c == '*' {
                "* only as the first label, as in *.example.com".into()
            } else if !c.is_ascii() {
                "a name with non-ASCII letters is written as DNS carries it (xn--...)".into()
            } else {
                format!("{c:?} is not allowed in a host name")
            });
        }
    }
    Ok(host.to_ascii_lowercase())
}

/// Which rule let a connection through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    /// The rule, as [`Rule`]'s `Display` writes it.
    pub rule: String,
    /// It names the host itself (not `*.domain`): it may reach internal addresses.
    pub explicit: bool,
}

/// The rules in force.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    /// In the order given, duplicates dropped.
    list: Vec<Rule>,
    seen: std::collections::HashSet<Rule>,
    exact: HashMap<String, Ports>,
    under: HashMap<String, Ports>,
}

impl Rules {
    /// Parses `allow:` rules: items separated by commas or whitespace, each a rule or `@FILE`
    /// (one rule per line, `#` starting a comment; read now).
    pub fn parse(text: &str) -> Result<Rules, RuleError> {
        let mut rules = Rules::default();
        for item in text.split(|c: char| c == ',' || c.is_whitespace()) {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            match item.strip_prefix('@') {
                Some(path) => rules.add_file(Path::new(path))?,
                None => rules.add(Rule::parse(item)?),
            }
        }
        Ok(rules)
    }

    /// Adds the rules of a file: one per line, `#` starts a comment, blank lines skipped.
    pub fn add_file(&mut self, path: &Path) -> Result<(), RuleError> {
        let text = std::fs::read_to_string(path).map_err(|e| RuleError::File {
            path: path.display().to_string(),
            why: e.to_string(),
        })?;
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let rule = Rule::parse(line).map_err(|e| RuleError::File {
                path: path.display().to_string(),
                why: format!("line {}: {e}", n + 1),
            })?;
            self.add(rule);
        }
        Ok(())
    }

    /// Adds one rule.
    pub fn add(&mut self, rule: Rule) {
        if !self.seen.insert(rule.clone()) {
            return;
        }
        let map = if rule.wildcard {
            &mut self.under
        } else {
            &mut self.exact
        };
        map.entry(rule.host.clone())
            .or_insert(Ports::Some(Vec::new()))
            .add(rule.port);
        self.list.push(rule);
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// None at all (everything is refused).
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Each rule as written canonically, in the order given.
    pub fn to_strings(&self) -> Vec<String> {
        self.list.iter().map(Rule::to_string).collect()
    }

    /// The rule that allows `host` (canonical, [`canonical_host`]) on `port`, if any: an
    /// explicit one first, then the closest `*.domain`.
    pub fn allows(&self, host: &str, port: u16) -> Option<Allowed> {
        let found = |wildcard: bool, name: &str, ports: &Ports| {
            ports.allows(port).then(|| Allowed {
                rule: Rule {
                    wildcard,
                    host: name.to_owned(),
                    port: match ports {
                        Ports::Any => None,
                        Ports::Some(_) => Some(port),
                    },
                }
                .to_string(),
                explicit: !wildcard,
            })
        };
        if let Some(a) = self.exact.get(host).and_then(|p| found(false, host, p)) {
            return Some(a);
        }
        if host.parse::<std::net::IpAddr>().is_ok() {
            return None;
        }
        let mut rest = host;
        while let Some((_, parent)) = rest.split_once('.') {
            if let Some(a) = self.under.get(parent).and_then(|p| found(true, parent, p)) {
                return Some(a);
            }
            rest = parent;
        }
        None
    }
}

impl PartialEq for Rules {
    fn eq(&self, other: &Rules) -> bool {
        self.list == other.list
    }
}

impl Eq for Rules {}

impl fmt::Display for Rules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_strings().join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_forms_and_their_matches() {
        let r = Rules::parse("api.example.com, *.Data.Example.org:443 localhost:8080").unwrap();
        assert_eq!(
            r.to_strings(),
            [
                "api.example.com",
                "*.data.example.org:443",
                "localhost:8080"
            ]
        );
        assert!(r.allows("api.example.com", 1).unwrap().explicit);
        assert_eq!(r.allows("example.com", 443), None);
        let a = r.allows("x.y.data.example.org", 443).unwrap();
        assert_eq!(
            (a.rule.as_str(), a.explicit),
            ("*.data.example.org:443", false)
        );
        assert_eq!(
            r.allows("data.example.org", 443),
            None,
            "not the domain itself"
        );
        assert_eq!(r.allows("x.data.example.org", 80), None);
        assert_eq!(r.allows("localhost", 8080).unwrap().rule, "localhost:8080");
        assert_eq!(r.allows("localhost", 8081), None);
        assert_eq!(r.allows("127.0.0.1", 8080), None);
    }

    #[test]
    fn addresses_and_ports() {
        let r = Rules::parse("127.0.0.1:5000,[::1],[FD00::1]:443").unwrap();
        assert_eq!(r.to_strings(), ["127.0.0.1:5000", "[::1]", "[fd00::1]:443"]);
        assert!(r.allows("127.0.0.1", 5000).is_some());
        assert!(r.allows("::1", 9).is_some());
        assert!(r.allows("fd00::1", 443).is_some());
        // Two ports of one host, and any port wins over one.
        let r = Rules::parse("h:1,h:2,g:1,g").unwrap();
        assert!(r.allows("h", 2).is_some() && r.allows("h", 3).is_none());
        assert_eq!(r.allows("g", 3).unwrap().rule, "g");
    }

    #[test]
    fn bad_rules_say_why() {
        for (rule, why) in [
            ("https://example.com", "not a URL"),
            ("example.com:0", "not a port"),
            ("example.com:99999", "not a port"),
            ("a.*.com", "* only as the first label"),
            ("*", "first label"),
            ("*.10.0.0.1", "not an address"),
            ("::1", "brackets"),
            ("exa!mple", "not allowed in a host name"),
            ("bücher.de", "xn--"),
            ("a..b", "1 to 63"),
        ] {
            let e = Rules::parse(rule).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains(why), "{rule}: {e}");
        }
    }

    #[test]
    fn a_file_of_rules_with_comments() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("rules.txt");
        std::fs::write(
            &f,
            "# the task's APIs\napi.example.com\n\n*.cdn.example.net  # assets\n",
        )
        .unwrap();
        let r = Rules::parse(&format!("pypi.org,@{}", f.display())).unwrap();
        assert_eq!(
            r.to_strings(),
            ["pypi.org", "api.example.com", "*.cdn.example.net"]
        );
        std::fs::write(&f, "ok.example\nbad rule here/\n").unwrap();
        let e = Rules::parse(&format!("@{}", f.display())).unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        assert!(Rules::parse("@/nonexistent/rules").is_err());
    }

    #[test]
    fn many_rules_cost_one_probe_per_label() {
        let text: Vec<String> = (0..100_000).map(|i| format!("h{i}.example.com")).collect();
        let r = Rules::parse(&text.join(",")).unwrap();
        assert_eq!(r.len(), 100_000);
        assert!(r.allows("h99999.example.com", 443).is_some());
        assert!(r.allows("h100000.example.com", 443).is_none());
    }
}
