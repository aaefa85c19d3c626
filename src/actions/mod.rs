//! What a tool call means: a read, a write, an edit, a command, a search. Detection
//! reasons about these meanings, never about tool names, so one detector serves every
//! agent.
//!
//! Each agent names its tools differently (CLIENTS.md §4.3): Claude Code `Read`/`Edit`,
//! Codex `exec_command` + freeform `apply_patch`, Gemini `read_file`/`replace`, opencode
//! `read`/`edit`, mini-swe-agent a single `bash`, OpenHands `str_replace_editor` +
//! `execute_bash`, SWE-agent `open`/`goto`/`edit`/`search_*`. The built-in profiles below
//! cover them; users map their own tools with [`ToolMapping`] in config. Shell commands
//! (the only tool of several agents) are read with a small tokenizer that tells reads,
//! searches, writes (`sed -i`, `> file`, heredocs, patches) and checks (tests, scripts,
//! builds) apart.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::normalize::hash64;
use crate::transcript::ToolCall;

mod infer;

pub use infer::{search_replace_blocks, Role, ToolCatalog};

/// The broad kind of a call.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    Read,
    Write,
    Edit,
    Exec,
    Search,
    #[default]
    Other,
}

/// One change a call makes (or tries to make) to a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The whole new content is known: its hash and size in bytes.
    Write {
        path: String,
        hash: u64,
        size: usize,
    },
    /// A replacement of `old` by `new` (hashes of the texts), as Edit/str_replace/patch hunks.
    Edit { path: String, old: u64, new: u64 },
    /// The file changes in a way the call does not spell out (`sed -i`, SWE-agent line
    /// edits, `rm`, a patch file applied by a command).
    Opaque { path: String, detail: u64 },
}

impl Change {
    pub fn path(&self) -> &str {
        match self {
            Change::Write { path, .. }
            | Change::Edit { path, .. }
            | Change::Opaque { path, .. } => path,
        }
    }
}

/// What a call means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolAction {
    pub kind: ActionKind,
    /// The file the call is about (read, write, edit; SWE-agent's open file for its views).
    pub path: Option<String>,
    /// Region of a read (offset/limit, line range) so paging is not "the same read".
    pub region: Option<String>,
    /// Changes to files.
    pub changes: Vec<Change>,
    /// The call may change the world beyond the files it names (installs, moves, deletes).
    pub mutating: bool,
    /// What a check command checks (test target, script, build), when it runs one.
    /// `cd repo && python x.py` and `python /abs/x.py` give the same key.
    pub check: Option<String>,
    /// The shell command as the agent wrote it, for summaries people read (keys and hashes
    /// use the normalized form).
    pub command: Option<String>,
    /// The search target (pattern) of a search.
    pub search: Option<String>,
    /// Canonical intent: equal for calls that differ only in key order, whitespace, flag
    /// order or trivially different shell spellings.
    pub key: String,
    /// Hash of [`ToolAction::key`].
    pub key_hash: u64,
}

/// A user's mapping of one of their own tools (config `[detect.tools.NAME]`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolMapping {
    /// read, write, edit, exec, search or other.
    pub kind: Option<ActionKind>,
    /// Argument holding the file path.
    pub path: Option<String>,
    /// Argument holding the full new content (write).
    pub content: Option<String>,
    /// Arguments holding the old and new text (edit).
    pub old: Option<String>,
    pub new: Option<String>,
    /// Argument holding a shell command (exec).
    pub command: Option<String>,
    /// Argument holding a patch in Codex `*** Begin Patch` or unified-diff form.
    pub patch: Option<String>,
    /// Argument holding a search pattern.
    pub pattern: Option<String>,
}

/// What a call sees of the session around it: SWE-agent's views and edits act on the file
/// its editor has open, which only the previous result's trailer names; the tool
/// definitions the request carries say what a tool no profile knows takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallContext<'a> {
    pub open_file: Option<&'a str>,
    pub tools: Option<&'a ToolCatalog>,
}

/// Classifies a call: user mappings first, then the built-in agent profiles, then what
/// the call's arguments (and its tool's definition) say ([`infer`]).
pub fn classify(
    call: &ToolCall,
    user: &BTreeMap<String, ToolMapping>,
    ctx: &CallContext<'_>,
) -> ToolAction {
    if let Some(m) = user.get(&call.name) {
        return from_mapping(call, m);
    }
    builtin(call, ctx)
        .or_else(|| infer::infer(call, ctx))
        .unwrap_or_else(|| other(call))
}

fn arg<'a>(call: &'a ToolCall, name: &str) -> Option<&'a str> {
    call.args.get(name).and_then(|v| v.as_str())
}

fn arg_any<'a>(call: &'a ToolCall, names: &[&str]) -> Option<&'a str> {
    names.iter().find_map(|n| arg(call, n))
}

/// The built-in profiles. Tool names overlap between agents (`bash`, `edit`, `read`), so
/// the argument shape decides where names alone do not.
fn builtin(call: &ToolCall, ctx: &CallContext<'_>) -> Option<ToolAction> {
    let name = call.name.as_str();
    match name {
        // Shell tools: Claude Code Bash, mini-swe-agent/SWE-agent/opencode bash, Codex
        // exec_command (cmd), Gemini run_shell_command, OpenHands execute_bash.
        "Bash" | "bash" | "exec_command" | "run_shell_command" | "execute_bash" | "shell"
        | "local_shell" | "terminal" => shell_call(call),
        // Claude Code Read, Gemini read_file, opencode read.
        "Read" | "read_file" | "read" | "view" | "cat" => {
            let path = arg_any(call, &["file_path", "filePath", "path", "absolute_path"])?;
            let region = region_of(
                call,
                &["offset", "limit", "start_line", "end_line", "pages"],
            );
            Some(read(call, path, region))
        }
        // Claude Code Write, Gemini write_file, opencode write.
        "Write" | "write_file" | "write" | "create_file" => {
            let path = arg_any(call, &["file_path", "filePath", "path"])?;
            let content = arg_any(call, &["content", "file_text", "text"]).unwrap_or("");
            Some(write(call, path, content))
        }
        // Claude Code Edit, Gemini replace, opencode edit; SWE-agent edit has line numbers.
        "Edit" | "replace" | "edit" | "str_replace" => {
            if let (Some(old), Some(new)) = (
                arg_any(call, &["old_string", "oldString", "old_str"]),
                arg_any(call, &["new_string", "newString", "new_str"]),
            ) {
                let path = arg_any(call, &["file_path", "filePath", "path"]).unwrap_or("");
                return Some(edit(call, path, old, new));
            }
            if call.args.get("replacement_text").is_some() || call.args.get("raw").is_some() {
                return Some(swe_line_edit(call, ctx));
            }
            None
        }
        "MultiEdit" => multi_edit(call),
        // Codex freeform apply_patch (input is the patch string), opencode apply_patch.
        "apply_patch" => {
            let patch = match &call.args {
                serde_json::Value::String(s) => s.as_str(),
                v => ["input", "patch", "patchText"]
                    .iter()
                    .find_map(|k| v.get(*k).and_then(|x| x.as_str()))?,
            };
            Some(patch_action(call, patch))
        }
        // OpenHands (and Anthropic's text editor tool).
        "str_replace_editor" | "str_replace_based_edit_tool" | "text_editor" => text_editor(call),
        // SWE-agent's editor: views of the open file, searches, creation, submission.
        "open" => {
            let path = arg(call, "path")?;
            let line = call.args.get("line_number").map(|v| v.to_string());
            Some(read(call, path, line))
        }
        "goto" | "scroll_up" | "scroll_down" => {
            // A view of the open file at a place: paging, keyed by where it lands (the
            // result says), so it only repeats when it shows the same lines.
            let path = ctx.open_file.unwrap_or("");
            let mut a = read(call, path, Some(call.canonical_args()));
            a.key = format!("{}:{}", call.name, call.canonical_args());
            a.key_hash = hash64(a.key.as_bytes());
            Some(a)
        }
        "create" => {
            let path = arg_any(call, &["filename", "path"])?;
            Some(write(call, path, ""))
        }
        "search_dir"
        | "search_file"
        | "find_file"
        | "Grep"
        | "grep"
        | "grep_search"
        | "Glob"
        | "glob"
        | "search_file_content" => {
            let pattern = arg_any(
                call,
                &["search_term", "file_name", "pattern", "query", "regex"],
            )
            .unwrap_or("");
            let mut a = simple(call, ActionKind::Search, None);
            a.search = Some(pattern.to_string());
            Some(a)
        }
        "LS" | "list_directory" | "list" | "ls" => {
            let path = arg_any(call, &["path", "dir_path", "dirPath", "directory"]).unwrap_or(".");
            Some(read(call, path, Some("dir".into())))
        }
        _ => None,
    }
}

