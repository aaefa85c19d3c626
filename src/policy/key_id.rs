//! An API key's fingerprint: what a policy matches a team's key on without the key itself
//! ever being written into the config or the log. `loopwarden key-id` prints it for a key
//! read from stdin.

use http::HeaderMap;

/// Hex digits of a fingerprint: 48 bits, plenty to tell a team's keys apart, far too few
/// to stand for the key.
pub const LEN: usize = 12;

/// The fingerprint of `key`: the first [`LEN`] hex digits of its keyed BLAKE3 hash, under
/// a key of loopwarden's own (so it matches no other hash of the key one might publish).
/// Worked out for every request when some policy matches on keys: the hashing key is made
/// once, and the digits written without allocating each.
pub fn of(key: &str) -> String {
    static HASH_KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    let hash_key =
        HASH_KEY.get_or_init(|| blake3::derive_key("loopwarden 2026-11 API key fingerprint", b""));
    let hash = blake3::keyed_hash(hash_key, key.trim().as_bytes());
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = String::with_capacity(LEN);
    for b in &hash.as_bytes()[..LEN / 2] {
        id.push(HEX[usize::from(b >> 4)] as char);
        id.push(HEX[usize::from(b & 0xf)] as char);
    }
    id
}

/// Whether `text` has the shape of a fingerprint (what a `match.key_id` must be).
pub fn looks_like(text: &str) -> bool {
    text.len() == LEN
        && text
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// The API key a request carries, where each API puts it: `Authorization: Bearer` (OpenAI,
/// and gateways in front of the others), `x-api-key` (Anthropic), `x-goog-api-key` or the
/// `key` query parameter (Gemini).
pub fn key_of<'a>(headers: &'a HeaderMap, query: Option<&'a str>) -> Option<&'a str> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    header("authorization")
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .or_else(|| header("x-api-key"))
        .or_else(|| header("x-goog-api-key"))
        .or_else(|| query?.split('&').find_map(|kv| kv.strip_prefix("key=")))
        .map(str::trim)
        .filter(|k| !k.is_empty())
}

/// `loopwarden key-id`: the fingerprint of the key on stdin (one line; a key is never
/// taken as an argument, where the shell's history and `ps` would keep it).
pub fn run() -> anyhow::Result<()> {
    let mut key = String::new();
    std::io::stdin().read_line(&mut key)?;
    let key = key.trim();
    let key = key.strip_prefix("Bearer ").unwrap_or(key);
    if key.is_empty() {
        anyhow::bail!("no key on stdin: try `printf %s \"$OPENAI_API_KEY\" | loopwarden key-id`");
    }
    println!("{}", of(key));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_is_short_stable_and_not_the_key() {
        let id = of("sk-test-0123456789abcdef");
        assert!(looks_like(&id), "{id}");
        assert_eq!(
            id,
            of(" sk-test-0123456789abcdef\n"),
            "what stdin adds is ignored"
        );
        assert_ne!(id, of("sk-test-0123456789abcdeg"));
        assert!(!id.contains("sk-"));
    }

    #[test]
    fn the_key_is_found_where_each_api_puts_it() {
        let mut h = HeaderMap::new();
        assert_eq!(key_of(&h, Some("alt=sse&key=AIza1")), Some("AIza1"));
        h.insert("x-goog-api-key", "AIza2".parse().unwrap());
        assert_eq!(key_of(&h, None), Some("AIza2"));
        h.insert("x-api-key", "sk-ant-1".parse().unwrap());
        assert_eq!(key_of(&h, None), Some("sk-ant-1"));
        h.insert("authorization", "Bearer sk-proj-1".parse().unwrap());
        assert_eq!(key_of(&h, None), Some("sk-proj-1"));
        assert_eq!(key_of(&HeaderMap::new(), None), None);
    }
}
