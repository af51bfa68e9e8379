//! Agent Skills (folders with a `SKILL.md`) and custom slash commands (Markdown files in `commands/` folders), found where people already keep them: discovery, parsing, the `skill` tool that loads one when the model decides to use it, and the expansion of `/name args`.
//!
//! Skills follow the open Agent Skills layout (YAML frontmatter `name`, `description`,
//! optional `allowed-tools`, then instructions; `scripts/`, `references/`, `assets/`
//! beside it). Only the name and description go into every request (the `skill` tool's
//! description, under a size budget); the whole `SKILL.md` is read when the model calls
//! `skill`. Nothing here fails a turn: a file that does not parse is a notice with its
//! path and line, and the others still load.
//!
//! Confinement: symlinks are followed only when they lead into one of the skill and
//! command folders themselves (a `.claude/skills` linked to `.agents/skills` is fine, a
//! skill linked to `~/.ssh` is not). `allowed-tools` grants nothing: the tools a skill
//! names are shown to the model, and its scripts run through `run_command`, under the
//! person's approvals and the sandbox like any command.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::profiles::{Value as Field, claude_model, claude_tool, frontmatter};
use crate::protocol::Profile;
pub use crate::protocol::{CustomCommandInfo, ExpandedCommand, SkillCatalog, SkillInfo};
use crate::tools::{Access, ApprovalAsk, Tool, ToolContext, ToolError, ToolRegistry, parse_args};
use crate::workspace::Place;

/// The file that makes a folder a skill.
pub const SKILL_FILE: &str = "SKILL.md";

/// How much of a `SKILL.md` discovery reads: the frontmatter is at the top, and reading
/// 200 whole skills at every turn's start would cost more than the list is worth.
const HEAD_CAP: u64 = 16 * 1024;

/// The most a `skill` call returns of one file.
const READ_CAP: u64 = 256 * 1024;

/// The bytes the list of skills may take in the `skill` tool's description (about 2,000
/// tokens): every request carries it.
pub const LIST_BUDGET: usize = 8 * 1024;

/// Beyond the budget, skills are still named (without their description) up to this
/// many more bytes, so the model can load any of them; the rest are counted.
const NAMES_BUDGET: usize = 2 * 1024;

/// The longest description one list entry shows; the `SKILL.md` has the rest.
const ENTRY_DESCRIPTION: usize = 300;

/// How many of a skill's files its loaded text lists.
const MAX_LISTED_FILES: usize = 50;

/// Why expanding a line failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SkillError {
    #[error("no command or skill named {0:?}")]
    NotFound(String),
    #[error("the text names no command or skill (start it with /name, or name a $skill)")]
    NothingToExpand,
    #[error("cannot read {path}: {message}")]
    Unreadable { path: String, message: String },
}

/// Where the person's own skills and commands are: the home folder (`~/.agents/skills`,
/// `~/.claude/skills`, `~/.claude/commands`) and Bumblehive's config folder
/// (`<config dir>/bumblehive/skills`, `…/commands`).
#[derive(Debug, Clone, Default)]
pub struct UserDirs {
    pub home: Option<PathBuf>,
    pub config: Option<PathBuf>,
}

impl UserDirs {
    /// The person's home and the given config folder (the one beside the config file).
    pub fn with_config(config: Option<&Path>) -> Self {
        UserDirs {
            home: dirs::home_dir(),
            config: config.map(Path::to_path_buf),
        }
    }
}

/// What a folder holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Skills,
    Commands,
}

/// One folder skills or commands are read from.
#[derive(Debug, Clone)]
struct Root {
    path: PathBuf,
    kind: Kind,
    scope: &'static str,
    /// Claude Code's folders: its tool names and model aliases are mapped.
    claude: bool,
}

/// A skill found on disk.
#[derive(Debug, Clone, PartialEq)]
pub struct Skill {
    pub name: String,
    pub description: String,
    pub allowed_tools: Vec<String>,
    /// Its folder's real location (files are confined to it).
    pub dir: PathBuf,
    /// Its `SKILL.md`, as found.
    pub file: PathBuf,
    pub scope: &'static str,
    pub source: String,
    pub shadowed: Vec<String>,
}

/// A custom command found on disk.
#[derive(Debug, Clone, PartialEq)]
pub struct CustomCommand {
    pub name: String,
    pub description: String,
    pub argument_hint: Option<String>,
    pub model: Option<String>,
    pub allowed_tools: Option<Vec<String>>,
    /// The text the arguments are put into.
    pub template: String,
    pub file: PathBuf,
    pub scope: &'static str,
    pub source: String,
    pub shadowed: Vec<String>,
}

/// Everything one workspace sees.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    pub skills: Vec<Skill>,
    pub commands: Vec<CustomCommand>,
    /// `path:line: message` for what could not be read, and links not followed.
    pub notices: Vec<String>,
}

impl Catalog {
    pub fn skill(&self, name: &str) -> Option<&Skill> {
        self.skills.iter().find(|s| s.name == name)
    }

    pub fn command(&self, name: &str) -> Option<&CustomCommand> {
        self.commands.iter().find(|c| c.name == name)
    }