/// A shell tool's call: its command line, or other input to a running command.
fn shell_call(call: &ToolCall) -> Option<ToolAction> {
    let cmd = match call.args.get("command").or_else(|| call.args.get("cmd")) {
        Some(serde_json::Value::String(s)) => s.clone(),
        // Older Codex `shell {command: ["bash","-lc","..."]}`.
        Some(serde_json::Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.as_str())
            .next_back()
            .unwrap_or("")
            .to_string(),
        _ => return None,
    };
    // OpenHands sends keystrokes (`C-c`) to a running command as input.
    if arg(call, "is_input") == Some("true") {
        return Some(simple(call, ActionKind::Other, None));
    }
    Some(shell(&cmd))
}

/// Claude Code's `MultiEdit`: several replacements in one file.
fn multi_edit(call: &ToolCall) -> Option<ToolAction> {
    let path = arg_any(call, &["file_path", "filePath"])?;
    let edits = call.args.get("edits")?.as_array()?;
    let changes = edits
        .iter()
        .map(|e| Change::Edit {
            path: path.to_string(),
            old: hash64(
                e.get("old_string")
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .as_bytes(),
            ),
            new: hash64(
                e.get("new_string")
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .as_bytes(),
            ),
        })
        .collect();
    let mut a = simple(call, ActionKind::Edit, Some(path));
    a.changes = changes;
    Some(a)
}

/// OpenHands' editor (and Anthropic's text editor tool): one tool, its `command` says what.
fn text_editor(call: &ToolCall) -> Option<ToolAction> {
    let path = arg(call, "path").unwrap_or("");
    match arg(call, "command").unwrap_or("") {
        "view" => {
            let region = call.args.get("view_range").map(|v| v.to_string());
            Some(read(call, path, region))
        }
        "create" => Some(write(call, path, arg(call, "file_text").unwrap_or(""))),
        "str_replace" => Some(edit(
            call,
            path,
            arg(call, "old_str").unwrap_or(""),
            arg(call, "new_str").unwrap_or(""),
        )),
        "insert" => Some(opaque_edit(call, path)),
        "undo_edit" => {
            let mut a = simple(call, ActionKind::Edit, Some(path));
            a.changes.push(Change::Opaque {
                path: path.to_string(),
                detail: hash64(b"undo"),
            });
            Some(a)
        }
        _ => None,
    }
}

fn region_of(call: &ToolCall, keys: &[&str]) -> Option<String> {
    let parts: Vec<String> = keys
        .iter()
        .filter_map(|k| call.args.get(*k).map(|v| format!("{k}={v}")))
        .collect();
    (!parts.is_empty()).then(|| parts.join(","))
}

/// A call with no known meaning: its identity is its canonical arguments.
fn other(call: &ToolCall) -> ToolAction {
    simple(call, ActionKind::Other, None)
}

fn simple(call: &ToolCall, kind: ActionKind, path: Option<&str>) -> ToolAction {
    ToolAction {
        path: path.map(str::to_string),
        ..ToolAction::plain(kind, format!("{}:{}", call.name, call.canonical_args()))
    }
}

impl ToolAction {
    /// How a summary names the action, for the model and for people: the command as the
    /// agent wrote it, the file it reads, writes or edits, what it searches for, else the
    /// tool and its arguments. Never the key (`read:calc.py:`, `edit:calc.py:<hashes>`):
    /// keys are for comparing calls, and a reminder that quotes one reads as gibberish.
    pub fn label(&self) -> Cow<'_, str> {
        if let Some(command) = &self.command {
            return Cow::Borrowed(command);
        }
        let verb = match self.kind {
            ActionKind::Read => "read",
            ActionKind::Write => "write",
            ActionKind::Edit => "edit",
            ActionKind::Search => "search",
            ActionKind::Exec | ActionKind::Other => "",
        };
        let object = match self.kind {
            ActionKind::Search => self.search.as_deref(),
            _ => self.path.as_deref(),
        };
        match object.filter(|o| !o.is_empty() && !verb.is_empty()) {
            Some(object) => Cow::Owned(format!("{verb} {object}")),
            // A call known by its arguments: its key is `tool:{arguments}`.
            None => Cow::Owned(self.key.replacen(':', " ", 1)),
        }
    }

    /// An action that touches nothing and is known only by its key.
    pub fn plain(kind: ActionKind, key: String) -> ToolAction {
        ToolAction {
            kind,
            path: None,
            region: None,
            changes: Vec::new(),
            mutating: false,
            check: None,
            command: None,
            search: None,
            key_hash: hash64(key.as_bytes()),
            key,
        }
    }
}

fn read(call: &ToolCall, path: &str, region: Option<String>) -> ToolAction {
    let mut a = simple(call, ActionKind::Read, Some(path));
    a.key = format!(
        "read:{}:{}",
        norm_path(path),
        region.as_deref().unwrap_or("")
    );
    a.key_hash = hash64(a.key.as_bytes());
    a.region = region;
    a
}

