//! Calls parked while their 2026-07-28 client answers an approval (`InputRequiredResult`),
//! and the `requestState` that continues each.
//!
//! The state is `relay:<n>:<secret>`: `<n>` numbers the call within its kernel, `<secret>` is
//! 128 bits from the kernel's random source, given only in that call's answer (never logged).
//! A 2026-07-28 client has no session to bind the state to, so the secret is what binds it
//! to the client that got it: another client of the same server (same token) cannot continue
//! the call, answer its approval or receive its result. The state also names the task (a
//! kernel keeps its own parked calls) and the tool: sent with another tool it is refused.
//! A state whose secret does not match is refused as unknown and leaves the parked call as
//! it was, so guessing cannot end another client's call.

use super::auth;
use rmcp::ErrorData;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Mutex;
use tokio::sync::oneshot;

/// Parked calls kept per kernel at the most; past that the oldest is forgotten (its client's
/// next round is told it is unknown).
pub const MAX_PARKED_CALLS: usize = 256;

/// Bytes of randomness in a state's secret.
const SECRET_BYTES: usize = 16;

/// The `requestState` prefix.
const PREFIX: &str = "relay";

/// One parked call: the tool it called and where the kernel's reply comes.
struct Parked {
    secret: String,
    tool: String,
    reply: oneshot::Receiver<Value>,
}

/// One kernel's parked calls, by call number.
#[derive(Default)]
pub struct ParkedCalls(Mutex<BTreeMap<u64, Parked>>);

impl ParkedCalls {
    /// Parks call `id` to `tool`; returns the `requestState` that continues it.
    pub fn park(
        &self,
        id: u64,
        tool: &str,
        reply: oneshot::Receiver<Value>,
    ) -> std::io::Result<String> {
        let secret = auth::random_hex(SECRET_BYTES)?;
        let state = format!("{PREFIX}:{id}:{secret}");
        let mut parked = self.lock();
        parked.insert(
            id,
            Parked {
                secret,
                tool: tool.to_owned(),
                reply,
            },
        );
        while parked.len() > MAX_PARKED_CALLS {
            parked.pop_first();
        }
        Ok(state)
    }

    /// The call that `state` continues, sent again to `tool`: its number and where its reply
    /// comes. Refused (and left parked) when the secret or the tool differs.
    pub fn take(
        &self,
        state: &str,
        tool: &str,
    ) -> Result<(u64, oneshot::Receiver<Value>), ErrorData> {
        let unknown = || {
            ErrorData::invalid_params(
                "requestState is not one this server gave for this task, or its call was answered",
                None,
            )
        };
        let (id, secret) = parse(state).ok_or_else(unknown)?;
        let mut parked = self.lock();
        let call = parked.get(&id).ok_or_else(unknown)?;
        if !auth::same(call.secret.as_bytes(), secret.as_bytes()) {
            return Err(unknown());
        }
        if call.tool != tool {
            return Err(ErrorData::invalid_params(
                format!(
                    "requestState continues a call to {}, not to {tool}: send it with the same tool",
                    call.tool
                ),
                None,
            ));
        }
        let call = parked.remove(&id).expect("looked up under the lock");
        Ok((id, call.reply))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Parked>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `relay:<n>:<secret>` as (n, secret).
fn parse(state: &str) -> Option<(u64, &str)> {
    let rest = state.strip_prefix(PREFIX)?.strip_prefix(':')?;
    let (id, secret) = rest.split_once(':')?;
    Some((id.parse().ok()?, secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_continues_its_own_call_once_and_only_with_its_secret_and_tool() {
        let calls = ParkedCalls::default();
        let (_tx, rx) = oneshot::channel();
        let state = calls.park(7, "execute_code", rx).unwrap();
        let secret = state.rsplit(':').next().unwrap();
        assert_eq!(secret.len(), 2 * SECRET_BYTES);
        assert!(state.starts_with("relay:7:"));
        // The number alone, or with another secret, is unknown; the call stays parked.
        for guess in [
            "relay:7",
            "relay:7:",
            "relay:7:00000000000000000000000000000000",
        ] {
            assert!(calls.take(guess, "execute_code").is_err(), "{guess}");
        }
        let err = calls.take(&state, "wait_cell").unwrap_err();
        assert!(err.message.contains("execute_code"), "{}", err.message);
        let (id, _) = calls.take(&state, "execute_code").unwrap();
        assert_eq!(id, 7);
        assert!(calls.take(&state, "execute_code").is_err(), "given once");
    }

    #[test]
    fn two_parks_of_one_number_get_different_secrets() {
        let calls = ParkedCalls::default();
        let a = calls.park(1, "t", oneshot::channel().1).unwrap();
        let b = calls.park(2, "t", oneshot::channel().1).unwrap();
        assert_ne!(a.rsplit(':').next(), b.rsplit(':').next());
    }

    #[test]
    fn past_the_cap_the_oldest_is_forgotten() {
        let calls = ParkedCalls::default();
        let first = calls.park(0, "t", oneshot::channel().1).unwrap();
        for id in 1..=MAX_PARKED_CALLS as u64 {
            calls.park(id, "t", oneshot::channel().1).unwrap();
        }
        assert!(calls.take(&first, "t").is_err());
    }
}
