//! This process's identity in lease rows, and whether a lease holder is
//! still alive (STORE-10): what a store needs to fence writes, so it sits
//! below the store.

use crate::time::now;
use std::sync::OnceLock;

/// This process's identity in lease rows: `host:pid:start-time:nonce`
/// (STORE-10). The nonce tells apart processes that share host name, pid
/// and start time (containers started together).
pub fn owner_id() -> &'static str {
    static OWNER: OnceLock<String> = OnceLock::new();
    OWNER.get_or_init(|| {
        let pid = std::process::id();
        format!(
            "{}:{}:{}:{}",
            hostname(),
            pid,
            process_start(pid).unwrap_or(0),
            crate::ids::new_ulid()
        )
    })
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates
    // within it or truncates.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The start time of a running process in clock ticks since boot (field 22
/// of /proc/<pid>/stat), which tells a live process from a reused pid.
/// `None` when there is no such process, or it has exited and only awaits
/// reaping (state `Z` or `X`).
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; fields resume after ')'.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Whether the lease held by `holder` until `until` is still live: not
/// expired, and, when the holder is on this host, its process still
/// running (a crashed run on this machine resumes without waiting).
pub fn lease_is_live(holder: &str, until: f64) -> bool {
    let parts: Vec<&str> = holder.rsplitn(4, ':').collect();
    // `host:pid:start:nonce`, or `host:pid:start` from an older release.
    let ids = match parts[..] {
        [_nonce, start, pid, host] => Some((host, pid, start)),
        [start, pid, host] => Some((host, pid, start)),
        _ => None,
    };
    if let Some((host, pid, start)) = ids {
        if host == hostname() {
            if let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) {
                match process_start(pid) {
                    Some(s) if start == 0 || s == start => {}
                    _ => return false,
                }
            }
        }
    }
    // A lease that lapsed during a store outage (or just after it, before
    // its holder's heartbeat got through again) is not evidence of a dead
    // holder: nobody could renew it.
    until > now() || crate::outage::outage_recent(lease_window())
}

/// `COMPOSE_LEASE_SECONDS` as the grace after an outage (the lease
/// settings themselves are checked where leases are taken).
fn lease_window() -> f64 {
    std::env::var("COMPOSE_LEASE_SECONDS")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(30.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// STORE-10: a lease is dead once expired, or at once when its holder
    /// is a process of this host that is gone.
    #[test]
    fn leases_die_by_expiry_or_with_their_process_on_this_host() {
        assert_eq!(owner_id().split(':').count(), 4);
        assert!(lease_is_live(owner_id(), now() + 100.0));
        assert!(!lease_is_live(owner_id(), now() - 1.0));
        let host = hostname();
        assert!(!lease_is_live(
            &format!("{host}:4000000000:5:n"),
            now() + 100.0
        ));
        assert!(lease_is_live("elsewhere:1:1:n", now() + 100.0));
        assert!(!lease_is_live("elsewhere:1:1:n", now() - 1.0));
    }
}