    /// The catalog as `list_skills` answers it.
    pub fn info(&self) -> SkillCatalog {
        SkillCatalog {
            skills: self
                .skills
                .iter()
                .map(|s| SkillInfo {
                    name: s.name.clone(),
                    description: s.description.clone(),
                    path: s.file.display().to_string(),
                    scope: s.scope.to_string(),
                    source: s.source.clone(),
                    allowed_tools: s.allowed_tools.clone(),
                    shadowed: s.shadowed.clone(),
                })
                .collect(),
            commands: self
                .commands
                .iter()
                .map(|c| CustomCommandInfo {
                    name: c.name.clone(),
                    description: c.description.clone(),
                    argument_hint: c.argument_hint.clone(),
                    model: c.model.clone(),
                    allowed_tools: c.allowed_tools.clone(),
                    path: c.file.display().to_string(),
                    scope: c.scope.to_string(),
                    source: c.source.clone(),
                    shadowed: c.shadowed.clone(),
                })
                .collect(),
            notices: self.notices.clone(),
        }
    }
}

/// The folders read, most specific first (a name found earlier wins): in each folder
/// from the workspace up to the repository root `.bumblehive/`, `.agents/`, `.claude/`;
/// then the person's `~/.agents/skills`, `~/.claude/…` and the config folder's.
fn roots(place: &Place, user: &UserDirs) -> Vec<Root> {
    let mut roots = Vec::new();
    let mut add = |path: PathBuf, kind, scope, claude| {
        roots.push(Root {
            path,
            kind,
            scope,
            claude,
        })
    };
    for dir in place.folders().iter().rev() {
        add(
            dir.join(".bumblehive/skills"),
            Kind::Skills,
            "workspace",
            false,
        );
        add(dir.join(".agents/skills"), Kind::Skills, "workspace", false);
        add(dir.join(".claude/skills"), Kind::Skills, "workspace", true);
        add(
            dir.join(".bumblehive/commands"),
            Kind::Commands,
            "workspace",
            false,
        );
        add(
            dir.join(".claude/commands"),
            Kind::Commands,
            "workspace",
            true,
        );
    }
    if let Some(home) = &user.home {
        add(home.join(".agents/skills"), Kind::Skills, "user", false);
        add(home.join(".claude/skills"), Kind::Skills, "user", true);
        add(home.join(".claude/commands"), Kind::Commands, "user", true);
    }
    if let Some(config) = &user.config {
        add(config.join("skills"), Kind::Skills, "user", false);
        add(config.join("commands"), Kind::Commands, "user", false);
    }
    roots
}

/// Finds every skill and command a workspace sees. Cheap enough for every turn's start
/// (BENCHMARKS.md: 200 skills), so edits apply from the next turn without a watcher.
pub fn discover(workspace: &Path, user: &UserDirs) -> Catalog {
    discover_at(&Place::find(workspace), user)
}

/// [`discover`] for a workspace already found (a run's turn finds it once).
pub fn discover_at(place: &Place, user: &UserDirs) -> Catalog {
    let mut catalog = Catalog::default();
    // The folders that exist, in order, by their real location, and whether each is a
    // link: the others are where links may lead.
    let mut present: Vec<(Root, PathBuf, bool)> = Vec::new();
    for root in roots(place, user) {
        let Ok(meta) = std::fs::symlink_metadata(&root.path) else {
            continue;
        };
        let Ok(real) = std::fs::canonicalize(&root.path) else {
            catalog
                .notices
                .push(format!("{}: a broken link; not read", root.path.display()));
            continue;
        };
        if real.is_dir() {
            present.push((root, real, meta.file_type().is_symlink()));
        }
    }
    let bases: Vec<PathBuf> = present
        .iter()
        .filter(|(_, _, link)| !link)
        .map(|(_, real, _)| real.clone())
        .collect();
    let inside = |real: &Path| bases.iter().any(|base| real.starts_with(base));
    let mut folders: Vec<(Root, PathBuf)> = Vec::new();
    for (root, real, link) in present {
        if link && !inside(&real) {
            catalog.notices.push(format!(
                "{}: a link to {}, outside the skill and command folders; not followed",
                root.path.display(),
                real.display()
            ));
            continue;
        }
        folders.push((root, real));
    }
    let mut seen_dirs: Vec<PathBuf> = Vec::new();
    for (root, real) in folders {
        // The same folder reached twice (a link to another root): read once.
        if seen_dirs.contains(&real) {
            continue;
        }
        seen_dirs.push(real.clone());
        match root.kind {
            Kind::Skills => read_skills(&root, &real, &inside, &mut catalog),
            Kind::Commands => read_commands(&root, &real, &inside, &mut catalog),
        }
    }
    catalog
}

/// The entries of a folder, sorted by name (hidden ones left out), with whether each is
/// a folder after following a link that stays inside.
fn entries(
    dir: &Path,
    inside: &dyn Fn(&Path) -> bool,
    notices: &mut Vec<String>,
) -> Vec<(String, PathBuf, bool)> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in read.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let path = entry.path();
        if kind.is_symlink() {
            match std::fs::canonicalize(&path) {
                Ok(real) if inside(&real) => {
                    let is_dir = real.is_dir();
                    out.push((name, real, is_dir));
                }
                Ok(real) => notices.push(format!(
                    "{}: a link to {}, outside the skill and command folders; not followed",
                    path.display(),
                    real.display()
                )),
                Err(_) => notices.push(format!("{}: a broken link; not read", path.display())),
            }
        } else {
            out.push((name, path, kind.is_dir()));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Reads at most `cap` bytes of a regular file, never following a link at its last name
/// (links were resolved and checked by the caller) and never blocking on a pipe.
fn read_head(path: &Path, cap: u64) -> std::io::Result<Option<String>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err),
    };
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    file.take(cap).read_to_end(&mut bytes)?;
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

