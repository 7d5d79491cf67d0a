//! Which response headers a stored response keeps.

/// Whether a header is hop-by-hop (RFC 9110, 7.6.1): it describes one connection, not
/// the response, so a stored response leaves it out (`connection`, `keep-alive`,
/// `proxy-authenticate`, `proxy-authorization`, `proxy-connection`, `te`, `trailer`,
/// `transfer-encoding`, `upgrade`), as it leaves out the headers a `Connection` header
/// names. `name` is compared without regard to case.
///
/// ```
/// assert!(redlock_idempotency::is_hop_by_hop("Transfer-Encoding"));
/// assert!(!redlock_idempotency::is_hop_by_hop("content-type"));
/// ```
pub fn is_hop_by_hop(name: &str) -> bool {
    [
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ]
    .iter()
    .any(|hop| name.eq_ignore_ascii_case(hop))
}