fn write(call: &ToolCall, path: &str, content: &str) -> ToolAction {
    let mut a = simple(call, ActionKind::Write, Some(path));
    let hash = hash64(content.as_bytes());
    a.changes.push(Change::Write {
        path: path.to_string(),
        hash,
        size: content.len(),
    });
    a.key = format!("write:{}:{hash:x}", norm_path(path));
    a.key_hash = hash64(a.key.as_bytes());
    a
}

fn edit(call: &ToolCall, path: &str, old: &str, new: &str) -> ToolAction {
    let mut a = simple(call, ActionKind::Edit, Some(path));
    let (o, n) = (hash64(old.as_bytes()), hash64(new.as_bytes()));
    a.changes.push(Change::Edit {
        path: path.to_string(),
        old: o,
        new: n,
    });
    a.key = format!("edit:{}:{o:x}:{n:x}", norm_path(path));
    a.key_hash = hash64(a.key.as_bytes());
    a
}

/// A change to `path` that the call does not spell out (an insertion, a fragment, a
/// delete): known by the call's arguments.
fn opaque_edit(call: &ToolCall, path: &str) -> ToolAction {
    let mut a = simple(call, ActionKind::Edit, Some(path));
    a.changes.push(Change::Opaque {
        path: path.to_string(),
        detail: hash64(call.canonical_args().as_bytes()),
    });
    a
}

/// SWE-agent `edit start:end` replaces lines of the open file.
fn swe_line_edit(call: &ToolCall, ctx: &CallContext<'_>) -> ToolAction {
    let path = ctx.open_file.unwrap_or("");
    let mut a = simple(call, ActionKind::Edit, Some(path));
    a.changes.push(Change::Opaque {
        path: path.to_string(),
        detail: hash64(call.canonical_args().as_bytes()),
    });
    a.key = format!("edit:{}:{}", norm_path(path), call.canonical_args());
    a.key_hash = hash64(a.key.as_bytes());
    a
}

fn from_mapping(call: &ToolCall, m: &ToolMapping) -> ToolAction {
    let get = |k: &Option<String>| k.as_deref().and_then(|k| arg(call, k));
    if let Some(cmd) = get(&m.command) {
        return shell(cmd);
    }
    if let Some(patch) = get(&m.patch) {
        return patch_action(call, patch);
    }
    let path = get(&m.path).unwrap_or("");
    match m.kind.unwrap_or(ActionKind::Other) {
        ActionKind::Read => read(call, path, None),
        ActionKind::Write => write(call, path, get(&m.content).unwrap_or("")),
        ActionKind::Edit => edit(
            call,
            path,
            get(&m.old).unwrap_or(""),
            get(&m.new).unwrap_or(""),
        ),
        ActionKind::Search => {
            let mut a = simple(call, ActionKind::Search, None);
            a.search = get(&m.pattern).map(str::to_string);
            a
        }
        ActionKind::Exec => {
            let mut a = simple(call, ActionKind::Exec, None);
            a.mutating = true;
            a
        }
        ActionKind::Other => other(call),
    }
}

/// Paths compare by their last two components: agents name one file as `/workspace/repo/x.py`,
/// `repo/x.py` and `./x.py` depending on their working directory.
pub fn norm_path(path: &str) -> String {
    let p = path.trim().trim_end_matches('/');
    let mut parts = p.rsplit('/').filter(|s| !s.is_empty() && *s != ".");
    let last = parts.next().unwrap_or("");
    last.to_string()
}

// ---------------------------------------------------------------------------------------
// Patches

/// A Codex `*** Begin Patch` patch or a unified diff: one change per file, with the removed
/// and added lines of all its hunks as (old, new).
fn patch_action(call: &ToolCall, patch: &str) -> ToolAction {
    let changes = parse_patch(patch);
    let path = changes.first().map(|c| c.path().to_string());
    let kind = if changes.iter().all(|c| matches!(c, Change::Write { .. })) && !changes.is_empty() {
        ActionKind::Write
    } else {
        ActionKind::Edit
    };
    let mut a = simple(call, kind, path.as_deref());
    let mut key = String::from("patch");
    for c in &changes {
        match c {
            Change::Write { path, hash, .. } => {
                key.push_str(&format!(":w:{}:{hash:x}", norm_path(path)))
            }
            Change::Edit { path, old, new } => {
                key.push_str(&format!(":e:{}:{old:x}:{new:x}", norm_path(path)))
            }
            Change::Opaque { path, detail } => {
                key.push_str(&format!(":o:{}:{detail:x}", norm_path(path)))
            }
        }
    }
    a.changes = changes;
    a.key_hash = hash64(key.as_bytes());
    a.key = key;
    a
}

/// Parses the files a patch touches. Unknown lines are ignored: a malformed patch is still
/// an attempt to change those files.
pub fn parse_patch(patch: &str) -> Vec<Change> {
    #[derive(Default)]
    struct Pending {
        path: String,
        add: bool,
        delete: bool,
        old: String,
        new: String,
    }
    fn finish(p: Pending, out: &mut Vec<Change>) {
        if p.path.is_empty() {
            return;
        }
        if p.add {
            out.push(Change::Write {
                hash: hash64(p.new.as_bytes()),
                size: p.new.len(),
                path: p.path,
            });
        } else if p.delete {
            out.push(Change::Opaque {
                path: p.path,
                detail: hash64(b"delete"),
            });
        } else {
            out.push(Change::Edit {
                old: hash64(p.old.as_bytes()),
                new: hash64(p.new.as_bytes()),
                path: p.path,
            });
        }
    }
    let mut out = Vec::new();
    let mut cur: Option<Pending> = None;
    for line in patch.lines() {
        let header = [
            ("*** Update File: ", false, false),
            ("*** Add File: ", true, false),
            ("*** Delete File: ", false, true),
            ("+++ b/", false, false),
            ("+++ ", false, false),
        ]
        .iter()
        .find_map(|(p, add, del)| line.strip_prefix(p).map(|rest| (rest.trim(), *add, *del)));
        if let Some((path, add, delete)) = header {
            if path == "/dev/null" {
                continue;
            }
            if let Some(p) = cur.take() {
                finish(p, &mut out);
            }
            cur = Some(Pending {
                path: path.to_string(),
                add,
                delete,
                ..Pending::default()
            });
            continue;
        }
        let Some(p) = cur.as_mut() else { continue };
        if line.starts_with("---") || line.starts_with("***") || line.starts_with("@@") {
            continue;
        }
        if let Some(rest) = line.strip_prefix('+') {
            p.new.push_str(rest);
            p.new.push('\n');
        } else if let Some(rest) = line.strip_prefix('-') {
            p.old.push_str(rest);
            p.old.push('\n');
        }
    }
    if let Some(p) = cur.take() {
        finish(p, &mut out);
    }
    out
}

// ---------------------------------------------------------------------------------------
// Shell commands

/// One simple command of a shell line: its words (quotes removed) and where it redirects.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Simple {
    words: Vec<String>,
    /// Files written by `>` / `>>` (not /dev/null).
    writes_to: Vec<String>,
    /// The heredoc body fed to this command, if any.
    heredoc: Option<String>,
}