/// A skill or command name: what `/name` and `$name` can be typed as.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !name.starts_with(['-', '.'])
}

/// The tools a skill's or command's `allowed-tools` names, as ours. Both spellings are
/// read: the standard's space-separated list and Claude Code's comma-separated one, with
/// patterns such as `Bash(git add:*)` kept whole (and counted as the tool itself).
fn tool_names(value: &Field, line: usize, path: &Path, notices: &mut Vec<String>) -> Vec<String> {
    let text = match value {
        Field::List(items) => items.join(","),
        other => other.scalar(),
    };
    let mut words = Vec::new();
    let mut current = String::new();
    let mut depth = 0usize;
    for c in text.chars() {
        match c {
            '(' => {
                depth += 1;
                current.push(c);
            }
            ')' => {
                depth = depth.saturating_sub(1);
                current.push(c);
            }
            ',' | ' ' | '\t' if depth == 0 => {
                if !current.trim().is_empty() {
                    words.push(current.trim().to_string());
                }
                current.clear();
            }
            _ => current.push(c),
        }
    }
    if !current.trim().is_empty() {
        words.push(current.trim().to_string());
    }
    let mut names: Vec<String> = Vec::new();
    for word in words {
        let base = word.split('(').next().unwrap_or(&word).trim();
        let ours = match claude_tool(base) {
            Some(ours) => ours.to_string(),
            None if base.contains('_') || base.chars().all(|c| c.is_ascii_lowercase()) => {
                base.to_string()
            }
            None => {
                notices.push(format!(
                    "{}:{line}: allowed-tools names {word:?}, which has no counterpart here; ignored",
                    path.display()
                ));
                continue;
            }
        };
        if !names.contains(&ours) {
            names.push(ours);
        }
    }
    names
}

fn read_skills(root: &Root, dir: &Path, inside: &dyn Fn(&Path) -> bool, catalog: &mut Catalog) {
    for (folder, path, is_dir) in entries(dir, inside, &mut catalog.notices) {
        if !is_dir {
            continue;
        }
        let mut file = path.join(SKILL_FILE);
        let at = |line: usize, message: &str| {
            format!("{}:{line}: {message}", path.join(SKILL_FILE).display())
        };
        let text = match read_head(&file, HEAD_CAP) {
            Ok(Some(text)) => text,
            // A folder without SKILL.md may hold what skills share; not a skill.
            Ok(None) => continue,
            Err(err) if err.raw_os_error() == Some(libc::ELOOP) => {
                // SKILL.md itself is a link: followed only if it stays inside.
                match std::fs::canonicalize(&file) {
                    Ok(real) if inside(&real) => match read_head(&real, HEAD_CAP) {
                        Ok(Some(text)) => {
                            // Kept by its real, checked location: loading it later reads
                            // that file without following links, so a link swapped in
                            // meanwhile cannot lead it elsewhere.
                            file = real;
                            text
                        }
                        _ => continue,
                    },
                    _ => {
                        catalog.notices.push(at(
                            0,
                            "a link outside the skill and command folders; not followed",
                        ));
                        continue;
                    }
                }
            }
            Err(err) => {
                catalog.notices.push(at(0, &format!("cannot read: {err}")));
                continue;
            }
        };
        match parse_skill(&text, &folder, &file, &mut catalog.notices) {
            Ok(mut skill) => {
                skill.dir = path.clone();
                skill.file = file.clone();
                skill.scope = root.scope;
                skill.source = root.path.display().to_string();
                match catalog.skills.iter_mut().find(|s| s.name == skill.name) {
                    Some(first) => first.shadowed.push(file.display().to_string()),
                    None => catalog.skills.push(skill),
                }
            }
            Err((line, message)) => catalog.notices.push(at(line, &message)),
        }
    }
}

/// A `SKILL.md`'s frontmatter as a skill (folder, file and source are filled in by the
/// caller); what was ignored goes to `notices` as `path:line: message`.
fn parse_skill(
    text: &str,
    folder: &str,
    path: &Path,
    notices: &mut Vec<String>,
) -> Result<Skill, (usize, String)> {
    if !text.starts_with("---") {
        return Err((
            1,
            "a SKILL.md starts with frontmatter (---, name, description, ---)".into(),
        ));
    }
    let (fields, _body) = frontmatter(text)?;
    let at = |line: usize, message: String| format!("{}:{line}: {message}", path.display());
    let mut name = None;
    let mut description = None;
    let mut tools = Vec::new();
    for (line, key, value) in fields {
        match key.as_str() {
            "name" => {
                let value = value.scalar();
                if !valid_name(&value) {
                    return Err((
                        line,
                        format!(
                            "the name {value:?} is not a skill name (letters, digits, -, _ and ., at most 64)"
                        ),
                    ));
                }
                if value != folder {
                    notices.push(at(
                        line,
                        format!("the name {value:?} differs from the folder's {folder:?}; {value:?} is used"),
                    ));
                }
                name = Some((line, value));
            }
            "description" => description = Some(value.scalar()),
            "allowed-tools" | "allowed_tools" | "allowedTools" => {
                tools = tool_names(&value, line, path, notices);
            }
            // Fields of the standard that change nothing here.
            "license" | "metadata" | "compatibility" | "version" => {}
            other => notices.push(at(
                line,
                format!("field {other:?} is not used here; ignored"),
            )),
        }
    }
    let name = match name {
        Some((_, name)) => name,
        None if valid_name(folder) => folder.to_string(),
        None => return Err((1, "the skill has no name".into())),
    };
    let description = description.unwrap_or_default();
    if description.trim().is_empty() {
        return Err((
            1,
            "the skill has no description (the model needs it to know when to use it)".into(),
        ));
    }
    Ok(Skill {
        name,
        description: description.trim().to_string(),
        allowed_tools: tools,
        dir: PathBuf::new(),
        file: PathBuf::new(),
        scope: "",
        source: String::new(),
        shadowed: Vec::new(),
    })
}

