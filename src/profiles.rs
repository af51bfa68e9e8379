//! Agent profiles (SPEC §11): named sub-agents with their own instructions, provider or model, and tools, read from Markdown files with YAML frontmatter (ours and Claude Code's) and from Codex's TOML roles, plus the built-in `general`, `explore` and `review`.
//!
//! Files people already have are read as they are: fields that mean the same are mapped,
//! the rest are ignored with a notice, and a broken file is reported with its path and
//! line while the others still load. Nothing here fails a run.

use std::path::{Path, PathBuf};

use crate::workspace::Place;

/// The tools that only read (the `explore` and `review` profiles).
pub const READ_ONLY_TOOLS: &[&str] = &["read_file", "list_dir", "glob", "grep"];

pub use crate::protocol::{Profile, Profiles};

/// The built-in profiles.
pub fn built_in() -> Vec<Profile> {
    let profile =
        |name: &str, description: &str, tools: Option<&[&str]>, instructions: &str| Profile {
            name: name.into(),
            description: description.into(),
            provider: None,
            model: None,
            tools: tools.map(|t| t.iter().map(|s| s.to_string()).collect()),
            disallowed_tools: Vec::new(),
            max_turns: None,
            isolation: None,
            skills: None,
            instructions: instructions.into(),
            acp: None,
            source: "built-in".into(),
            notices: Vec::new(),
        };
    vec![
        profile(
            "general",
            "A general-purpose agent with every tool.",
            None,
            "",
        ),
        profile(
            "explore",
            "Reads and searches the workspace to answer a question; changes nothing.",
            Some(READ_ONLY_TOOLS),
            "Explore the workspace with the read-only tools to answer the task. Cite file paths and line numbers. Change nothing.",
        ),
        profile(
            "review",
            "Reviews code for defects, risks and unclear parts; changes nothing.",
            Some(READ_ONLY_TOOLS),
            "You are a careful code reviewer. Read the code the task names, then report concrete defects (with file and line), risks and unclear parts, most important first. Do not change anything; say what you would change and why.",
        ),
    ]
}

/// The profiles for a workspace: `<workspace>/.bumblehive/agents/*.md`, then
/// `.claude/agents/*.md` and `.codex/agents/*.toml` of the workspace, then the user's
/// `<user_dir>/agents/*.md`, then the built-ins. A name found earlier wins.
/// What to install for a known ACP agent's command (empty for any other): said when a
/// profile's agent is missing, in the list and when a child fails to start it.
pub fn acp_install_hint(command: &str) -> &'static str {
    match command {
        "claude-agent-acp" => " (npm install -g @agentclientprotocol/claude-agent-acp)",
        "codex-acp" => " (npm install -g @agentclientprotocol/codex-acp)",
        "npx" | "npm" | "node" => " (install Node.js and npm)",
        "uvx" | "uv" => " (install uv: pip install uv)",
        _ => "",
    }
}

/// Whether `command` would start: a path naming an executable file, or a name found in
/// one of `path`'s folders (the profile's own `PATH`, else ours).
fn runnable(command: &str, path: Option<&str>) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if command.contains('/') {
        return executable(Path::new(command));
    }
    let path = path
        .map(str::to_string)
        .or_else(|| std::env::var("PATH").ok())
        .unwrap_or_default();
    std::env::split_paths(&path).any(|dir| executable(&dir.join(command)))
}

/// Notes on each `kind: acp` profile whose agent is not installed, so the person reads
/// what to install in the list (issue #29) before a child fails on it.
pub fn note_missing_agents(mut profiles: Profiles) -> Profiles {
    for profile in &mut profiles.profiles {
        let Some(agent) = &profile.acp else {
            continue;
        };
        if !runnable(&agent.command, agent.env.get("PATH").map(String::as_str)) {
            profile.notices.push(format!(
                "`{}` is not installed or not on PATH: install it{}, or fix the profile's `command`",
                agent.command,
                acp_install_hint(&agent.command)
            ));
        }
    }
    profiles
}

