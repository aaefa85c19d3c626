//! A request read after its conversation's previous request (its scan resumed:
//! `scan::Object::parse_after`, which compares the bytes the two share instead of scanning
//! them again, then `Dialect::view_scanned`, as the proxy's memory reads it) is read
//! exactly as from scratch (`Dialect::view`): for every client's shape, for the usual next request
//! (one message more), and for the next request with any one byte changed, removed or
//! cut off anywhere (inside a message, in a top-level field before the history, in the
//! last message, after the history).

mod fixture_support;

use bytes::Bytes;
use fixture_support::{fixture, REQUESTS};
use loopwarden::dialect::{Dialect, ParseError};
use loopwarden::request_bytes::RequestBytes;
use loopwarden::scan::{Object, Scanned, SharedPrefix};

/// What a resumed read gives: the view (as text), how many messages it found unchanged,
/// and the body's scan.
type Read = Result<(String, usize, Option<Scanned>), ParseError>;

/// Reads `body` as the proxy's memory does: its scan resumed after `before` when it can be,
/// else from the start; then the dialect's view of it. `None` for a body in two pieces
/// that cannot be resumed (the proxy reads it joined).
fn read_after(
    dialect: Dialect,
    body: &RequestBytes,
    before: Option<&Scanned>,
    prefix: Option<&SharedPrefix>,
) -> Option<Read> {
    let resumed = before.and_then(|b| Object::parse_after(body, dialect.history_key(), b, prefix));
    let object = match (resumed, body.whole()) {
        (Some(object), _) => object,
        (None, Some(whole)) => match dialect.scan(whole) {
            Ok(object) => object,
            Err(e) => return Some(Err(e)),
        },
        (None, None) => return None,
    };
    Some(match dialect.view_scanned(&object, false) {
        Ok(view) => Ok((
            format!("{view:?}"),
            object.unchanged(),
            object.into_scanned(body),
        )),
        Err(e) => Err(e),
    })
}

/// The scan of `body` as the proxy keeps it for the conversation's next request.
fn scanned(dialect: Dialect, body: &Bytes) -> Scanned {
    let read = read_after(dialect, &RequestBytes::from(body.clone()), None, None);
    let (_, _, scanned) = read.expect("one piece").expect("fixture parses");
    scanned.expect("a parsed body has a scan")
}

/// Reads `body` after `before` and from scratch, and checks that both say the same (the
/// same view, or the same error). Returns how many messages the resumed read found
/// unchanged.
///
/// The resumed read is made twice: comparing the shared bytes itself, and told by a
/// [`SharedPrefix`] how many were already compared while the body arrived in `pieces`
/// (the proxy's way); both must read as from scratch. So must the body in two pieces, as
/// the proxy keeps one that shares a history with the last body: its head that body's
/// bytes up to the last message both share ([`Scanned::split_for`]), its tail its own.
fn same_as_cold(dialect: Dialect, before: &Scanned, body: Vec<u8>) -> usize {
    let body = Bytes::from(body);
    let thirds = [body.len() / 3, body.len() * 2 / 3];
    same_as_cold_in_pieces(dialect, before, body, &thirds)
}

