//! The spill file: log records that could not be written by the time the proxy had to exit
//! (the database unreachable, its directory gone, the disk full), kept as JSON lines, one
//! [`Record`] each, for the next start to write into the log before it serves
//! ([`super::Store::take_in_spill`]).
//!
//! The records hold what the log holds and nothing more: no request header is ever part of
//! a row, so no API key or `Authorization` value can reach the file, and every free text in
//! them is masked ([`super::Masked`]) before it becomes a record.
//!
//! Lines are appended (a spill left by a start that failed is not overwritten) and synced
//! before the writer says they are spilled. Reading skips a line that is not a record
//! (a torn last line, an edit by hand) and says which; such lines are kept beside the file
//! (`.rejected`) rather than deleted with it.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use super::Record;

/// Appends `records` to the spill file at `path` (created if missing, with its directory),
/// one JSON line each, and syncs it.
///
/// The directory is made again when it is gone: the default place is beside a SQLite
/// database, and a database whose directory was removed is one of the cases a spill is
/// for. The next start finds the file where the configuration says it is.
pub(super) fn append(path: &Path, records: &[Record]) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let mut out = std::io::BufWriter::new(file);
    for record in records {
        serde_json::to_writer(&mut out, record)?;
        out.write_all(b"\n")?;
    }
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()
}

/// What a spill file held.
#[derive(Debug, Default)]
pub(super) struct Spilled {
    pub(super) records: Vec<Record>,
    /// Lines that are not records: (line number from 1, the line, why).
    pub(super) rejected: Vec<(usize, String, String)>,
}

/// Reads the spill file at `path`; `None` when there is none.
pub(super) fn read(path: &Path) -> std::io::Result<Option<Spilled>> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut spilled = Spilled::default();
    for (i, line) in std::io::BufReader::new(file).split(b'\n').enumerate() {
        let line = line?;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Record>(&line) {
            Ok(record) => spilled.records.push(record),
            Err(e) => {
                let text = String::from_utf8_lossy(&line).into_owned();
                spilled.rejected.push((i + 1, text, e.to_string()));
            }
        }
    }
    Ok(Some(spilled))
}

/// Where the lines of a spill file that were not records are kept.
pub(super) fn rejected_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".rejected");
    PathBuf::from(name)
}

/// Keeps the rejected lines (appended to [`rejected_path`]).
pub(super) fn keep_rejected(
    path: &Path,
    rejected: &[(usize, String, String)],
) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(rejected_path(path))?;
    for (_, line, _) in rejected {
        file.write_all(line.as_bytes())?;
        file.write_all(b"\n")?;
    }
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ConversationSeen, RequestRow};

    #[test]
    fn records_read_back_as_they_were_spilled_and_a_bad_line_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.spill.jsonl");
        let mut row = RequestRow::sample(7);
        row.parse_error = Some("token sk-ant-api03-abcdefghijklmnopqrstuvwx".into());
        let records = [
            Record::Request(Box::new(row)),
            Record::Conversation(ConversationSeen {
                id: "c".into(),
                id_source: "path".into(),
                client: None,
                dialect: Some("anthropic".into()),
                model: None,
                at_ms: 7,
                overhead_us: 3,
                team: Some("ci".into()),
            }),
        ];
        append(&path, &records[..1]).unwrap();
        // A torn line, as a crash in the middle of a write leaves.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"request\": {\"id\": 1\n")
            .unwrap();
        append(&path, &records[1..]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("abcdefghijklmnop"), "masked: {text}");

        let read = read(&path).unwrap().unwrap();
        assert_eq!(read.records.len(), 2);
        let Record::Request(r) = &read.records[0] else {
            panic!("{:?}", read.records[0])
        };
        assert_eq!((r.id, r.outcome.as_str()), (7, "complete"));
        let Record::Conversation(c) = &read.records[1] else {
            panic!("{:?}", read.records[1])
        };
        assert_eq!(
            (c.dialect.as_deref(), c.team.as_deref()),
            (Some("anthropic"), Some("ci"))
        );
        assert_eq!(read.rejected.len(), 1);
        assert_eq!(read.rejected[0].0, 2, "the line number");
        assert!(super::read(&dir.path().join("none")).unwrap().is_none());
    }
}