fn read_commands(root: &Root, dir: &Path, inside: &dyn Fn(&Path) -> bool, catalog: &mut Catalog) {
    for (file_name, path, is_dir) in entries(dir, inside, &mut catalog.notices) {
        let Some(name) = file_name.strip_suffix(".md") else {
            continue;
        };
        if is_dir {
            continue;
        }
        let at = |line: usize, message: &str| format!("{}:{line}: {message}", path.display());
        if !valid_name(name) {
            catalog.notices.push(at(
                0,
                "the file name is not a command name (letters, digits, -, _ and .); not read",
            ));
            continue;
        }
        let text = match read_head(&path, READ_CAP) {
            Ok(Some(text)) => text,
            Ok(None) => continue,
            Err(err) => {
                catalog.notices.push(at(0, &format!("cannot read: {err}")));
                continue;
            }
        };
        match parse_command(&text, name, root.claude, &path, &mut catalog.notices) {
            Ok(mut command) => {
                command.file = path.clone();
                command.scope = root.scope;
                command.source = root.path.display().to_string();
                match catalog.commands.iter_mut().find(|c| c.name == command.name) {
                    Some(first) => first.shadowed.push(path.display().to_string()),
                    None => catalog.commands.push(command),
                }
            }
            Err((line, message)) => catalog.notices.push(at(line, &message)),
        }
    }
}

fn parse_command(
    text: &str,
    name: &str,
    claude: bool,
    path: &Path,
    notices: &mut Vec<String>,
) -> Result<CustomCommand, (usize, String)> {
    let (fields, body) = frontmatter(text)?;
    let mut command = CustomCommand {
        name: name.to_string(),
        description: String::new(),
        argument_hint: None,
        model: None,
        allowed_tools: None,
        template: body,
        file: PathBuf::new(),
        scope: "",
        source: String::new(),
        shadowed: Vec::new(),
    };
    for (line, key, value) in fields {
        match key.as_str() {
            "description" => command.description = value.scalar(),
            "argument-hint" | "argument_hint" => {
                command.argument_hint = Some(value.scalar()).filter(|h| !h.is_empty())
            }
            "model" => {
                command.model = if claude {
                    claude_model(&value.scalar())
                } else {
                    Some(value.scalar()).filter(|m| !m.is_empty() && m != "inherit")
                }
            }
            "allowed-tools" | "allowed_tools" | "allowedTools" => {
                let names = tool_names(&value, line, path, notices);
                // Names that mean nothing here must not leave the turn with no tools at
                // all: then the command narrows nothing (the notice says why).
                command.allowed_tools = if names.is_empty() {
                    notices.push(format!(
                        "{}:{line}: allowed-tools names no tool of this app; every tool stays offered",
                        path.display()
                    ));
                    None
                } else {
                    Some(names)
                };
            }
            // Claude Code's switch for the model calling it as a tool: commands here are
            // only ever the person's.
            "disable-model-invocation" => {}
            other => notices.push(format!(
                "{}:{line}: field {other:?} is not used here; ignored",
                path.display()
            )),
        }
    }
    if command.description.is_empty() {
        // Claude Code's rule: without a description, the first line of the text.
        let first = command
            .template
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("");
        command.description = cut(first.trim_start_matches('#').trim(), 100);
    }
    Ok(command)
}

/// `text` cut at `max` bytes (on a character boundary) with an ellipsis.
fn cut(text: &str, max: usize) -> String {
    let head = crate::text::head(text, max);
    if head.len() == text.len() {
        return text.to_string();
    }
    format!("{head}…")
}

/// The words of a command's arguments: spaces separate, quotes group (`"a b" c`).
fn split_args(args: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut quote: Option<char> = None;
    let mut started = false;
    for c in args.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => current.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                started = true;
            }
            (None, c) if c.is_whitespace() => {
                if started || !current.is_empty() {
                    words.push(std::mem::take(&mut current));
                }
                started = false;
            }
            (None, c) => current.push(c),
        }
    }
    if started || !current.is_empty() {
        words.push(current);
    }
    words
}