/// Splits a shell line into simple commands at `&&`, `||`, `;`, `|` and newlines, keeping
/// quoted text together and attaching heredoc bodies to their command. Not a full shell
/// parser: enough to tell what a command reads, writes and checks.
fn split_shell(cmd: &str) -> Vec<Simple> {
    let mut s = ShellSplitter::new(cmd);
    while s.i < s.chars.len() {
        let c = s.chars[s.i];
        match c {
            '\'' | '"' => s.quoted(c),
            '\\' => s.backslash(),
            ' ' | '\t' => {
                s.end_word();
                s.i += 1;
            }
            '<' if s.chars.get(s.i + 1) == Some(&'<') => s.heredoc_operator(),
            '>' => s.redirect(),
            '&' | '|' | ';' | '\n' => s.separator(c),
            '(' | ')' | '{' | '}' if !s.in_word => s.i += 1,
            '#' if !s.in_word => s.comment(),
            _ => {
                s.in_word = true;
                s.word.push(c);
                s.i += 1;
            }
        }
    }
    s.end_word();
    s.end_command();
    s.out
}

/// The state of [`split_shell`] as it walks a line. Each step reads from `chars[i]` and
/// leaves `i` at the first character it did not consume.
struct ShellSplitter {
    chars: Vec<char>,
    i: usize,
    /// The commands completed so far.
    out: Vec<Simple>,
    /// The command being read.
    cur: Simple,
    /// The word being read, and whether one is under way (`""` is a word).
    word: String,
    in_word: bool,
    /// The next word is the target of a `>`.
    pending_redirect: bool,
    /// The next word is a heredoc delimiter.
    pending_heredoc: bool,
    /// Heredocs whose bodies start on the next line: (command index, delimiter).
    heredoc_owner: Vec<(usize, String)>,
}

impl ShellSplitter {
    fn new(cmd: &str) -> ShellSplitter {
        ShellSplitter {
            chars: cmd.chars().collect(),
            i: 0,
            out: Vec::new(),
            cur: Simple::default(),
            word: String::new(),
            in_word: false,
            pending_redirect: false,
            pending_heredoc: false,
            heredoc_owner: Vec::new(),
        }
    }

    /// Ends the word under way: a redirect target, a heredoc delimiter (for the command
    /// that `out` will hold next) or one of the command's words.
    fn end_word(&mut self) {
        if !self.in_word {
            return;
        }
        let w = std::mem::take(&mut self.word);
        self.in_word = false;
        if self.pending_redirect {
            self.pending_redirect = false;
            if w != "/dev/null" && !w.starts_with('&') {
                self.cur.writes_to.push(w);
            }
        } else if std::mem::take(&mut self.pending_heredoc) {
            let delimiter = w.trim_matches(|c| c == '\'' || c == '"').to_string();
            self.heredoc_owner.push((self.out.len(), delimiter));
        } else {
            self.cur.words.push(w);
        }
    }

    /// Ends the command under way, unless it has neither words nor redirects.
    fn end_command(&mut self) {
        if !self.cur.words.is_empty() || !self.cur.writes_to.is_empty() {
            self.out.push(std::mem::take(&mut self.cur));
        }
    }

    /// Reads a quoted text (opened by `q`) into the word; in double quotes a backslash
    /// escapes the next character.
    fn quoted(&mut self, q: char) {
        let chars = &self.chars;
        self.in_word = true;
        self.i += 1;
        while self.i < chars.len() && chars[self.i] != q {
            if q == '"' && chars[self.i] == '\\' && self.i + 1 < chars.len() {
                self.i += 1;
            }
            self.word.push(chars[self.i]);
            self.i += 1;
        }
        self.i += 1;
    }

    /// Reads a backslash and the character after it: that character as it is, or nothing
    /// when it is a newline (a line continuation).
    fn backslash(&mut self) {
        if let Some(&c) = self.chars.get(self.i + 1).filter(|&&c| c != '\n') {
            self.in_word = true;
            self.word.push(c);
        }
        self.i += 2;
    }

    /// Skips a comment, up to the end of its line (the newline stays: it ends the command
    /// and opens the heredoc bodies of its line). Two calls that differ only in a comment
    /// are the same command.
    fn comment(&mut self) {
        while self.i < self.chars.len() && self.chars[self.i] != '\n' {
            self.i += 1;
        }
    }

    /// Reads `<<` or `<<-`: the next word is a heredoc delimiter. A here-string `<<<` is
    /// skipped: its word is input, not a delimiter.
    fn heredoc_operator(&mut self) {
        self.end_word();
        self.i += 2;
        if self.chars.get(self.i) == Some(&'-') {
            self.i += 1;
        }
        if self.chars.get(self.i) == Some(&'<') {
            self.i += 1;
            return;
        }
        while self.chars.get(self.i) == Some(&' ') {
            self.i += 1;
        }
        self.pending_heredoc = true;
    }

    /// Reads `>` or `>>`: the next word is a file the command writes, unless the
    /// redirect is to a file descriptor.
    fn redirect(&mut self) {
        self.end_word();
        let chars = &self.chars;
        // `2>&1`, `2>/dev/null`: a digit right before is a file descriptor.
        if let Some(last) = self.cur.words.last() {
            if last.chars().all(|c| c.is_ascii_digit()) && !last.is_empty() {
                self.cur.words.pop();
            }
        }
        if chars.get(self.i + 1) == Some(&'>') {
            self.i += 1;
        }
        if chars.get(self.i + 1) == Some(&'&') {
            // `>&2`: a descriptor, no file.
            self.i += 2;
            while self.i < chars.len() && chars[self.i].is_ascii_digit() {
                self.i += 1;
            }
            return;
        }
        self.pending_redirect = true;
        while chars.get(self.i + 1) == Some(&' ') {
            self.i += 1;
        }
        self.i += 1;
    }

    /// Reads `&&`, `||`, `;`, `|`, a background `&` or a newline (`c`): each ends the
    /// command. After a newline come the bodies of the heredocs opened on its line.
    fn separator(&mut self, c: char) {
        self.end_word();
        if (c == '&' || c == '|') && self.chars.get(self.i + 1) == Some(&c) {
            self.i += 1;
        }
        self.end_command();
        if c == '\n' {
            self.heredoc_bodies();
        }
        self.i += 1;
    }

    /// Reads the bodies of the pending heredocs, each up to its delimiter line, and gives
    /// each to its command (the one under way when that has not ended yet). Starts on the
    /// newline before the first body and ends on the newline after the last delimiter
    /// (or past the line's end).
    fn heredoc_bodies(&mut self) {
        let chars = &self.chars;
        let owners: Vec<(usize, String)> = std::mem::take(&mut self.heredoc_owner);
        for (idx, delim) in owners {
            let mut body = String::new();
            self.i += 1;
            let mut end_found = false;
            while self.i < chars.len() {
                let line_end = chars[self.i..]
                    .iter()
                    .position(|&ch| ch == '\n')
                    .map(|p| self.i + p)
                    .unwrap_or(chars.len());
                let line: String = chars[self.i..line_end].iter().collect();
                if line.trim() == delim {
                    self.i = line_end;
                    end_found = true;
                    break;
                }
                body.push_str(&line);
                body.push('\n');
                self.i = line_end + 1;
            }
            if !end_found {
                self.i = chars.len();
            }
            if let Some(cmd) = self.out.get_mut(idx) {
                cmd.heredoc = Some(body);
            } else {
                self.cur.heredoc = Some(body);
            }
            if self.i >= chars.len() {
                break;
            }
        }
    }
}

