//! What a tool that no profile knows does, read from the call itself: the names of its
//! arguments and the shape of their values. A path with old and new text is an edit, a
//! path with content a write, a command line a shell, a pattern or a query a search, a
//! path alone a read. The tool definitions a request carries refine this where argument
//! names say little ([`ToolCatalog`]): a property described as "the shell command to run"
//! plays the command's part whatever it is called.
//!
//! The keys inferred actions get do not contain the tool's name (`read:<file>:<region>`,
//! `edit:<file>:<old>:<new>`, a shell command's own key), so an agent that calls its
//! shell `exec` and one that calls it `bash` are read alike.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{
    edit, opaque_edit, patch_action, read, shell, simple, write, ActionKind, CallContext, Change,
    ToolAction,
};
use crate::normalize::hash64;
use crate::transcript::ToolCall;

/// The part an argument plays in a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// A shell command line (a string, or an argv array).
    Command,
    /// A patch: Codex `*** Begin Patch`, a unified diff, or SEARCH/REPLACE blocks.
    Patch,
    /// The file (or directory) the call is about.
    Path,
    /// The text an edit replaces...
    Old,
    /// ...and the text it puts in its place.
    New,
    /// The whole new content of a file.
    Content,
    /// A partial rewrite whose meaning only the tool knows (Cursor's `code_edit`, an insert's
    /// text): the file changes, in a way the call does not spell out.
    Fragment,
    /// A search pattern, query or glob.
    Pattern,
    /// Where in a file: offsets, limits, line numbers and ranges.
    Region,
}

/// Argument names (lowercase, without `_` and `-`) and the part they play. Checked in
/// order; names not listed play no part.
const NAMES: &[(&str, Role)] = &[
    ("command", Role::Command),
    ("cmd", Role::Command),
    ("commandline", Role::Command),
    ("shellcommand", Role::Command),
    ("script", Role::Command),
    ("bash", Role::Command),
    ("shell", Role::Command),
    ("patch", Role::Patch),
    ("patchtext", Role::Patch),
    ("diff", Role::Patch),
    ("unifieddiff", Role::Patch),
    ("path", Role::Path),
    ("filepath", Role::Path),
    ("file", Role::Path),
    ("filename", Role::Path),
    ("targetfile", Role::Path),
    ("absolutepath", Role::Path),
    ("relativepath", Role::Path),
    ("relativeworkspacepath", Role::Path),
    ("notebookpath", Role::Path),
    ("targetpath", Role::Path),
    ("dirpath", Role::Path),
    ("directory", Role::Path),
    ("dir", Role::Path),
    ("uri", Role::Path),
    ("oldstring", Role::Old),
    ("oldstr", Role::Old),
    ("oldtext", Role::Old),
    ("old", Role::Old),
    ("oldcontent", Role::Old),
    ("search", Role::Old),
    ("searchtext", Role::Old),
    ("find", Role::Old),
    ("original", Role::Old),
    ("before", Role::Old),
    ("newstring", Role::New),
    ("newstr", Role::New),
    ("newtext", Role::New),
    ("new", Role::New),
    ("newcontent", Role::New),
    ("replace", Role::New),
    ("replacement", Role::New),
    ("replacetext", Role::New),
    ("replacewith", Role::New),
    ("after", Role::New),
    ("content", Role::Content),
    ("contents", Role::Content),
    ("filetext", Role::Content),
    ("filecontent", Role::Content),
    ("text", Role::Content),
    ("data", Role::Content),
    ("body", Role::Content),
    ("code", Role::Content),
    ("codeedit", Role::Fragment),
    ("changes", Role::Fragment),
    ("insertline", Role::Region),
    ("pattern", Role::Pattern),
    ("query", Role::Pattern),
    ("regex", Role::Pattern),
    ("searchterm", Role::Pattern),
    ("searchquery", Role::Pattern),
    ("glob", Role::Pattern),
    ("includepattern", Role::Pattern),
    ("term", Role::Pattern),
    ("keyword", Role::Pattern),
    ("q", Role::Pattern),
];

