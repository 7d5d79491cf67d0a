//! The random value that identifies one acquisition.

use rand::RngExt;

/// 160 bits from the thread-local CSPRNG (ChaCha, seeded and periodically reseeded from
/// the OS), hex-encoded. Unique per acquisition, so only the holder can release or extend.
pub(crate) fn random_value() -> String {
    let bytes: [u8; 20] = rand::rng().random();
    let mut out = String::with_capacity(40);
    for byte in bytes {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_long_hex_and_distinct() {
        let a = random_value();
        let b = random_value();
        assert_eq!(a.len(), 40);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