/// The agent profiles of `workspace` and of the person (`user_dir`'s `agents/`).
pub fn load(workspace: &Path, user_dir: Option<&Path>) -> Profiles {
    load_at(&Place::find(workspace), user_dir)
}

/// [`load`] for a workspace already found (a run's turn finds it once).
pub fn load_at(place: &Place, user_dir: Option<&Path>) -> Profiles {
    let mut found = Profiles::default();
    // The workspace's profile files must stay inside it: a link out (to a key file) would
    // put the outside file in a child's system prompt (security review 2, finding 9).
    let workspace = place.real.as_path();
    let mut sources: Vec<(PathBuf, Format, Option<&Path>)> = vec![
        (
            workspace.join(".bumblehive/agents"),
            Format::Ours,
            Some(workspace),
        ),
        (
            workspace.join(".claude/agents"),
            Format::Claude,
            Some(workspace),
        ),
        (
            workspace.join(".codex/agents"),
            Format::Codex,
            Some(workspace),
        ),
    ];
    if let Some(user) = user_dir {
        sources.push((user.join("agents"), Format::Ours, None));
    }
    for (dir, format, inside) in sources {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            let wanted = match format {
                Format::Codex => "toml",
                Format::Ours | Format::Claude => "md",
            };
            if path.extension().and_then(|e| e.to_str()) != Some(wanted) {
                continue;
            }
            match read_profile(&path, format, inside) {
                Ok(profile) => match found.profiles.iter_mut().find(|p| p.name == profile.name) {
                    None => found.profiles.push(profile),
                    Some(winner) if inside.is_none() => {
                        replaced(winner, &profile.source, workspace)
                    }
                    Some(_) => {}
                },
                Err(err) => found.errors.push(err),
            }
        }
    }
    for profile in built_in() {
        match found.profiles.iter_mut().find(|p| p.name == profile.name) {
            None => found.profiles.push(profile),
            Some(winner) => replaced(winner, "the built-in profile", workspace),
        }
    }
    found
}

/// Notes on a workspace profile that it replaces a user-level or built-in profile of the
/// same name: a repository can take a name the person relies on (`explore`, their own).
fn replaced(winner: &mut Profile, other: &str, workspace: &Path) {
    // The person's own profile replacing a built-in one is their choice: no notice.
    if !Path::new(&winner.source).starts_with(workspace) {
        return;
    }
    winner.notices.push(format!(
        "this workspace profile replaces {other} of the same name"
    ));
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Ours,
    Claude,
    Codex,
}

fn read_profile(path: &Path, format: Format, inside: Option<&Path>) -> Result<Profile, String> {
    let at = |line: usize, message: &str| format!("{}:{line}: {message}", path.display());
    let text = match inside {
        Some(root) => crate::tools::paths::open_inside(path, root).and_then(|mut file| {
            use std::io::Read;
            let mut text = String::new();
            file.read_to_string(&mut text)
                .map(|_| text)
                .map_err(|err| err.to_string())
        }),
        None => std::fs::read_to_string(path).map_err(|err| err.to_string()),
    }
    .map_err(|err| at(0, &err))?;
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("agent")
        .to_string();
    let mut profile = Profile::named(&stem, &path.display().to_string());
    match format {
        Format::Codex => read_codex(&text, &mut profile).map_err(|(line, m)| at(line, &m))?,
        Format::Ours | Format::Claude => {
            read_markdown(&text, format, &mut profile).map_err(|(line, m)| at(line, &m))?
        }
    }
    if profile.name.trim().is_empty() {
        return Err(at(1, "the profile has no name"));
    }
    Ok(profile)
}

/// A frontmatter value: a scalar, or a list (`[a, b]`, `- a` lines, or `a, b` for the
/// tool lists Claude Code writes).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Scalar(String),
    List(Vec<String>),
    /// Indented `key: value` lines under a key (the Agent Skills `metadata:` block).
    Map(Vec<(String, String)>),
}