/// The part an argument named `name` plays, by its name alone.
pub fn role_by_name(name: &str) -> Option<Role> {
    let folded: String = name
        .chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect();
    if let Some((_, role)) = NAMES.iter().find(|(n, _)| *n == folded) {
        return Some(*role);
    }
    let regionish = ["line", "offset", "limit", "range", "page"];
    regionish
        .iter()
        .any(|w| folded.contains(w))
        .then_some(Role::Region)
}

/// The subcommands of editor tools that take a `command` argument naming what to do
/// (OpenHands' and SWE-agent's `str_replace_editor`, Goose's text editor).
const EDITOR_VERBS: &[&str] = &[
    "view",
    "read",
    "create",
    "write",
    "overwrite",
    "append",
    "str_replace",
    "replace",
    "insert",
    "undo_edit",
];

/// The arguments of an object and the parts they play.
fn roles_of<'a>(
    args: &'a Value,
    defined: Option<&'a ToolRoles>,
) -> Vec<(&'a str, Role, &'a Value)> {
    let Value::Object(map) = args else {
        return Vec::new();
    };
    map.iter()
        .filter_map(|(name, value)| {
            let role = defined
                .and_then(|d| d.get(name).copied())
                .or_else(|| role_by_name(name))?;
            Some((name.as_str(), role, value))
        })
        .collect()
}

/// The objects of the call's list arguments: Roo Code reads `files: [{path, line_ranges}]`,
/// edits come as `edits: [{oldText, newText}]` or `operations: [{search, replace}]`.
fn listed(args: &Value) -> impl Iterator<Item = &Value> {
    args.as_object()
        .into_iter()
        .flat_map(|m| m.values())
        .filter_map(Value::as_array)
        .flatten()
        .filter(|v| v.is_object())
}

/// An argument's value, found by the part it plays.
struct Args<'a> {
    call: &'a ToolCall,
    roles: Vec<(&'a str, Role, &'a Value)>,
}

impl<'a> Args<'a> {
    fn read(call: &'a ToolCall, defined: Option<&'a ToolRoles>) -> Args<'a> {
        Args {
            call,
            roles: roles_of(&call.args, defined),
        }
    }

    /// The first text argument playing `role` (an empty text counts: an edit may insert
    /// into or delete from nothing).
    fn text(&self, role: Role) -> Option<&'a str> {
        self.roles
            .iter()
            .filter(|(_, r, _)| *r == role)
            .find_map(|(_, _, v)| v.as_str())
    }

    fn has(&self, role: Role) -> bool {
        self.roles.iter().any(|(_, r, _)| *r == role)
    }

    /// A shell command: a string, or an argv array whose last element is the script
    /// (`["bash", "-lc", "..."]`) or whose words are the command.
    fn command(&self) -> Option<String> {
        let (_, _, value) = self.roles.iter().find(|(_, r, _)| *r == Role::Command)?;
        match value {
            Value::String(s) if !is_editor_verb(s) => Some(s.clone()),
            Value::Array(parts) => {
                let words: Vec<&str> = parts.iter().filter_map(Value::as_str).collect();
                match words.as_slice() {
                    [] => None,
                    [shell, flag, script] if is_shell(shell) && flag.starts_with('-') => {
                        Some((*script).to_string())
                    }
                    _ => Some(words.join(" ")),
                }
            }
            _ => None,
        }
    }

    /// The region of a read: every region argument, by name.
    fn region(&self) -> Option<String> {
        let parts: Vec<String> = self
            .roles
            .iter()
            .filter(|(_, r, _)| *r == Role::Region)
            .map(|(n, _, v)| format!("{n}={v}"))
            .collect();
        (!parts.is_empty()).then(|| parts.join(","))
    }

    /// A patch: the argument playing that part, or any text argument written as one.
    fn patch(&self) -> Option<&'a str> {
        self.text(Role::Patch).or_else(|| match &self.call.args {
            Value::String(s) if looks_like_patch(s) => Some(s.as_str()),
            Value::Object(map) => map
                .values()
                .filter_map(Value::as_str)
                .find(|s| looks_like_patch(s)),
            _ => None,
        })
    }
}

