//! `--sandbox-net=allow:…`: the worker's one way out is the kernel's egress proxy. In the
//! worker's network namespace (only `lo`, brought up here) the worker listens on
//! [`PROXY_ADDRESS`] and hands the listening socket to the kernel over fd [`PROXY_FD`]
//! (`SCM_RIGHTS`), then closes both: the kernel accepts the cells' connections on it from
//! outside the namespace and connects to the host named, or refuses. Cells find the proxy in
//! `HTTP_PROXY`/`HTTPS_PROXY` (and the lowercase forms); nothing else listens, and Landlock
//! lets TCP connect only to its port.
//!
//! All of this runs before Python starts, so no cell sees the hand-over.

use flowrepl_protocol::sandbox::{PROXY_ADDRESS, PROXY_FD};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The variables that point a cell's HTTP clients at the proxy (`NO_PROXY` is never kept:
/// the kernel starts the worker with only `environment::kept`).
pub const VARIABLES: [&str; 6] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
];

/// Brings `lo` up in the network namespace just entered (the namespace's creator holds
/// `CAP_NET_ADMIN` in it until the capabilities layer drops everything).
pub fn loopback_up() -> Result<(), String> {
    // SAFETY: plain syscalls on a descriptor this function owns; `ifreq` is zeroed and its
    // name is a NUL-terminated "lo".
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(format!("socket: {}", std::io::Error::last_os_error()));
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let mut req: libc::ifreq = std::mem::zeroed();
        for (d, s) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *d = *s as libc::c_char;
        }
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(format!(
                "SIOCGIFFLAGS lo: {}",
                std::io::Error::last_os_error()
            ));
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(format!(
                "cannot bring lo up: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// Listens on [`PROXY_ADDRESS`] in this process's network namespace, hands the socket to
/// the kernel through [`PROXY_FD`] and closes both here; returns the port.
pub fn hand_over() -> Result<u16, String> {
    // SAFETY: the kernel put the Unix socket at PROXY_FD for this worker alone; taking it
    // here means it is closed when this function returns, whatever happens.
    let channel = unsafe { OwnedFd::from_raw_fd(PROXY_FD) };
    if nix::sys::stat::fstat(&channel)
        .map(|st| st.st_mode & libc::S_IFMT != libc::S_IFSOCK)
        .unwrap_or(true)
    {
        std::mem::forget(channel);
        return Err(format!("fd {PROXY_FD} is not the kernel's socket"));
    }
    let listener = std::net::TcpListener::bind((PROXY_ADDRESS, 0))
        .map_err(|e| format!("cannot listen on {PROXY_ADDRESS}: {e}"))?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("cannot read the proxy's port: {e}"))?
        .port();
    let fds = [listener.as_raw_fd()];
    let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
    let payload = port.to_be_bytes();
    let iov = [std::io::IoSlice::new(&payload)];
    nix::sys::socket::sendmsg::<()>(
        channel.as_raw_fd(),
        &iov,
        &cmsg,
        nix::sys::socket::MsgFlags::empty(),
        None,
    )
    .map_err(|e| format!("cannot hand the proxy's socket to the kernel: {e}"))?;
    Ok(port)
}

/// Points the cells' HTTP clients at the proxy. Runs while the process is single-threaded.
pub fn set_variables(port: u16) {
    let url = format!("http://{PROXY_ADDRESS}:{port}");
    for name in VARIABLES {
        // SAFETY (of the environment): one thread, before Python starts.
        std::env::set_var(name, &url);
    }
    for name in ["NO_PROXY", "no_proxy"] {
        std::env::remove_var(name);
    }
}