impl Value {
    pub(crate) fn list(&self) -> Vec<String> {
        match self {
            Value::List(items) => items.clone(),
            Value::Map(pairs) => pairs.iter().map(|(k, _)| k.clone()).collect(),
            Value::Scalar(text) => text
                .split(',')
                .map(|s| unquote(s.trim()))
                .filter(|s| !s.is_empty())
                .collect(),
        }
    }

    pub(crate) fn scalar(&self) -> String {
        match self {
            Value::Scalar(text) => text.clone(),
            Value::List(items) => items.join(", "),
            Value::Map(pairs) => pairs
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

pub(crate) fn unquote(text: &str) -> String {
    let t = text.trim();
    if t.len() >= 2
        && ((t.starts_with('"') && t.ends_with('"')) || (t.starts_with('\'') && t.ends_with('\'')))
    {
        t[1..t.len() - 1].to_string()
    } else {
        t.to_string()
    }
}

/// Frontmatter fields (line, key, value), or where and why it does not parse.
pub(crate) type Fields = Vec<(usize, String, Value)>;
pub(crate) type ParseError = (usize, String);

/// Parses `---\nkey: value\n…\n---\nbody`. Only what profiles and skills use: scalars,
/// inline and block lists, one level of `key: value` under a key, and `|` / `>` blocks
/// for long descriptions. Text without frontmatter is all body.
pub(crate) fn frontmatter(text: &str) -> Result<(Fields, String), ParseError> {
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, first)) if first.trim() == "---" => {}
        _ => return Ok((Vec::new(), text.to_string())),
    }
    let mut fields: Vec<(usize, String, Value)> = Vec::new();
    let mut body_start = None;
    let mut block: Option<Block> = None;
    let all: Vec<(usize, &str)> = lines.collect();
    let mut i = 0;
    while i < all.len() {
        let (index, line) = all[i];
        let number = index + 1;
        if line.trim() == "---" {
            body_start = Some(index + 1);
            break;
        }
        if let Some(open) = block.as_mut() {
            if line.starts_with(' ') || line.starts_with('\t') || line.trim().is_empty() {
                let item = line.trim();
                if open.literal {
                    open.items.push(item.to_string());
                } else if let Some(rest) = item.strip_prefix("- ") {
                    open.items.push(unquote(rest));
                } else if item == "-" || item.is_empty() {
                } else if let Some((key, value)) = item.split_once(':') {
                    open.pairs.push((key.trim().to_string(), unquote(value)));
                } else {
                    return Err((number, format!("expected a list item, got {item:?}")));
                }
                i += 1;
                continue;
            }
            if let Some(done) = block.take() {
                fields.push(done.finish());
            }
        }
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            i += 1;
            continue;
        }
        let Some((key, rest)) = line.split_once(':') else {
            return Err((
                number,
                format!("expected `key: value`, got {:?}", line.trim()),
            ));
        };
        let key = key.trim().to_string();
        let rest = rest.trim();
        if rest.is_empty() {
            block = Some(Block::new(number, key, false));
        } else if rest == "|" || rest == ">" || rest == "|-" || rest == ">-" {
            block = Some(Block::new(number, key, true));
        } else if let Some(inner) = rest.strip_prefix('[') {
            let inner = inner.strip_suffix(']').ok_or((
                number,
                "a list that opens with [ must close with ]".to_string(),
            ))?;
            let items = inner
                .split(',')
                .map(unquote)
                .filter(|s| !s.is_empty())
                .collect();
            fields.push((number, key, Value::List(items)));
        } else {
            fields.push((number, key, Value::Scalar(unquote(rest))));
        }
        i += 1;
    }
    if let Some(done) = block.take() {
        fields.push(done.finish());
    }
    let Some(start) = body_start else {
        return Err((1, "the frontmatter that opens with --- never closes".into()));
    };
    let body = text.lines().skip(start).collect::<Vec<_>>().join("\n");
    Ok((fields, body.trim().to_string()))
}

/// A key whose value is on the indented lines below it.
struct Block {
    line: usize,
    key: String,
    items: Vec<String>,
    pairs: Vec<(String, String)>,
    /// `|` or `>`: the lines are text, not items.
    literal: bool,
}