fn is_editor_verb(s: &str) -> bool {
    EDITOR_VERBS.contains(&s)
}

fn is_shell(word: &str) -> bool {
    matches!(
        word.rsplit('/').next().unwrap_or(word),
        "bash" | "sh" | "zsh" | "dash" | "fish" | "powershell" | "pwsh" | "cmd"
    )
}

/// Whether a text is a patch or SEARCH/REPLACE blocks rather than plain content.
fn looks_like_patch(s: &str) -> bool {
    s.starts_with("*** Begin Patch")
        || (s.contains("\n+++ ") && s.contains("\n@@"))
        || s.starts_with("--- ") && s.contains("\n+++ ")
        || search_replace_blocks(s).is_some()
}

/// The searched and the replacing text of SEARCH/REPLACE blocks (`<<<<<<< SEARCH` or
/// `------- SEARCH`, `=======`, `>>>>>>> REPLACE` or `+++++++ REPLACE`), all blocks of one
/// argument joined; `None` when the text holds no whole block. Roo Code's `:start_line:`
/// lines and the `-------` under them say where, not what, and are left out.
pub fn search_replace_blocks(s: &str) -> Option<(String, String)> {
    enum In {
        Outside,
        Search,
        Replace,
    }
    let marker = |line: &str, chars: &[char], word: &str| {
        let t = line.trim_end();
        let head = t.trim_end_matches(word).trim_end();
        t.ends_with(word) && head.len() >= 3 && head.chars().all(|c| chars.contains(&c))
    };
    let (mut old, mut new) = (String::new(), String::new());
    let (mut state, mut blocks) = (In::Outside, 0);
    for line in s.lines() {
        match state {
            In::Outside if marker(line, &['<', '-'], "SEARCH") => state = In::Search,
            In::Outside => {}
            In::Search if line.trim_end().chars().all(|c| c == '=') && line.len() >= 3 => {
                state = In::Replace
            }
            In::Search if line.starts_with(":start_line:") || line.starts_with(":end_line:") => {}
            In::Search if line.trim_end() == "-------" && old.is_empty() => {}
            In::Search => {
                old.push_str(line);
                old.push('\n');
            }
            In::Replace if marker(line, &['>', '+'], "REPLACE") => {
                state = In::Outside;
                blocks += 1;
            }
            In::Replace => {
                new.push_str(line);
                new.push('\n');
            }
        }
    }
    (blocks > 0).then_some((old, new))
}

/// What a call of a tool no profile knows does, from its arguments (and the parts its
/// definition gives them); `None` when nothing in it says (the call stays "other").
pub fn infer(call: &ToolCall, ctx: &CallContext<'_>) -> Option<ToolAction> {
    let defined = ctx.tools.and_then(|t| t.roles(&call.name));
    let args = Args::read(call, defined);
    let listed_args: Vec<Args<'_>> = listed(&call.args)
        .map(|v| Args {
            call,
            roles: roles_of(v, None),
        })
        .collect();
    // An editor's line edit names no file: it acts on the file the editor has open.
    let edits_open_file = args.has(Role::New) || args.has(Role::Fragment);
    let path = args
        .text(Role::Path)
        .or_else(|| listed_args.iter().find_map(|a| a.text(Role::Path)))
        .or(ctx.open_file.filter(|_| edits_open_file));

    // An editor with subcommands: `command` names what to do to `path`.
    if let (Some(verb), Some(path)) = (args.text(Role::Command), path) {
        if is_editor_verb(verb) {
            return Some(editor(&args, path, verb));
        }
    }
    if let Some(cmd) = args.command() {
        return Some(shell(&cmd));
    }
    if let Some(patch) = args.patch() {
        return Some(patched(call, patch, path));
    }
    if let Some(path) = path {
        let edits = listed_edits(call, path, &listed_args);
        if !edits.changes.is_empty() {
            return Some(edits);
        }
        let region_from = listed_args
            .iter()
            .find(|a| a.text(Role::Path).is_some())
            .filter(|_| args.text(Role::Path).is_none());
        return Some(on_file(region_from.unwrap_or(&args), path));
    }
    if let Some(pattern) = args.text(Role::Pattern) {
        let mut a = simple(call, ActionKind::Search, None);
        a.search = Some(pattern.to_string());
        return Some(a);
    }
    None
}