const READERS: &[&str] = &[
    "cat", "head", "tail", "less", "more", "nl", "bat", "view", "xxd", "od", "hexdump",
];
const SEARCHERS: &[&str] = &[
    "grep", "egrep", "fgrep", "rg", "ag", "ack", "find", "fd", "locate", "which", "whereis",
];
const LISTERS: &[&str] = &[
    "ls", "tree", "pwd", "wc", "file", "stat", "du", "df", "echo", "printf", "type", "env", "diff",
    "cmp", "true", "sort", "uniq", "cut", "tr", "awk", "jq", "date", "whoami", "id", "uname", "ps",
];
const MUTATORS: &[&str] = &[
    "rm", "mv", "cp", "mkdir", "rmdir", "touch", "chmod", "chown", "ln", "patch", "truncate",
    "unzip", "tar", "dd", "install", "kill", "pkill",
];
const INSTALLERS: &[&str] = &[
    "pip", "pip3", "apt", "apt-get", "npm", "yarn", "conda", "poetry", "gem", "brew", "uv",
];
/// Commands that run code or builds: their result is an outcome to judge progress by.
const CHECKERS: &[&str] = &[
    "python",
    "python3",
    "python2",
    "pytest",
    "py.test",
    "tox",
    "nox",
    "node",
    "npx",
    "ruby",
    "java",
    "javac",
    "mvn",
    "mvnw",
    "gradle",
    "gradlew",
    "make",
    "cmake",
    "cargo",
    "go",
    "rustc",
    "gcc",
    "g++",
    "clang",
    "sh",
    "bash",
    "zsh",
    "php",
    "perl",
    "deno",
    "bun",
    "dotnet",
    "ctest",
    "jest",
    "mocha",
    "vitest",
    "runtests.py",
    "django-admin",
    "sphinx-build",
    "tsc",
    "coverage",
    "ant",
    "sbt",
    "scala",
    "kotlinc",
    "swift",
    "R",
    "Rscript",
    "julia",
    "test",
];

fn base(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

/// Drops wrappers that do not change what runs: env assignments, `sudo`, `timeout N`,
/// `time`, `nohup`, `env`.
fn strip_wrappers(words: &[String]) -> &[String] {
    let mut w = words;
    loop {
        match w.first().map(String::as_str) {
            Some(first)
                if first.contains('=') && !first.starts_with('-') && !first.starts_with('=') =>
            {
                w = &w[1..]
            }
            Some("sudo" | "time" | "nohup" | "env" | "exec" | "command" | "stdbuf") => w = &w[1..],
            Some("timeout") => {
                w = &w[1..];
                while w.first().is_some_and(|x| {
                    x.starts_with('-') || x.chars().next().is_some_and(|c| c.is_ascii_digit())
                }) {
                    w = &w[1..];
                }
            }
            _ => return w,
        }
    }
}

/// A word as it should compare: interpreter versions and paths folded.
fn canon_word(w: &str) -> String {
    match w {
        "python3" | "python2" | "python3.9" | "python3.10" | "python3.11" | "python3.12" => {
            "python".into()
        }
        "pip3" => "pip".into(),
        "./mvnw" | "mvnw" => "mvn".into(),
        "./gradlew" | "gradlew" => "gradle".into(),
        "py.test" => "pytest".into(),
        _ if w.contains('/') && !w.starts_with("-") && !w.contains("::") => base(w).to_string(),
        _ if w.contains('/') && w.contains("::") => {
            // tests/test_x.py::TestA::test_b keeps its node id but not its directory
            let (path, rest) = w.split_once("::").unwrap_or((w, ""));
            format!("{}::{rest}", base(path))
        }
        _ => w.to_string(),
    }
}

/// Canonical form of a simple command: words canonicalized, flags sorted (flag order
/// never matters for what it means here).
fn canon_simple(words: &[String]) -> String {
    let words = strip_wrappers(words);
    let mut flags: Vec<String> = Vec::new();
    let mut rest: Vec<String> = Vec::new();
    for (i, w) in words.iter().enumerate() {
        if i > 0 && w.starts_with('-') && w.len() > 1 {
            flags.push(w.clone());
        } else {
            rest.push(canon_word(w));
        }
    }
    flags.sort();
    let mut out = rest;
    out.extend(flags);
    out.join(" ")
}

impl ActionKind {
    /// How telling a kind is when one command line does several things:
    /// a write or edit > a check run > a search > a read > anything else.
    fn rank(self) -> u8 {
        match self {
            ActionKind::Write | ActionKind::Edit => 4,
            ActionKind::Exec => 3,
            ActionKind::Search => 2,
            ActionKind::Read => 1,
            ActionKind::Other => 0,
        }
    }
}

/// Makes `kind` the more telling of itself and `new`; true when `new` took over.
fn promote(kind: &mut ActionKind, new: ActionKind) -> bool {
    let took = new.rank() > kind.rank();
    if took {
        *kind = new;
    }
    took
}

/// Reads a shell command line.
pub fn shell(cmd: &str) -> ToolAction {
    let parts = split_shell(cmd);
    let mut reading = ShellReading::new();
    for p in &parts {
        reading.read_command(p);
    }
    reading.into_action(cmd, &parts)
}

/// What a shell line does, gathered one simple command at a time; the most telling kind
/// any of them has is the line's (`promote`).
struct ShellReading {
    kind: ActionKind,
    changes: Vec<Change>,
    mutating: bool,
    check: Option<String>,
    path: Option<String>,
    region: Option<String>,
    search: Option<String>,
    /// The canonical form of each command that does something.
    key_parts: Vec<String>,
}

/// Whether a `find` changes what it finds: `-delete`, or `-exec`/`-execdir`/`-ok` running a
/// program that changes files (`rm`, `mv`, `chmod`, `sed -i`...). `find -exec grep` and
/// `-exec strings` only look.
fn find_changes(words: &[String]) -> bool {
    words.iter().enumerate().any(|(i, w)| match w.as_str() {
        "-delete" => true,
        "-exec" | "-execdir" | "-ok" | "-okdir" => {
            let program = words.get(i + 1).map(|p| base(p)).unwrap_or("");
            MUTATORS.contains(&program)
                || (matches!(program, "sed" | "perl")
                    && words[i + 1..]
                        .iter()
                        .take_while(|a| *a != ";" && *a != "+")
                        .any(|a| a.starts_with("-i") || a == "-pi"))
                || matches!(program, "sh" | "bash" | "xargs")
        }
        _ => false,
    })
}

/// A file an inline program only reads: it opens a literal path (`open('f')`,
/// `Path('f').read_text()`, `File.read('f')`, `fs.readFileSync('f')`) and imports nothing
/// it could run (a one-liner that imports the code under repair is a check, whatever it
/// opens).
fn inline_read(program: &str) -> Option<String> {
    if program.contains("import ") || program.contains("require(") {
        return None;
    }
    INLINE_OPEN
        .captures(program)
        .and_then(|c| c.get(1))
        .map(|m| m.as_str().to_string())
}

static INLINE_OPEN: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
    crate::normalize::re(
        r#"(?:\bopen|Path|File\.read|readFileSync|read_text)\(\s*['"]([^'"\s]+)['"]"#,
    )
});

