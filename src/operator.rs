//! Who runs an administrative command, as the records of what it did keep it (`outbox replay`
//! writes it into `replays`): the process's operating-system user id, the user's name looked up
//! from that id, the login user when it differs (under `sudo` or `su`), and the host. Never
//! `$USER`, `$LOGNAME` or `$SUDO_USER`, which whoever runs a command sets as they like. The
//! database's name for the session, `current_user`, is the other half of the record: the
//! statement that writes the record takes it there.

use std::ffi::CStr;

/// The user running this process, as a record names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    /// The process's real user id.
    pub uid: u32,
    /// `alice@ops1`; `alice (as root)@ops1` when alice logged in and runs it as root;
    /// `uid 1234@ops1` for an id without a name.
    pub display: String,
}

impl Operator {
    /// The user running this process.
    pub fn current() -> Self {
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        let name = |uid| user_name(uid).unwrap_or_else(|| format!("uid {uid}"));
        let user = match login_uid().filter(|login| *login != uid) {
            Some(login) => format!("{} (as {})", name(login), name(uid)),
            None => name(uid),
        };
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|name| name.trim().to_owned())
            .unwrap_or_else(|_| "unknown host".into());
        Self {
            uid,
            display: format!("{user}@{host}"),
        }
    }
}

/// The kernel's audit login id: set at login (by pam_loginuid) and kept through `sudo` and
/// `su`, which no process can change without CAP_AUDIT_CONTROL. None when the process does not
/// descend from a login (a service, a container): the file then holds 4294967295.
fn login_uid() -> Option<u32> {
    std::fs::read_to_string("/proc/self/loginuid")
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|uid| *uid != u32::MAX)
}

/// The name of `uid` in the user database (`/etc/passwd`, or what NSS reads instead).
fn user_name(uid: u32) -> Option<String> {
    let mut buffer = vec![0 as libc::c_char; 1024];
    loop {
        // SAFETY: an all-zero passwd is a valid value of the C struct (null pointers, zeros);
        // getpwuid_r fills it only with pointers into `buffer`, which outlives every use of
        // them below.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call, `buffer.len()` is its real size.
        let code = unsafe {
            libc::getpwuid_r(
                uid,
                &mut entry,
                buffer.as_mut_ptr(),
                buffer.len(),
                &mut found,
            )
        };
        if code == libc::ERANGE && buffer.len() < 1 << 20 {
            buffer.resize(buffer.len() * 4, 0);
            continue;
        }
        if code != 0 || found.is_null() || entry.pw_name.is_null() {
            return None;
        }
        // SAFETY: on success pw_name points to a NUL-terminated string inside `buffer`.
        let name = unsafe { CStr::from_ptr(entry.pw_name) };
        return Some(name.to_string_lossy().into_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operator_is_the_process_user() {
        let operator = Operator::current();
        // SAFETY: getuid has no preconditions.
        assert_eq!(operator.uid, unsafe { libc::getuid() });
        assert!(operator.display.contains('@'), "{}", operator.display);
        assert_eq!(user_name(0).as_deref(), Some("root"));
        assert_eq!(user_name(u32::MAX - 1), None);
    }
}