/// The replacements of a call that lists them (`edits: [{oldText, newText}]`), on `path`.
fn listed_edits(call: &ToolCall, path: &str, listed: &[Args<'_>]) -> ToolAction {
    let mut a = simple(call, ActionKind::Edit, Some(path));
    let mut key = String::from("edits");
    for l in listed {
        if let (Some(old), Some(new)) = (l.text(Role::Old), l.text(Role::New)) {
            let (old, new) = (hash64(old.as_bytes()), hash64(new.as_bytes()));
            key.push_str(&format!(":{}:{old:x}:{new:x}", super::norm_path(path)));
            a.changes.push(Change::Edit {
                path: path.to_string(),
                old,
                new,
            });
        }
    }
    a.key_hash = hash64(key.as_bytes());
    a.key = key;
    a
}

/// Argument names that say where an insertion goes: content given with one is inserted,
/// not the whole file.
const INSERT_AT: &[&str] = &[
    "line",
    "insert_line",
    "insertLine",
    "insert_at",
    "position",
    "after_line",
];

/// A call on one file, by the other parts its arguments play.
fn on_file(args: &Args<'_>, path: &str) -> ToolAction {
    let call = args.call;
    if let (Some(old), Some(new)) = (args.text(Role::Old), args.text(Role::New)) {
        return edit(call, path, old, new);
    }
    let inserts = call
        .args
        .as_object()
        .is_some_and(|m| INSERT_AT.iter().any(|k| m.contains_key(*k)));
    if args.has(Role::Fragment)
        || args.has(Role::New)
        || (inserts && args.has(Role::Content))
        || renames_or_deletes(&call.name)
    {
        return opaque_edit(call, path);
    }
    if let Some(content) = args.text(Role::Content) {
        return write(call, path, content);
    }
    if let Some(pattern) = args.text(Role::Pattern) {
        let mut a = simple(call, ActionKind::Search, Some(path));
        a.search = Some(pattern.to_string());
        return a;
    }
    read(call, path, args.region())
}

/// Tool names that move or delete what their path names.
fn renames_or_deletes(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    ["delete", "remove", "rename", "move"]
        .iter()
        .any(|w| n.contains(w))
}

/// An editor subcommand on `path`.
fn editor(args: &Args<'_>, path: &str, verb: &str) -> ToolAction {
    let call = args.call;
    match verb {
        "view" | "read" => read(call, path, args.region()),
        "create" | "write" | "overwrite" => write(
            call,
            path,
            args.text(Role::Content)
                .or(args.text(Role::New))
                .unwrap_or(""),
        ),
        "str_replace" | "replace" => edit(
            call,
            path,
            args.text(Role::Old).unwrap_or(""),
            args.text(Role::New).unwrap_or(""),
        ),
        _ => opaque_edit(call, path),
    }
}

/// A patch: the files it names, or, for SEARCH/REPLACE blocks (which name none), the
/// call's path.
fn patched(call: &ToolCall, patch: &str, path: Option<&str>) -> ToolAction {
    if let (Some((old, new)), Some(path)) = (search_replace_blocks(patch), path) {
        return edit(call, path, &old, &new);
    }
    let a = patch_action(call, patch);
    match path {
        Some(path) if a.changes.is_empty() => opaque_edit(call, path),
        _ => a,
    }
}

/// The parts a tool definition gives its arguments.
pub type ToolRoles = BTreeMap<String, Role>;

/// What the tool definitions of a request say of each tool: the part each argument plays,
/// by its name, else by its description; and for a shell tool (by its description) with
/// one text argument that nothing else names, that argument is the command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolCatalog {
    tools: BTreeMap<String, ToolRoles>,
}