/// A command's text with its arguments put in: `$ARGUMENTS` is all of them, `$1` … the
/// words. A text with no placeholder gets the arguments after it, so none are lost.
pub fn fill(template: &str, args: &str) -> String {
    let words = split_args(args);
    let mut out = String::with_capacity(template.len() + args.len());
    let mut used = false;
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix("ARGUMENTS") {
            out.push_str(args);
            used = true;
            rest = tail;
            continue;
        }
        let digits = after.chars().take_while(char::is_ascii_digit).count();
        if digits > 0 {
            let index: usize = after[..digits].parse().unwrap_or(0);
            if index > 0 {
                out.push_str(words.get(index - 1).map_or("", String::as_str));
                used = true;
                rest = &after[digits..];
                continue;
            }
        }
        out.push('$');
        rest = after;
    }
    out.push_str(rest);
    if !used && !args.trim().is_empty() {
        out.push_str(&format!("\n\nARGUMENTS: {args}"));
    }
    out
}

/// A skill's whole `SKILL.md` body, read when it is used.
fn skill_body(skill: &Skill) -> Result<String, SkillError> {
    let unreadable = |message: String| SkillError::Unreadable {
        path: skill.file.display().to_string(),
        message,
    };
    let text = read_head(&skill.file, READ_CAP)
        .map_err(|e| unreadable(e.to_string()))?
        .ok_or_else(|| unreadable("it is gone".into()))?;
    let (_, body) =
        frontmatter(&text).map_err(|(line, m)| unreadable(format!("line {line}: {m}")))?;
    Ok(body)
}

/// What the model (or the person's message) gets when a skill is used: where it is, its
/// files, what its `allowed-tools` means here, then its instructions.
fn loaded_text(skill: &Skill, body: &str) -> String {
    let mut out = format!(
        "Skill {:?} ({}).\nIts folder: {}\nPaths in it are relative to that folder; read its files with skill {{\"name\": {:?}, \"file\": \"<path>\"}} (no approval needed), and run its scripts with run_command (asked and sandboxed like any command).\n",
        skill.name,
        skill.file.display(),
        skill.dir.display(),
        skill.name,
    );
    let files = skill_files(&skill.dir);
    if !files.is_empty() {
        out.push_str(&format!("Files: {}\n", files.join(", ")));
    }
    if !skill.allowed_tools.is_empty() {
        out.push_str(&format!(
            "Tools it names (allowed-tools): {}. Nothing is pre-approved here: those calls still go through the person's approvals and the sandbox.\n",
            skill.allowed_tools.join(", ")
        ));
    }
    out.push('\n');
    out.push_str(body);
    out
}

/// The files of a skill's folder (three levels, links not followed), relative to it.
fn skill_files(dir: &Path) -> Vec<String> {
    let mut files = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), 0usize)];
    while let Some((folder, depth)) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&folder) else {
            continue;
        };
        let mut names: Vec<_> = read.flatten().collect();
        names.sort_by_key(|e| e.file_name());
        for entry in names.into_iter().rev() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() && depth < 2 {
                stack.push((path, depth + 1));
            } else if !kind.is_dir() {
                if let Ok(relative) = path.strip_prefix(dir) {
                    let relative = relative.display().to_string();
                    if relative != SKILL_FILE {
                        files.push(relative);
                    }
                }
            }
        }
    }
    files.sort();
    files.truncate(MAX_LISTED_FILES);
    files
}

/// Expands the person's line: `/name args` of a custom command (its text with the
/// arguments) or of a skill (the skill's instructions after the arguments), and any
/// `$name` of a skill elsewhere in the text (its instructions appended).
pub fn expand(catalog: &Catalog, text: &str) -> Result<ExpandedCommand, SkillError> {
    let trimmed = text.trim_start();
    if let Some(line) = trimmed.strip_prefix('/') {
        let (name, args) = match line.split_once(char::is_whitespace) {
            Some((name, args)) => (name, args.trim()),
            None => (line.trim_end(), ""),
        };
        if let Some(command) = catalog.command(name) {
            // A narrower turn is said, never silent.
            let notices = command
                .allowed_tools
                .iter()
                .map(|tools| {
                    format!(
                        "/{} runs its turn with only these tools: {}",
                        command.name,
                        tools.join(", ")
                    )
                })
                .collect();
            return Ok(ExpandedCommand {
                content: fill(&command.template, args),
                kind: "command".into(),
                name: command.name.clone(),
                model: command.model.clone(),
                allowed_tools: command.allowed_tools.clone(),
                notices,
            });
        }
        if let Some(skill) = catalog.skill(name) {
            let body = skill_body(skill)?;
            let invoked = format!(
                "[The person invoked the skill {:?}; its instructions follow.]\n{}",
                skill.name,
                loaded_text(skill, &body)
            );
            let content = if args.is_empty() {
                invoked
            } else {
                format!("{args}\n\n{invoked}")
            };
            return Ok(ExpandedCommand {
                content,
                kind: "skill".into(),
                name: skill.name.clone(),
                model: None,
                allowed_tools: None,
                notices: Vec::new(),
            });
        }
        return Err(SkillError::NotFound(name.to_string()));
    }
    // `$name` anywhere (Codex's way of naming a skill in a message).
    let mut named: Vec<&Skill> = Vec::new();
    for word in text.split(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | ')' | '(')) {
        let Some(name) = word.strip_prefix('$') else {
            continue;
        };
        let name = name.trim_end_matches(['.', ':', '!', '?']);
        if let Some(skill) = catalog.skill(name) {
            if !named.iter().any(|s| s.name == skill.name) {
                named.push(skill);
            }
        }
    }
    let Some(first) = named.first() else {
        return Err(SkillError::NothingToExpand);
    };
    let mut content = text.to_string();
    for skill in &named {
        let body = skill_body(skill)?;
        content.push_str(&format!(
            "\n\n[The person named the skill {:?}; its instructions follow.]\n{}",
            skill.name,
            loaded_text(skill, &body)
        ));
    }
    Ok(ExpandedCommand {
        content,
        kind: "skill".into(),
        name: first.name.clone(),
        model: None,
        allowed_tools: None,
        notices: Vec::new(),
    })
}