impl Block {
    fn new(line: usize, key: String, literal: bool) -> Self {
        Block {
            line,
            key,
            items: Vec::new(),
            pairs: Vec::new(),
            literal,
        }
    }

    fn finish(self) -> (usize, String, Value) {
        let value = if self.literal {
            Value::Scalar(self.items.join("\n").trim().to_string())
        } else if !self.pairs.is_empty() && self.items.is_empty() {
            Value::Map(self.pairs)
        } else {
            Value::List(self.items)
        };
        (self.line, self.key, value)
    }
}

/// Claude Code's tool names, as ours.
pub(crate) fn claude_tool(name: &str) -> Option<&'static str> {
    Some(match name {
        "Read" => "read_file",
        "Write" => "write_file",
        "Edit" | "MultiEdit" => "edit_file",
        "Bash" => "run_command",
        "Grep" => "grep",
        "Glob" => "glob",
        "LS" => "list_dir",
        "Task" => "sub_agent",
        "Skill" => "skill",
        _ => return None,
    })
}

/// Claude Code's model aliases, as model ids.
pub(crate) fn claude_model(alias: &str) -> Option<String> {
    match alias {
        "inherit" | "" => None,
        "sonnet" => Some("claude-sonnet-4-5".into()),
        "opus" => Some("claude-opus-4-1".into()),
        "haiku" => Some("claude-haiku-4-5".into()),
        other => Some(other.to_string()),
    }
}

fn read_markdown(text: &str, format: Format, profile: &mut Profile) -> Result<(), (usize, String)> {
    let (fields, body) = frontmatter(text)?;
    profile.instructions = body;
    let mut acp_kind = false;
    let mut acp_command: Option<(usize, String)> = None;
    let mut acp_args = Vec::new();
    let mut acp_env = std::collections::BTreeMap::new();
    for (line, key, value) in fields {
        match key.as_str() {
            "name" => profile.name = value.scalar(),
            "description" => profile.description = value.scalar(),
            "provider" => profile.provider = Some(value.scalar()),
            "model" => {
                profile.model = if format == Format::Claude {
                    claude_model(&value.scalar())
                } else {
                    Some(value.scalar()).filter(|m| !m.is_empty() && m != "inherit")
                }
            }
            "tools" | "disallowed_tools" | "disallowedTools" => {
                let mut names = Vec::new();
                for tool in value.list() {
                    match (format, claude_tool(&tool)) {
                        (Format::Claude, Some(ours)) => names.push(ours.to_string()),
                        (Format::Claude, None) if !tool.contains('_') => profile.notices.push(
                            format!("line {line}: tool {tool:?} has no counterpart here; ignored"),
                        ),
                        _ => names.push(tool),
                    }
                }
                if key == "tools" {
                    profile.tools = Some(names);
                } else {
                    profile.disallowed_tools = names;
                }
            }
            // The skills its sub-agents get (only these; `[]` for none).
            "skills" => profile.skills = Some(value.list()),
            // An external ACP agent (SPEC §11): `kind: acp` with its `command`, `args`
            // and `env`; checked once every field is read.
            "kind" => match value.scalar().as_str() {
                "acp" => acp_kind = true,
                "" | "bumblehive" => {}
                other => {
                    return Err((
                        line,
                        format!("kind must be \"acp\" or left out, got {other:?}"),
                    ));
                }
            },
            "command" => acp_command = Some((line, value.scalar())),
            "args" => acp_args = value.list(),
            "env" => match value {
                Value::Map(pairs) => acp_env = pairs.into_iter().collect(),
                _ => return Err((line, "env must be indented `NAME: value` lines".into())),
            },
            "isolation" => match value.scalar().as_str() {
                "worktree" => profile.isolation = Some("worktree".into()),
                "none" | "" => profile.isolation = None,
                other => {
                    return Err((
                        line,
                        format!("isolation must be \"worktree\" or \"none\", got {other:?}"),
                    ));
                }
            },
            "max_turns" | "maxTurns" => match value.scalar().parse() {
                Ok(turns) => profile.max_turns = Some(turns),
                Err(_) => {
                    return Err((
                        line,
                        format!("max_turns must be a number, got {:?}", value.scalar()),
                    ));
                }
            },
            other => profile.notices.push(format!(
                "line {line}: field {other:?} is not used here; ignored"
            )),
        }
    }
    match (acp_kind, acp_command) {
        (true, Some((_, command))) if !command.trim().is_empty() => {
            profile.acp = Some(crate::protocol::AcpAgent {
                command,
                args: acp_args,
                env: acp_env,
            });
        }
        (true, _) => return Err((1, "kind: acp needs a `command`".into())),
        (false, Some((line, _))) => profile.notices.push(format!(
            "line {line}: `command` is used only with kind: acp; ignored"
        )),
        (false, None) => {}
    }
    Ok(())
}