/// Words of an argument's description and the part they stand for, checked in order.
const DESCRIBED_ROLES: &[(&[&str], Role)] = &[
    (
        &[
            "shell command",
            "command to run",
            "command to execute",
            "command line",
            "terminal command",
        ],
        Role::Command,
    ),
    (
        &[
            "unified diff",
            "patch to apply",
            "search/replace",
            "search and replace block",
        ],
        Role::Patch,
    ),
    (
        &[
            "text to replace",
            "text to find",
            "exact text",
            "existing text",
            "old text",
            "to be replaced",
        ],
        Role::Old,
    ),
    (
        &[
            "replacement text",
            "new text",
            "text to insert",
            "replace it with",
            "replace with",
        ],
        Role::New,
    ),
    (
        &[
            "full content",
            "entire content",
            "complete content",
            "content to write",
            "contents of the file",
            "content of the file",
        ],
        Role::Content,
    ),
    (
        &[
            "regex",
            "regular expression",
            "search pattern",
            "glob",
            "search query",
            "pattern to search",
        ],
        Role::Pattern,
    ),
    (
        &[
            "path of the file",
            "path to the file",
            "file path",
            "path to a file",
            "directory path",
            "path of the directory",
            "file to read",
            "file to edit",
        ],
        Role::Path,
    ),
];

/// Words of a tool's description that make it a shell tool.
const DESCRIBED_SHELL: &[&str] = &[
    "shell",
    "terminal",
    "execute a command",
    "run a command",
    "executes a command",
    "runs a command",
];

/// Whether a description holds any of `words` (lowercase).
fn mentions(text: &str, words: &[&str]) -> bool {
    let t = text.to_lowercase();
    words.iter().any(|w| t.contains(w))
}

/// The part the first entry whose words a description holds stands for.
fn described_role(text: &str) -> Option<Role> {
    DESCRIBED_ROLES
        .iter()
        .find(|(words, _)| mentions(text, words))
        .map(|(_, role)| *role)
}

impl ToolCatalog {
    /// The catalog of a request's `tools` member: OpenAI Chat (`{type, function: {name,
    /// description, parameters}}`), OpenAI Responses and Anthropic (`{name, description,
    /// parameters | input_schema}`) and Gemini (`{functionDeclarations: [...]}`) shapes.
    /// Entries it cannot read are skipped.
    pub fn from_definitions(tools: &Value) -> ToolCatalog {
        let mut catalog = ToolCatalog::default();
        let Value::Array(entries) = tools else {
            return catalog;
        };
        for entry in entries {
            if let Some(Value::Array(decls)) = entry
                .get("functionDeclarations")
                .or_else(|| entry.get("function_declarations"))
            {
                decls.iter().for_each(|d| catalog.add(d));
            } else {
                catalog.add(entry.get("function").unwrap_or(entry));
            }
        }
        catalog
    }

    fn add(&mut self, def: &Value) {
        let Some(name) = def.get("name").and_then(Value::as_str) else {
            return;
        };
        let schema = def
            .get("parameters")
            .or_else(|| def.get("input_schema"))
            .or_else(|| def.get("parametersJsonSchema"));
        let mut roles = ToolRoles::new();
        let mut texts = Vec::new();
        if let Some(Value::Object(props)) = schema.and_then(|s| s.get("properties")) {
            for (arg, prop) in props {
                let by_description = || {
                    prop.get("description")
                        .and_then(Value::as_str)
                        .and_then(described_role)
                };
                match role_by_name(arg).or_else(by_description) {
                    Some(role) => {
                        roles.insert(arg.clone(), role);
                    }
                    None if prop.get("type").and_then(Value::as_str) == Some("string") => {
                        texts.push(arg.clone())
                    }
                    None => {}
                }
            }
        }
        let shell_tool = def
            .get("description")
            .and_then(Value::as_str)
            .is_some_and(|d| mentions(d, DESCRIBED_SHELL));
        if let ([only], true) = (texts.as_slice(), shell_tool && roles.is_empty()) {
            roles.insert(only.clone(), Role::Command);
        }
        self.tools.insert(name.to_string(), roles);
    }

    /// The parts the definition of `tool` gives its arguments.
    pub fn roles(&self, tool: &str) -> Option<&ToolRoles> {
        self.tools.get(tool)
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}