/// Keeps a command's model only where it can mean something: a Claude model id (what
/// Claude Code's aliases become) sent to a server of another kind would fail the turn,
/// so it is left out with a notice and the session's own model is used.
pub fn fit_model(expanded: &mut ExpandedCommand, provider_kind: &str) {
    if let Some(model) = &expanded.model {
        if model.starts_with("claude-") && provider_kind != "anthropic" {
            expanded.notices.push(format!(
                "/{} asks for the model {model}, which this {provider_kind} server does not serve; the session's model is used",
                expanded.name
            ));
            expanded.model = None;
        }
    }
}

/// The list of skills as the `skill` tool's description carries it: each name and
/// description within [`LIST_BUDGET`], then names only, then a count.
pub fn list_text(skills: &[Skill]) -> String {
    let mut out = String::new();
    let mut rest = skills.iter();
    for skill in rest.by_ref() {
        let description = cut(&skill.description.replace('\n', " "), ENTRY_DESCRIPTION);
        let entry = format!("\n- {}: {description}", skill.name);
        if out.len() + entry.len() > LIST_BUDGET {
            let mut names = format!("\n- (description not listed) {}", skill.name);
            let mut left = 0;
            for skill in rest.by_ref() {
                if names.len() + skill.name.len() + 2 > NAMES_BUDGET {
                    left += 1;
                } else {
                    names.push_str(", ");
                    names.push_str(&skill.name);
                }
            }
            out.push_str(&names);
            if left > 0 {
                out.push_str(&format!(
                    "\n- … and {left} more skills not listed (the list is capped at {} KiB)",
                    (LIST_BUDGET + NAMES_BUDGET) / 1024
                ));
            }
            break;
        }
        out.push_str(&entry);
    }
    out
}

/// The `skill` tool of one turn: the skills it may load, listed in its description.
pub struct SkillTool {
    skills: Arc<Vec<Skill>>,
    description: String,
}