/// The last word of a command line after the program that is not an option: the file a
/// `sed`, `awk` or `perl` call acts on.
fn last_operand(words: &[String]) -> Option<String> {
    words.iter().skip(1).rfind(|w| !w.starts_with('-')).cloned()
}

impl ShellReading {
    fn new() -> ShellReading {
        ShellReading {
            kind: ActionKind::Other,
            changes: Vec::new(),
            mutating: false,
            check: None,
            path: None,
            region: None,
            search: None,
            key_parts: Vec::new(),
        }
    }

    /// Reads one simple command of the line.
    fn read_command(&mut self, p: &Simple) {
        let words = strip_wrappers(&p.words);
        let first = words.first().map(|w| base(w)).unwrap_or("");
        // `cd x && cmd`: the directory is where it runs, not what it does.
        if first == "cd"
            || first == "pushd"
            || first == "popd"
            || first == "source"
            || first == "."
            || first == "set"
            || first == "export"
        {
            return;
        }
        self.key_parts.push(canon_simple(&p.words));
        self.note_redirects(p, words, first);
        self.note_program(p, words, first);
    }

    /// Records the files a command writes through `>`: a write of known content when a
    /// heredoc or `echo`/`printf` spells it out, an opaque change otherwise.
    fn note_redirects(&mut self, p: &Simple, words: &[String], first: &str) {
        for target in &p.writes_to {
            let content = p.heredoc.as_deref().unwrap_or("");
            if p.heredoc.is_some() || matches!(first, "echo" | "printf") {
                let body = if p.heredoc.is_some() {
                    content.to_string()
                } else {
                    words
                        .iter()
                        .skip(1)
                        .filter(|w| !w.starts_with('-'))
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                self.changes.push(Change::Write {
                    path: target.clone(),
                    hash: hash64(body.as_bytes()),
                    size: body.len(),
                });
            } else {
                self.changes.push(Change::Opaque {
                    path: target.clone(),
                    detail: hash64(canon_simple(&p.words).as_bytes()),
                });
            }
            self.path.get_or_insert_with(|| target.clone());
            promote(&mut self.kind, ActionKind::Write);
        }
    }

    /// Reads what a command does by its program (`first`, wrappers stripped). The order
    /// of the arms matters: `sed -i` edits before `sed -n` reads, and a program named in
    /// no list runs something.
    fn note_program(&mut self, p: &Simple, words: &[String], first: &str) {
        match first {
            "sed" | "perl"
                if words.iter().any(|w| {
                    w == "-i" || w.starts_with("-i") || w == "--in-place" || w == "-pi"
                }) =>
            {
                self.note_in_place_edit(words)
            }
            "tee" => self.note_tee(p, words),
            "git" => self.note_git(p, words),
            "sed" | "awk" if words.iter().any(|w| w == "-n") || first == "awk" => {
                self.note_filtered_read(words)
            }
            f if READERS.contains(&f) => self.note_reader(p, words),
            f if SEARCHERS.contains(&f) => self.note_searcher(words, f),
            f if MUTATORS.contains(&f) => self.note_mutator(words, f),
            f if INSTALLERS.contains(&f) => self.note_installer(p, words, f),
            f if LISTERS.contains(&f) => {
                if promote(&mut self.kind, ActionKind::Read) {
                    self.path = last_operand(words);
                    self.region = Some(f.to_string());
                }
            }
            f if CHECKERS.contains(&f)
                || f.starts_with("./")
                || f.ends_with(".sh")
                || f.ends_with(".py")
                || f.starts_with("test") =>
            {
                self.note_run(p, words)
            }
            _ => {
                promote(&mut self.kind, ActionKind::Exec);
            }
        }
    }

    /// `sed -i` / `perl -pi`: an edit of the last file named, keyed by its script.
    fn note_in_place_edit(&mut self, words: &[String]) {
        let file = last_operand(words).unwrap_or_default();
        let script: String = words
            .iter()
            .skip(1)
            .filter(|w| !w.starts_with('-'))
            .cloned()
            .collect::<Vec<_>>()
            .join(" ");
        self.changes.push(Change::Opaque {
            path: file.clone(),
            detail: hash64(script.as_bytes()),
        });
        self.path.get_or_insert(file);
        promote(&mut self.kind, ActionKind::Edit);
    }

    /// `tee`: a write of its input (the heredoc, when there is one) to every file named.
    fn note_tee(&mut self, p: &Simple, words: &[String]) {
        for f in words.iter().skip(1).filter(|w| !w.starts_with('-')) {
            let body = p.heredoc.clone().unwrap_or_default();
            self.changes.push(Change::Write {
                path: f.clone(),
                hash: hash64(body.as_bytes()),
                size: body.len(),
            });
            self.path.get_or_insert_with(|| f.clone());
        }
        promote(&mut self.kind, ActionKind::Write);
    }

    /// `git`: subcommands that change the tree are edits, `git grep` a search, the rest reads.
    fn note_git(&mut self, p: &Simple, words: &[String]) {
        let sub = words.get(1).map(String::as_str).unwrap_or("");
        match sub {
            "apply" | "checkout" | "restore" | "stash" | "reset" | "revert" | "am"
            | "cherry-pick" | "merge" | "rebase" | "commit" | "clean" | "rm" | "mv" => {
                self.mutating = true;
                self.changes.push(Change::Opaque {
                    path: format!("git:{sub}"),
                    detail: hash64(canon_simple(&p.words).as_bytes()),
                });
                promote(&mut self.kind, ActionKind::Edit);
            }
            "grep" => {
                promote(&mut self.kind, ActionKind::Search);
                self.search.get_or_insert_with(|| {
                    words
                        .iter()
                        .skip(2)
                        .find(|w| !w.starts_with('-'))
                        .cloned()
                        .unwrap_or_default()
                });
            }
            _ => {
                promote(&mut self.kind, ActionKind::Read);
            }
        }
    }

    /// `sed -n` / `awk`: a read of the last file named, its script the region.
    fn note_filtered_read(&mut self, words: &[String]) {
        let file = last_operand(words).unwrap_or_default();
        let script = words.iter().skip(1).find(|w| !w.starts_with('-')).cloned();
        if promote(&mut self.kind, ActionKind::Read) {
            self.path = Some(file);
            self.region = script;
        }
    }

    /// `cat`, `head` and the like: a read of the last file named, its flags and counts
    /// the region.
    fn note_reader(&mut self, p: &Simple, words: &[String]) {
        if p.heredoc.is_some() && !p.writes_to.is_empty() {
            return; // `cat <<EOF > f` is a write, handled by `note_redirects`
        }
        let file = last_operand(words);
        let flags: Vec<&String> = words
            .iter()
            .skip(1)
            .filter(|w| w.starts_with('-') || w.chars().all(|c| c.is_ascii_digit()))
            .collect();
        if promote(&mut self.kind, ActionKind::Read) {
            self.path = file;
            self.region = (!flags.is_empty()).then(|| {
                flags
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            });
        }
    }

    /// `grep`, `find` and the like: a search for the first word that is no flag
    /// (`find -delete`/`-exec` also changes the world).
    fn note_searcher(&mut self, words: &[String], f: &str) {
        promote(&mut self.kind, ActionKind::Search);
        self.search.get_or_insert_with(|| {
            words
                .iter()
                .skip(1)
                .find(|w| !w.starts_with('-'))
                .cloned()
                .unwrap_or_default()
        });
        if f == "find" && find_changes(words) {
            self.mutating = true;
        }
    }

    /// `rm`, `mv` and the like: an opaque change to every file named.
    fn note_mutator(&mut self, words: &[String], f: &str) {
        self.mutating = true;
        for w in words.iter().skip(1).filter(|w| !w.starts_with('-')) {
            self.changes.push(Change::Opaque {
                path: w.clone(),
                detail: hash64(format!("{f} {w}").as_bytes()),
            });
        }
        promote(&mut self.kind, ActionKind::Edit);
    }

    /// A package manager: installing or removing changes the environment; `npm test` and
    /// `npm run` are checks.
    fn note_installer(&mut self, p: &Simple, words: &[String], f: &str) {
        let sub = words.get(1).map(String::as_str).unwrap_or("");
        if matches!(
            sub,
            "install" | "uninstall" | "add" | "remove" | "update" | "upgrade" | "ci" | "i"
        ) {
            self.mutating = true;
            promote(&mut self.kind, ActionKind::Exec);
            self.changes.push(Change::Opaque {
                path: format!("env:{f}"),
                detail: hash64(canon_simple(&p.words).as_bytes()),
            });
        } else if f == "npm" && matches!(sub, "test" | "run") {
            promote(&mut self.kind, ActionKind::Exec);
            self.check.get_or_insert_with(|| canon_simple(&p.words));
        }
    }

    /// An interpreter, build tool or script: a check run, unless it only asks for its
    /// version or help. An inline program that writes files is an edit as well.
    fn note_run(&mut self, p: &Simple, words: &[String]) {
        let inline = words.iter().any(|w| w == "-c" || w == "-e" || w == "-");
        let runs_code = !matches!(
            words.get(1).map(String::as_str),
            Some("--version" | "-V" | "--help")
        );
        if p.heredoc.is_some() || inline {
            // Inline programs: a check keyed by their text.
            let body = p.heredoc.clone().unwrap_or_default();
            let text = format!("{} {body}", canon_simple(&p.words));
            if text.contains(".write(")
                || text.contains("write_text(")
                || text.contains("os.remove")
            {
                self.mutating = true;
                self.changes.push(Change::Opaque {
                    path: "inline-script".into(),
                    detail: hash64(text.as_bytes()),
                });
                promote(&mut self.kind, ActionKind::Edit);
            } else if let Some(file) = inline_read(&format!("{} {body}", p.words.join(" "))) {
                // `python3 -c "print(open('f').read()[:900])"`: a look at a file, not a
                // check of the code.
                if promote(&mut self.kind, ActionKind::Read) {
                    self.path = Some(file);
                }
                return;
            } else {
                promote(&mut self.kind, ActionKind::Exec);
            }
            self.check
                .get_or_insert_with(|| format!("inline:{:x}", hash64(text.as_bytes())));
        } else if runs_code {
            promote(&mut self.kind, ActionKind::Exec);
            self.check.get_or_insert_with(|| canon_simple(&p.words));
        }
    }

    /// The action the whole line amounts to (`parts`: its simple commands, `cmd`: the line).
    fn into_action(self, cmd: &str, parts: &[Simple]) -> ToolAction {
        let mutating = self.mutating || !self.changes.is_empty();
        let normalized = self.key_parts.join(" && ");
        let mut region = self.region;
        if self.kind == ActionKind::Read {
            // A pipeline's filters (`nl -ba f | sed -n '10,40p'`) pick the region read: the
            // whole command is the region, so paging through a file is not the same read.
            region = Some(normalized.clone());
        }
        // The key includes heredoc bodies hashed: two writes of different content differ.
        let mut key = format!("sh:{normalized}");
        for p in parts {
            if let Some(h) = &p.heredoc {
                key.push_str(&format!(":{:x}", hash64(h.as_bytes())));
            }
        }
        ToolAction {
            kind: self.kind,
            path: self.path,
            region,
            changes: self.changes,
            mutating,
            check: self.check,
            command: Some(cmd.trim().to_string()),
            search: self.search,
            key_hash: hash64(key.as_bytes()),
            key,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(name: &str, args: serde_json::Value) -> ToolCall {
        ToolCall {
            id: "1".into(),
            name: name.into(),
            args,
        }
    }

    fn none() -> BTreeMap<String, ToolMapping> {
        BTreeMap::new()
    }

    #[test]
    fn claude_gemini_opencode_reads_name_the_file() {
        for c in [
            call("Read", json!({"file_path": "/r/calc.py"})),
            call("read_file", json!({"file_path": "/r/calc.py"})),
            call("read", json!({"filePath": "/r/calc.py"})),
            call(
                "str_replace_editor",
                json!({"command": "view", "path": "/r/calc.py"}),
            ),
            call("bash", json!({"command": "cat /r/calc.py"})),
            call("exec_command", json!({"cmd": "cd /r && cat calc.py"})),
        ] {
            let a = classify(&c, &none(), &CallContext::default());
            assert_eq!(a.kind, ActionKind::Read, "{c:?}");
            assert_eq!(norm_path(a.path.as_deref().unwrap()), "calc.py", "{c:?}");
        }
    }

    #[test]
    fn a_find_that_only_looks_changes_nothing() {
        assert!(!shell(r"find /app -type f -exec strings {} \; | grep PASSWORD=").mutating);
        assert!(!shell(r"find . -name '*.py' -exec grep -l foo {} +").mutating);
        assert!(shell(r"find . -name '*.pyc' -exec rm {} \;").mutating);
        assert!(shell(r"find . -name '*.py' -exec sed -i 's/a/b/' {} +").mutating);
        assert!(shell("find . -name '*.orig' -delete").mutating);
    }

    #[test]
    fn commands_that_differ_only_in_a_comment_or_whitespace_are_one_command() {
        let plain = shell("ps aux | grep server && curl -s localhost:8080/health");
        let commented =
            shell("# check again\nps  aux | grep server &&  curl -s localhost:8080/health # retry");
        assert_eq!(plain.key, commented.key);
        assert_eq!(plain.kind, commented.kind);
        // A `#` inside a word or quotes is no comment.
        assert_ne!(shell("echo a#b").key, shell("echo a").key);
        assert_ne!(shell("echo '# x'").key, shell("echo").key);
        // The heredoc after a commented line is still read.
        let w = shell("cat > app.py <<'EOF' # write it\nprint(1)  # one\nEOF");
        assert_eq!(w.kind, ActionKind::Write);
        assert_eq!(w.changes.len(), 1);
        assert_eq!(w.changes[0].path(), "app.py");
    }

    #[test]
    fn an_inline_program_that_only_opens_a_file_reads_it() {
        let a = shell(r#"python3 -c "print(open('src/calc.py').read()[:900])""#);
        assert_eq!(a.kind, ActionKind::Read);
        assert_eq!(a.path.as_deref(), Some("src/calc.py"));
        assert_eq!(a.check, None);
        let checked = shell(r#"python -c "import calc; print(open('src/calc.py').read())""#);
        assert_eq!(checked.kind, ActionKind::Exec);
        assert!(checked.check.is_some());
        let written = shell(r#"python -c "open('out.txt', 'w').write('x')""#);
        assert_eq!(written.kind, ActionKind::Edit);
    }

    #[test]
    fn shell_reads_writes_and_checks() {
        let a = shell("sed -n '10,20p' src/x.py");
        assert_eq!(a.kind, ActionKind::Read);
        assert_eq!(a.command.as_deref(), Some("sed -n '10,20p' src/x.py"));
        assert_ne!(a.region, shell("sed -n '30,40p' src/x.py").region);
        assert_ne!(
            shell("nl -ba x.py | sed -n '1,20p'").region,
            shell("nl -ba x.py | sed -n '20,40p'").region
        );
        let a = shell("sed -i 's/a/b/' src/x.py");
        assert_eq!(a.kind, ActionKind::Edit);
        assert_eq!(a.changes.len(), 1);
        assert_eq!(a.changes[0].path(), "src/x.py");
        let a = shell("cat <<'EOF' > test_x.py\nprint(1)\nEOF\npython test_x.py");
        assert_eq!(a.kind, ActionKind::Write);
        assert!(matches!(&a.changes[0], Change::Write { path, .. } if path == "test_x.py"));
        assert_eq!(a.check.as_deref(), Some("python test_x.py"));
        let a = shell("printf 'x\\n' > out.txt");
        assert_eq!(a.kind, ActionKind::Write);
        let a = shell("cd /workspace/repo && python3 /workspace/repo/reproduce.py 2>&1");
        assert_eq!(a.check.as_deref(), Some("python reproduce.py"));
        assert_eq!(shell("python reproduce.py").check, a.check);
        let a = shell("grep -rn 'def foo' src/");
        assert_eq!(a.kind, ActionKind::Search);
        assert_eq!(a.search.as_deref(), Some("def foo"));
        let a = shell("git apply fix.patch");
        assert!(a.mutating);
        let a = shell("ls -la");
        assert_eq!(a.kind, ActionKind::Read);
        assert!(!a.mutating);
    }

    #[test]
    fn trivially_different_spellings_share_a_key() {
        assert_eq!(
            shell("pytest -x -q tests/test_a.py").key,
            shell("pytest  -q -x tests/test_a.py").key
        );
        assert_eq!(shell("python3 x.py").key, shell("python x.py").key);
        assert_eq!(shell("cd /r && ls").key, shell("ls").key);
        assert_ne!(
            shell("pytest tests/a.py").key,
            shell("pytest tests/b.py").key
        );
    }

    #[test]
    fn codex_patches_and_their_reversal() {
        let p = "*** Begin Patch\n*** Update File: calc.py\n@@\n-    return a - b\n+    return a + b\n*** End Patch";
        let r = "*** Begin Patch\n*** Update File: calc.py\n@@\n-    return a + b\n+    return a - b\n*** End Patch";
        let a = classify(
            &call("apply_patch", json!(p)),
            &none(),
            &CallContext::default(),
        );
        let b = classify(
            &call("apply_patch", json!({"patchText": r})),
            &none(),
            &CallContext::default(),
        );
        match (&a.changes[0], &b.changes[0]) {
            (
                Change::Edit {
                    old: o1, new: n1, ..
                },
                Change::Edit {
                    old: o2, new: n2, ..
                },
            ) => {
                assert_eq!((o1, n1), (n2, o2));
            }
            other => panic!("{other:?}"),
        }
        let add = classify(
            &call(
                "apply_patch",
                json!("*** Begin Patch\n*** Add File: t.py\n+print(1)\n*** End Patch"),
            ),
            &none(),
            &CallContext::default(),
        );
        assert_eq!(add.kind, ActionKind::Write);
    }

    #[test]
    fn swe_agent_commands() {
        let ctx = CallContext {
            open_file: Some("/r/src/A.java"),
            ..CallContext::default()
        };
        let e = classify(
            &call(
                "edit",
                json!({"start_line": 3, "end_line": 4, "replacement_text": "x"}),
            ),
            &none(),
            &ctx,
        );
        assert_eq!(e.kind, ActionKind::Edit);
        assert_eq!(e.changes[0].path(), "/r/src/A.java");
        let s = classify(
            &call("search_dir", json!({"search_term": "Foo", "dir": "src"})),
            &none(),
            &ctx,
        );
        assert_eq!(s.kind, ActionKind::Search);
        let g = classify(&call("goto", json!({"line_number": 40})), &none(), &ctx);
        assert_eq!(g.kind, ActionKind::Read);
        let o = classify(
            &call(
                "edit",
                json!({"file_path": "a.py", "old_string": "a", "new_string": "b"}),
            ),
            &none(),
            &ctx,
        );
        assert_eq!(o.kind, ActionKind::Edit);
    }

    #[test]
    fn user_mappings_come_first() {
        let mut user = BTreeMap::new();
        user.insert(
            "fetch_source".to_string(),
            ToolMapping {
                kind: Some(ActionKind::Read),
                path: Some("where".into()),
                ..ToolMapping::default()
            },
        );
        user.insert(
            "run".to_string(),
            ToolMapping {
                command: Some("line".into()),
                ..ToolMapping::default()
            },
        );
        let a = classify(
            &call("fetch_source", json!({"where": "/a/b.rs"})),
            &user,
            &CallContext::default(),
        );
        assert_eq!(a.kind, ActionKind::Read);
        assert_eq!(a.path.as_deref(), Some("/a/b.rs"));
        let r = classify(
            &call("run", json!({"line": "cargo test"})),
            &user,
            &CallContext::default(),
        );
        assert_eq!(r.check.as_deref(), Some("cargo test"));
    }
}