fn read_codex(text: &str, profile: &mut Profile) -> Result<(), (usize, String)> {
    let table: toml::Table = text.parse().map_err(|err: toml::de::Error| {
        let line = err.span().map_or(1, |span| {
            text[..span.start.min(text.len())].lines().count().max(1)
        });
        (line, err.message().to_string())
    })?;
    for (key, value) in table {
        let text = value.as_str().map(str::to_string);
        match (key.as_str(), text) {
            ("name", Some(v)) => profile.name = v,
            ("description", Some(v)) => profile.description = v,
            ("developer_instructions" | "instructions", Some(v)) => profile.instructions = v,
            ("model", Some(v)) => profile.model = Some(v),
            (other, _) => profile
                .notices
                .push(format!("field {other:?} is not used here; ignored")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frontmatter_lists_and_blocks() {
        let text = "---\nname: a\ntools: [read_file, \"grep\"]\ndisallowed_tools:\n  - run_command\ndescription: |\n  two\n  lines\n---\nBody here.\n";
        let mut p = read_profile_text(text, Format::Ours).unwrap();
        assert_eq!(p.name, "a");
        assert_eq!(p.tools, Some(vec!["read_file".into(), "grep".into()]));
        assert_eq!(p.disallowed_tools, vec!["run_command".to_string()]);
        assert_eq!(p.description, "two\nlines");
        assert_eq!(p.instructions, "Body here.");
        p.tools = None;
        assert!(!p.allows("run_command") && p.allows("write_file"));
    }

    #[test]
    fn broken_frontmatter_names_the_line() {
        let err = read_profile_text("---\nname: a\nnot a field\n---\n", Format::Ours).unwrap_err();
        assert_eq!(err.0, 3);
        let err = read_profile_text("---\nname: a\n", Format::Ours).unwrap_err();
        assert!(err.1.contains("never closes"));
    }

    #[test]
    fn an_acp_profile_has_its_command_args_and_env() {
        let text = "---\nname: claude\nkind: acp\ncommand: npx\nargs: [\"@zed-industries/claude-agent-acp\"]\nenv:\n  ANTHROPIC_BASE_URL: http://127.0.0.1:9\n---\n";
        let p = read_profile_text(text, Format::Ours).unwrap();
        let acp = p.acp.unwrap();
        assert_eq!(acp.command, "npx");
        assert_eq!(acp.args, ["@zed-industries/claude-agent-acp"]);
        assert_eq!(acp.env["ANTHROPIC_BASE_URL"], "http://127.0.0.1:9");
        let err = read_profile_text("---\nname: x\nkind: acp\n---\n", Format::Ours).unwrap_err();
        assert!(err.1.contains("needs a `command`"), "{err:?}");
        let err = read_profile_text("---\nname: x\nkind: mcp\n---\n", Format::Ours).unwrap_err();
        assert_eq!(err.0, 3);
        let plain = read_profile_text("---\nname: x\ncommand: ls\n---\n", Format::Ours).unwrap();
        assert!(plain.acp.is_none() && plain.notices[0].contains("only with kind: acp"));
    }

    fn read_profile_text(text: &str, format: Format) -> Result<Profile, (usize, String)> {
        let mut profile = Profile::named("", "test");
        read_markdown(text, format, &mut profile)?;
        Ok(profile)
    }
}
