//! Capabilities: a sandboxed worker holds none, effective, permitted, inheritable, ambient or
//! in its bounding set (so that an `execve`, even of a set-user-ID root program or as uid 0,
//! gains none back).
//!
//! In its own user namespace the worker's capabilities reach only what that namespace owns,
//! but a kernel run as root on a host that refuses user namespaces starts a worker with every
//! capability of the host's root: `CAP_SYS_PTRACE` let a cell read the kernel's
//! `/proc/<pid>/environ` past Landlock's ptrace rule, `CAP_DAC_OVERRIDE` any file of another
//! user. Dropped after the other layers that need them (mounts, Landlock's rules) and before
//! seccomp.

use flowrepl_protocol::sandbox::SandboxLayer;

/// The layer's name.
pub const LAYER: &str = "capabilities";

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct Header {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Drops every capability of this process.
pub fn drop_all(skip: &dyn Fn(&str) -> bool) -> SandboxLayer {
    crate::unless_skipped(LAYER, skip, || {
        let last: libc::c_ulong = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(63);
        for cap in 0..=last {
            // SAFETY: prctl with integer arguments on this process.
            let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
            if r != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
                return Err(format!(
                    "cannot drop capability {cap} from the bounding set: {}",
                    std::io::Error::last_os_error()
                ));
            }
        }
        // SAFETY: prctl with integer arguments on this process.
        unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            )
        };
        let header = Header {
            version: VERSION_3,
            pid: 0,
        };
        let data = [Data::default(); 2];
        // SAFETY: capset with a valid header and two data words, as version 3 wants.
        if unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) } != 0 {
            return Err(format!("capset: {}", std::io::Error::last_os_error()));
        }
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let held: Vec<&str> = status
            .lines()
            .filter(|l| {
                ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"]
                    .iter()
                    .any(|k| l.starts_with(k))
            })
            .filter(|l| {
                l.split_whitespace()
                    .nth(1)
                    .is_some_and(|v| !v.trim_start_matches('0').is_empty())
            })
            .collect();
        if held.is_empty() {
            Ok("none held (effective, permitted, inheritable, ambient, bounding)".into())
        } else {
            Err(format!("still held: {}", held.join(", ")))
        }
    })
}