/// [`same_as_cold`] with the body arriving in pieces cut at `cuts`.
fn same_as_cold_in_pieces(
    dialect: Dialect,
    before: &Scanned,
    body: Bytes,
    cuts: &[usize],
) -> usize {
    let cold = dialect.view(&body, false).map(|v| format!("{v:?}"));
    let mut prefix = SharedPrefix::new(before);
    let mut from = 0;
    for &cut in cuts.iter().chain([&body.len()]) {
        prefix.arrived(&body[from..cut]);
        from = cut;
    }
    let whole = RequestBytes::from(body.clone());
    let mut unchanged = None;
    for prefix in [None, Some(&prefix)] {
        let resumed = read_after(dialect, &whole, Some(before), prefix).expect("one piece");
        let found = match &resumed {
            Ok((_, unchanged, _)) => *unchanged,
            _ => 0,
        };
        assert_eq!(
            *unchanged.get_or_insert(found),
            found,
            "with {prefix:?}",
            prefix = prefix.is_some()
        );
        let resumed = resumed.map(|(v, _, _)| v);
        match (&cold, &resumed) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{}", String::from_utf8_lossy(&body)),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
            _ => panic!(
                "cold {cold:?} vs resumed {resumed:?} on {}",
                String::from_utf8_lossy(&body)
            ),
        }
    }
    let split = before
        .split_for(dialect.history_key(), prefix.equal())
        .filter(|&at| at > 0);
    if let Some(at) = split {
        let two = RequestBytes::split(before.body().head().slice(..at), body.slice(at..));
        let read = read_after(dialect, &two, Some(before), Some(&prefix));
        match (&cold, read.map(|r| r.map(|(v, _, _)| v))) {
            (Ok(a), Some(Ok(b))) => assert_eq!(a, &b, "split at {at}"),
            // Not resumed: the proxy reads it joined, which gives the cold reading.
            (_, None) => {}
            (Err(a), Some(Err(b))) => assert_eq!(a.to_string(), b.to_string()),
            (cold, read) => panic!(
                "split at {at}: cold {cold:?} vs {read:?} on {}",
                String::from_utf8_lossy(&body)
            ),
        }
    }
    unchanged.unwrap_or(0)
}

#[test]
fn the_next_request_reads_as_from_scratch() {
    for (dialect, name) in REQUESTS {
        let first = Bytes::from(fixture(name));
        let before = scanned(dialect, &first);
        let messages = dialect.view(&first, false).unwrap().messages.len();
        // The next request: the same bytes and one message more (spliced in by the
        // reminder append, which keeps every earlier byte).
        let next = dialect
            .append_reminder(&first, "one more turn")
            .expect(name);
        let unchanged = same_as_cold(dialect, &before, next.clone());
        // Every message but the last one (the append may have grown it) is recognised
        // without comparing; a plain string input is one message that is not an array.
        if dialect.view(&first, false).unwrap().messages.len() > 1 {
            assert!(
                unchanged + 1 >= messages,
                "{name}: {unchanged} of {messages}"
            );
        }
        // The proxy keeps the next request in two pieces (checked in `same_as_cold`).
        if messages > 1 {
            let shared = before.split_for(dialect.history_key(), first.len() - 1);
            assert!(shared.is_some_and(|at| at > 0), "{name}");
        }
        // The same body again: every message is unchanged.
        let again = same_as_cold(dialect, &before, first.to_vec());
        if messages > 1 {
            assert_eq!(again, messages, "{name}");
        }
        // Arriving in pieces of any size (here 1 to 61 bytes), and the next request too.
        for body in [first.clone(), Bytes::from(next)] {
            let cuts: Vec<usize> = (1..body.len())
                .scan(0, |at, i| {
                    *at += 1 + i % 61;
                    Some(*at)
                })
                .take_while(|&at| at < body.len())
                .collect();
            same_as_cold_in_pieces(dialect, &before, body, &cuts);
        }
    }
}

#[test]
fn a_next_request_differing_anywhere_reads_as_from_scratch() {
    for (dialect, name) in REQUESTS {
        let first = Bytes::from(fixture(name));
        let before = scanned(dialect, &first);
        let next = dialect
            .append_reminder(&first, "one more turn")
            .expect(name);
        for p in 0..next.len() {
            let mut changed = next.clone();
            changed[p] = if changed[p] == b'x' { b'y' } else { b'x' };
            same_as_cold(dialect, &before, changed);
            let mut removed = next.clone();
            removed.remove(p);
            same_as_cold(dialect, &before, removed);
            same_as_cold(dialect, &before, next[..p].to_vec());
        }
    }
}