impl SkillTool {
    pub fn new(skills: Vec<Skill>) -> Self {
        let description = format!(
            "Load a skill: a folder of instructions (SKILL.md) with scripts and references for one kind of task. When a task matches a skill below, call skill with its name before starting and follow what it says. With `file` (a path inside the skill's folder, e.g. references/api.md) it reads that file instead. Skill files are read without approval; scripts run with run_command like any command.\nSkills:{}",
            list_text(&skills)
        );
        SkillTool {
            skills: Arc::new(skills),
            description,
        }
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SkillArgs {
    name: String,
    #[serde(default)]
    file: Option<String>,
}

#[async_trait]
impl Tool for SkillTool {
    fn name(&self) -> &str {
        "skill"
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "The skill's name, as listed"},
                "file": {"type": "string", "description": "A file inside the skill's folder to read instead of its SKILL.md"}
            },
            "required": ["name"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<String, ToolError> {
        let args: SkillArgs = parse_args(arguments.clone())?;
        let Some(skill) = self.skills.iter().find(|s| s.name == args.name).cloned() else {
            let names: Vec<&str> = self.skills.iter().map(|s| s.name.as_str()).collect();
            return Err(ToolError::InvalidArguments(format!(
                "no skill named {:?}; skills: {}",
                args.name,
                names.join(", ")
            )));
        };
        // A read of the skill's own folder: free, unless the person's policy for `skill`
        // says to ask (or deny).
        ctx.ask(ApprovalAsk {
            tool: "skill".into(),
            arguments,
            diff: None,
            access: Access::Read,
        })
        .await?;
        let work = move || match args.file {
            None => skill_body(&skill)
                .map(|body| loaded_text(&skill, &body))
                .map_err(|e| ToolError::Failed(e.to_string())),
            Some(file) => read_skill_file(&skill, &file),
        };
        tokio::task::spawn_blocking(work)
            .await
            .map_err(|err| ToolError::Failed(format!("the tool failed: {err}")))?
    }
}

/// A file of a skill's folder; links are followed only while they stay in that folder.
fn read_skill_file(skill: &Skill, file: &str) -> Result<String, ToolError> {
    let resolved = crate::tools::paths::resolve(&skill.dir, file)?;
    if !resolved.inside {
        return Err(ToolError::Failed(format!(
            "{file} is not inside the skill's folder {}; read it with read_file",
            skill.dir.display()
        )));
    }
    let (file_handle, len) = crate::tools::paths::open_regular(&resolved)?;
    let mut bytes = Vec::new();
    file_handle
        .take(READ_CAP)
        .read_to_end(&mut bytes)
        .map_err(|e| ToolError::Failed(format!("cannot read {}: {e}", resolved.display)))?;
    if bytes.iter().take(8192).any(|b| *b == 0) {
        return Err(ToolError::Failed(format!(
            "{} looks like a binary file ({len} bytes); skill reads only text",
            resolved.display
        )));
    }
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    if len > READ_CAP {
        text.push_str(&format!(
            "\n[truncated: {len} bytes, the first {READ_CAP} shown]"
        ));
    }
    Ok(text)
}

/// The turn's hook (`Shared::resolve_turn`): offers the `skill` tool, listing the skills
/// the workspace and the person have (only those a profile names, for its agents). No
/// skills, no tool: a workspace without any pays nothing per request.
pub fn offer(
    tools: &mut ToolRegistry,
    place: &Place,
    user_config: Option<&Path>,
    profile: Option<&Profile>,
) {
    let catalog = discover_at(place, &UserDirs::with_config(user_config));
    for notice in &catalog.notices {
        tracing::warn!("skills: {notice}");
    }
    let mut skills = catalog.skills;
    if let Some(profile) = profile {
        if !profile.allows("skill") {
            return;
        }
        if let Some(names) = &profile.skills {
            skills.retain(|s| names.contains(&s.name));
        }
    }
    if !skills.is_empty() {
        tools.register(Arc::new(SkillTool::new(skills)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn skill_md(name: &str, description: &str) -> String {
        format!("---\nname: {name}\ndescription: {description}\n---\nDo the {name} thing.\n")
    }

    #[test]
    fn fill_puts_arguments_in_their_places() {
        assert_eq!(
            fill("Fix issue $1 in $2.", "42 \"src/a b.rs\""),
            "Fix issue 42 in src/a b.rs."
        );
        assert_eq!(fill("Do: $ARGUMENTS!", "x y"), "Do: x y!");
        assert_eq!(fill("Costs $5? $3", "a"), "Costs ? ");
        assert_eq!(
            fill("No place.", "extra words"),
            "No place.\n\nARGUMENTS: extra words"
        );
        assert_eq!(fill("No place.", ""), "No place.");
        assert_eq!(
            fill("$ alone and $0", "a"),
            "$ alone and $0\n\nARGUMENTS: a"
        );
    }

    #[test]
    fn discovery_reads_every_folder_and_the_first_name_wins() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        let ws = repo.join("pkg");
        std::fs::create_dir_all(repo.join(".git")).unwrap();
        let home = dir.path().join("home");
        let config = dir.path().join("config");
        write(
            &ws.join(".bumblehive/skills/alpha/SKILL.md"),
            &skill_md("alpha", "A from ours"),
        );
        write(
            &ws.join(".agents/skills/beta/SKILL.md"),
            &skill_md("beta", "B"),
        );
        write(
            &repo.join(".claude/skills/alpha/SKILL.md"),
            &skill_md("alpha", "A again"),
        );
        write(
            &repo.join(".claude/skills/gamma/SKILL.md"),
            "---\nname: gamma\ndescription: G\nallowed-tools: Bash(git add:*), Read, Frobnicate\nmetadata:\n  author: me\n  version: \"1\"\n---\nbody\n",
        );
        write(
            &home.join(".agents/skills/delta/SKILL.md"),
            &skill_md("delta", "D"),
        );
        write(
            &home.join(".claude/skills/broken/SKILL.md"),
            "---\nname: broken\ndescription: x\nthis is not a field\n---\n",
        );
        write(
            &config.join("skills/epsilon/SKILL.md"),
            &skill_md("epsilon", "E"),
        );
        write(
            &ws.join(".claude/skills/nodesc/SKILL.md"),
            "---\nname: nodesc\n---\nbody",
        );
        std::fs::create_dir_all(ws.join(".agents/skills/shared-helpers")).unwrap();
        write(
            &ws.join(".claude/commands/review.md"),
            "---\ndescription: Review a file\nargument-hint: FILE\nmodel: haiku\nallowed-tools: Read, Grep\n---\nReview $1 carefully.\n",
        );
        write(&config.join("commands/review.md"), "Shadowed review\n");
        write(
            &config.join("commands/plain.md"),
            "# Say hello\nHello $ARGUMENTS\n",
        );
        write(
            &config.join("commands/web.md"),
            "---\nallowed-tools: WebFetch\n---\nLook it up.\n",
        );
        let catalog = discover(
            &ws,
            &UserDirs {
                home: Some(home.clone()),
                config: Some(config.clone()),
            },
        );
        let names: Vec<&str> = catalog.skills.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["alpha", "beta", "gamma", "delta", "epsilon"]);
        let alpha = catalog.skill("alpha").unwrap();
        assert_eq!(alpha.description, "A from ours");
        assert_eq!(alpha.scope, "workspace");
        assert!(
            alpha.source.ends_with("pkg/.bumblehive/skills"),
            "{}",
            alpha.source
        );
        assert_eq!(alpha.shadowed.len(), 1);
        assert!(alpha.shadowed[0].ends_with("repo/.claude/skills/alpha/SKILL.md"));
        assert_eq!(catalog.skill("delta").unwrap().scope, "user");
        let gamma = catalog.skill("gamma").unwrap();
        assert_eq!(gamma.allowed_tools, ["run_command", "read_file"]);
        let notices = catalog.notices.join("\n");
        assert!(
            notices.contains("broken/SKILL.md:4: expected `key: value`"),
            "{notices}"
        );
        assert!(
            notices.contains("nodesc/SKILL.md:1: the skill has no description"),
            "{notices}"
        );
        assert!(notices.contains("\"Frobnicate\""), "{notices}");
        assert!(!notices.contains("metadata"), "{notices}");
        let review = catalog.command("review").unwrap();
        assert_eq!(review.description, "Review a file");
        assert_eq!(review.argument_hint.as_deref(), Some("FILE"));
        assert_eq!(review.model.as_deref(), Some("claude-haiku-4-5"));
        assert_eq!(
            review.allowed_tools.as_deref(),
            Some(&["read_file".to_string(), "grep".to_string()][..])
        );
        assert_eq!(review.shadowed.len(), 1);
        assert_eq!(catalog.command("plain").unwrap().description, "Say hello");
        assert_eq!(catalog.command("web").unwrap().allowed_tools, None);
        assert!(
            notices.contains("web.md:2: allowed-tools names no tool"),
            "{notices}"
        );
        let info = catalog.info();
        assert_eq!(info.skills.len(), 5);
        assert_eq!(info.commands.len(), 3);
    }

    #[cfg(unix)]
    #[test]
    fn links_are_followed_only_inside_the_skill_folders() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        let outside = dir.path().join("outside");
        write(
            &outside.join("evil/SKILL.md"),
            &skill_md("evil", "should not load"),
        );
        write(
            &outside.join("secret.md"),
            "---\nname: leak\ndescription: x\n---\n",
        );
        write(
            &ws.join(".agents/skills/real/SKILL.md"),
            &skill_md("real", "R"),
        );
        std::fs::create_dir_all(ws.join(".claude")).unwrap();
        // A whole folder linked to another root: the same skills, read once.
        std::os::unix::fs::symlink(ws.join(".agents/skills"), ws.join(".claude/skills")).unwrap();
        std::fs::create_dir_all(ws.join(".bumblehive/skills/linked-md")).unwrap();
        std::os::unix::fs::symlink(outside.join("evil"), ws.join(".agents/skills/evil")).unwrap();
        std::os::unix::fs::symlink(
            outside.join("secret.md"),
            ws.join(".bumblehive/skills/linked-md/SKILL.md"),
        )
        .unwrap();
        std::os::unix::fs::symlink(
            ws.join(".agents/skills/real"),
            ws.join(".bumblehive/skills/alias"),
        )
        .unwrap();
        let catalog = discover(&ws, &UserDirs::default());
        let names: Vec<&str> = catalog.skills.iter().map(|s| s.name.as_str()).collect();
        // `alias` is `real` by another name: found first (ours), `real` is its shadow.
        assert_eq!(names, ["real"], "{:?}", catalog.notices);
        assert_eq!(catalog.skills[0].shadowed.len(), 1);
        let notices = catalog.notices.join("\n");
        assert!(notices.contains("evil: a link to"), "{notices}");
        assert!(
            notices.contains("linked-md/SKILL.md:0: a link outside"),
            "{notices}"
        );
    }

    #[test]
    fn the_list_keeps_to_its_budget_and_still_names_every_skill_it_can() {
        let skills: Vec<Skill> = (0..400)
            .map(|i| Skill {
                name: format!("skill-{i:03}"),
                description: "x".repeat(100),
                allowed_tools: Vec::new(),
                dir: PathBuf::new(),
                file: PathBuf::new(),
                scope: "workspace",
                source: String::new(),
                shadowed: Vec::new(),
            })
            .collect();
        let text = list_text(&skills);
        assert!(
            text.len() <= LIST_BUDGET + NAMES_BUDGET + 200,
            "{}",
            text.len()
        );
        assert!(text.contains("- skill-000: xxx"));
        assert!(text.contains("(description not listed)"));
        assert!(text.contains("more skills not listed"));
        let few = list_text(&skills[..3]);
        assert_eq!(few.lines().filter(|l| l.starts_with("- ")).count(), 3);
    }

    #[test]
    fn expansion_of_commands_and_skills() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path();
        write(
            &ws.join(".agents/skills/deploy/SKILL.md"),
            &skill_md("deploy", "Deploys"),
        );
        write(
            &ws.join(".agents/skills/deploy/scripts/run.sh"),
            "echo hi\n",
        );
        write(
            &ws.join(".bumblehive/commands/fix.md"),
            "---\ndescription: Fix\n---\nFix issue #$1 ($ARGUMENTS).\n",
        );
        let catalog = discover(ws, &UserDirs::default());
        let fix = expand(&catalog, "/fix 12 now").unwrap();
        assert_eq!(fix.content, "Fix issue #12 (12 now).");
        assert_eq!(fix.kind, "command");
        let skill = expand(&catalog, "/deploy to staging").unwrap();
        assert!(
            skill
                .content
                .starts_with("to staging\n\n[The person invoked the skill \"deploy\"")
        );
        assert!(skill.content.contains("Do the deploy thing."));
        assert!(skill.content.contains("Files: scripts/run.sh"));
        let named = expand(&catalog, "please use $deploy.").unwrap();
        assert!(
            named
                .content
                .starts_with("please use $deploy.\n\n[The person named the skill")
        );
        assert_eq!(
            expand(&catalog, "/nope"),
            Err(SkillError::NotFound("nope".into()))
        );
        assert_eq!(
            expand(&catalog, "cost $5"),
            Err(SkillError::NothingToExpand)
        );
    }
}
