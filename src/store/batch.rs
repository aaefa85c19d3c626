//! A batch's records, grouped the way every backend writes them: the rows that are many
//! per batch (requests, findings) gathered for multi-row inserts, and the upserts of one
//! key merged into one row that leaves what the upserts one by one would have left. A
//! backend only turns these into its statements (`super::sqlite::write`,
//! `super::postgres::write`).

use std::collections::HashMap;

use super::{ConversationSeen, FindingRow, Record, RequestRow, ToolCallRow};

/// Batch-local maps of at most a batch's entries: a fast hasher (foldhash) is safe here.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A batch's records by how they are written. Within each list, rows keep the order they
/// were logged in, and no two share a key: a later row of a key replaced the earlier one
/// (requests, decisions, content: the `INSERT OR REPLACE` of one at a time) or was merged
/// into it (sightings, tool calls).
#[derive(Default)]
pub(super) struct Batch<'a> {
    pub(super) requests: Vec<&'a RequestRow>,
    /// In the order logged: their ids follow it.
    pub(super) findings: Vec<&'a FindingRow>,
    pub(super) sightings: Vec<Sightings<'a>>,
    pub(super) calls: Vec<CallUpdates<'a>>,
    /// Decisions, interventions, content rows and runs' rows, in the order logged
    /// (decisions and content one per key).
    pub(super) others: Vec<&'a Record>,
}

/// What makes two records of a replaced kind the same row.
#[derive(PartialEq, Eq, Hash)]
enum Key<'a> {
    Request(i64),
    Decision(i64),
    Content(&'a str, Option<i64>),
}

impl<'a> Batch<'a> {
    pub(super) fn of(records: &'a [Record]) -> Batch<'a> {
        let mut batch = Batch::default();
        let mut sightings: Map<&str, usize> = Map::default();
        let mut calls: Map<(&str, i64, i64), usize> = Map::default();
        // Where each replaced row's last copy is (index into `requests` or `others`).
        // About one key per request: sized once rather than grown as the batch is read.
        let mut replaced: Map<Key<'a>, usize> =
            Map::with_capacity_and_hasher(records.len() / 2, Default::default());
        for record in records {
            match record {
                Record::Conversation(seen) => match sightings.get(seen.id.as_str()) {
                    Some(&i) => batch.sightings[i].add(seen),
                    None => {
                        sightings.insert(&seen.id, batch.sightings.len());
                        batch.sightings.push(Sightings::new(seen));
                    }
                },
                Record::ToolCall(t) => {
                    let key = (t.conversation_id.as_str(), t.step, t.call_index);
                    match calls.get(&key) {
                        Some(&i) => batch.calls[i].add(t),
                        None => {
                            calls.insert(key, batch.calls.len());
                            batch.calls.push(CallUpdates::new(t));
                        }
                    }
                }
                Record::Request(r) => {
                    let list = &mut batch.requests;
                    match replaced.get(&Key::Request(r.id)) {
                        Some(&i) => list[i] = r,
                        None => {
                            replaced.insert(Key::Request(r.id), list.len());
                            list.push(r);
                        }
                    }
                }
                Record::Finding(f) => batch.findings.push(f),
                Record::Intervention(_) | Record::Run(_) => batch.others.push(record),
                Record::Decision(d) => {
                    batch.replace_other(&mut replaced, Key::Decision(d.request_id), record)
                }
                Record::Content(c) => {
                    let key = Key::Content(&c.conversation_id, c.step);
                    batch.replace_other(&mut replaced, key, record)
                }
            }
        }
        batch
    }

    fn replace_other(
        &mut self,
        replaced: &mut Map<Key<'a>, usize>,
        key: Key<'a>,
        record: &'a Record,
    ) {
        match replaced.get(&key) {
            Some(&i) => self.others[i] = record,
            None => {
                replaced.insert(key, self.others.len());
                self.others.push(record);
            }
        }
    }
}

/// A batch's sightings of one conversation, written as one upsert: each upsert rewrites
/// the row and moves its `conversations_by_last_seen` entry, and a conversation that makes
/// many requests in one batch window (parallel calls, a load test) would do that per
/// request. The merged row is what the sightings one by one would have left.
pub(super) struct Sightings<'a> {
    /// Its id, id source and time are a new row's (`first_seen_ms`).
    pub(super) first: &'a ConversationSeen,
    /// The first sighting's with one, as `coalesce(client, excluded.client)` keeps.
    pub(super) client: Option<&'a str>,
    /// The last sighting's with one, as `coalesce(excluded.dialect, dialect)` keeps.
    pub(super) dialect: Option<&'a str>,
    pub(super) model: Option<&'a str>,
    pub(super) last_ms: i64,
    pub(super) requests: i64,
    pub(super) overhead_us: i64,
    /// The first sighting's with one, as `coalesce(team, excluded.team)` keeps.
    pub(super) team: Option<&'a str>,
}

impl<'a> Sightings<'a> {
    fn new(seen: &'a ConversationSeen) -> Self {
        Sightings {
            first: seen,
            client: seen.client.as_deref(),
            dialect: seen.dialect.as_deref(),
            model: seen.model.as_deref(),
            last_ms: seen.at_ms,
            requests: 1,
            overhead_us: seen.overhead_us,
            team: seen.team.as_deref(),
        }
    }

    fn add(&mut self, seen: &'a ConversationSeen) {
        self.client = self.client.or(seen.client.as_deref());
        self.dialect = seen.dialect.as_deref().or(self.dialect);
        self.model = seen.model.as_deref().or(self.model);
        self.last_ms = self.last_ms.max(seen.at_ms);
        self.requests += 1;
        self.overhead_us += seen.overhead_us;
        self.team = self.team.or(seen.team.as_deref());
    }
}

/// A batch's rows for one tool call (conversation, step, position), written as one upsert.
/// The same call is logged again by every request that carries the same step (a retried
/// or repeated request, parallel requests of one conversation, a load test), and each
/// upsert rewrote the row. The merged row is what the upserts one by one would have left:
/// the last row's columns, and for each result column the last value that was not NULL
/// (the upsert's `coalesce(excluded.x, x)`).
pub(super) struct CallUpdates<'a> {
    pub(super) last: &'a ToolCallRow,
    pub(super) result_hash: Option<&'a str>,
    pub(super) result_summary: Option<&'a str>,
    pub(super) is_error: Option<bool>,
}

impl<'a> CallUpdates<'a> {
    fn new(row: &'a ToolCallRow) -> Self {
        CallUpdates {
            last: row,
            result_hash: row.result_hash.as_deref(),
            result_summary: row.result_summary.as_deref(),
            is_error: row.is_error,
        }
    }

    fn add(&mut self, row: &'a ToolCallRow) {
        self.last = row;
        self.result_hash = row.result_hash.as_deref().or(self.result_hash);
        self.result_summary = row.result_summary.as_deref().or(self.result_summary);
        self.is_error = row.is_error.or(self.is_error);
    }
}
