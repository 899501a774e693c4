//! Network by name for a sandboxed task (`--sandbox-net=allow:RULES`).
//!
//! The worker keeps a network namespace of its own with only `lo`; there it listens for the
//! kernel and hands the listening socket over (`flowrepl_sandbox::proxy`). The kernel's
//! [`proxy`] accepts the cells' connections on it, from outside the namespace, and is their
//! only way out: HTTP `CONNECT` tunnels (HTTPS, and any TCP protocol) and plain HTTP
//! requests in absolute form. It decides by the name the cell asked for ([`rules`]), never
//! by an address the cell resolved; resolves the name itself; refuses internal addresses
//! ([`address`]) unless a rule names the host itself; checks that a tunnel's TLS server name
//! ([`tls`]) is the host it was allowed for; and writes an `egress` record of every
//! connection ([`record`]).
//!
//! - [`rules`]: the operator's rules, parsed and matched;
//! - [`address`]: which addresses are internal;
//! - [`tls`]: the server name of a ClientHello;
//! - [`proxy`]: the proxy itself, on a thread of its own per worker;
//! - [`record`]: the `egress` records, within a budget.
#![warn(missing_docs)]

pub mod address;
pub mod proxy;
pub mod record;
pub mod rules;
pub mod tls;

pub use proxy::Proxy;
pub use record::Who;
pub use rules::{Rule, RuleError, Rules};

use flowrepl_protocol::sandbox::Network;

/// What `--sandbox-net` asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SandboxNet {
    /// No network (the default).
    #[default]
    None,
    /// The host's network (`--sandbox-net`, `--sandbox-net=host`).
    Host,
    /// Only the egress proxy, by these rules (`--sandbox-net=allow:RULE,...`).
    Allow(std::sync::Arc<Rules>),
}

impl SandboxNet {
    /// Parses `--sandbox-net`'s value: `host` (also `1`, `true`, `yes`, `on`, and the bare
    /// flag), `none` (also `0`, `false`, `no`, `off`, empty), or `allow:` followed by rules
    /// and `@FILE`s, separated by commas or whitespace ([`Rules::parse`]).
    pub fn parse(value: &str) -> Result<SandboxNet, String> {
        let v = value.trim();
        if let Some(rules) = v.strip_prefix("allow:") {
            let rules = Rules::parse(rules).map_err(|e| e.to_string())?;
            if rules.is_empty() {
                return Err(
                    "allow: names no rule (no network at all is --sandbox-net=none)".into(),
                );
            }
            return Ok(SandboxNet::Allow(std::sync::Arc::new(rules)));
        }
        match v.to_ascii_lowercase().as_str() {
            "host" | "1" | "true" | "yes" | "on" => Ok(SandboxNet::Host),
            "none" | "0" | "false" | "no" | "off" | "" => Ok(SandboxNet::None),
            _ => Err(format!(
                "{:?} is not a network setting: host, none, or allow:RULE[,RULE...] (a rule is host, *.domain, or either with :port; @FILE reads one rule per line)",
                v.chars().take(100).collect::<String>()
            )),
        }
    }

    /// What the worker's policy says.
    pub fn network(&self) -> Network {
        match self {
            SandboxNet::None => Network::None,
            SandboxNet::Host => Network::Host,
            SandboxNet::Allow(_) => Network::Proxy,
        }
    }

    /// The rules in force (with `allow:`).
    pub fn rules(&self) -> Option<&std::sync::Arc<Rules>> {
        match self {
            SandboxNet::Allow(r) => Some(r),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings() {
        assert_eq!(SandboxNet::parse("").unwrap(), SandboxNet::None);
        assert_eq!(SandboxNet::parse("true").unwrap(), SandboxNet::Host);
        assert_eq!(SandboxNet::parse("host").unwrap(), SandboxNet::Host);
        assert_eq!(SandboxNet::parse("0").unwrap(), SandboxNet::None);
        let a = SandboxNet::parse("allow:localhost:8000, *.example.com").unwrap();
        assert_eq!(
            a.rules().unwrap().to_strings(),
            ["localhost:8000", "*.example.com"]
        );
        assert!(SandboxNet::parse("allow:").is_err());
        assert!(SandboxNet::parse("allow:https://x").is_err());
        assert!(SandboxNet::parse("everything").is_err());
    }
}
