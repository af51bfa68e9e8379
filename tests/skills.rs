//! Agent Skills and custom commands (issue #30) through the real run loop, on the scripted model server over real HTTP: the skill list in every request (and what it costs), the whole SKILL.md only once the model calls `skill`, a skill's script asking for approval as any command does, a profile that names its agents' skills, and `list_skills` / `expand_command` from the command table.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bumblehive::commands::dispatch;
use bumblehive::controller::Subscription;
use bumblehive::protocol::Event;
use bumblehive::service::{RuntimeService, ServiceOptions};
use serde_json::{Value, json};

use crate::mock_llm::{MockLlm, MockResponse, RecordedRequest, openai};
use crate::providers_openai::{TEST_KEY_ENV, set_test_key};

const WAIT: Duration = Duration::from_secs(30);

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A workspace with skills in each folder: ours, `.agents`, `.claude` (one broken, one
/// the same name as another, one with a script and `allowed-tools`), one in the person's
/// config folder, and a custom command.
fn skills_workspace(root: &Path) -> PathBuf {
    let repo = root.join("repo");
    let ws = repo.join("app");
    std::fs::create_dir_all(repo.join(".git")).unwrap();
    write(
        &ws.join(".bumblehive/skills/release-notes/SKILL.md"),
        "---\nname: release-notes\ndescription: Writes release notes from the git log\n---\nRELEASE-NOTES-BODY: group the commits by area.\n",
    );
    write(
        &ws.join(".agents/skills/greet/SKILL.md"),
        "---\nname: greet\ndescription: Greets the person with the project's script\nallowed-tools: Bash(sh:*) Read\n---\nGREET-BODY: run `sh scripts/hello.sh` from this skill's folder.\n",
    );
    write(
        &ws.join(".agents/skills/greet/scripts/hello.sh"),
        "echo hello-from-the-skill-script\n",
    );
    write(
        &ws.join(".agents/skills/greet/references/tone.md"),
        "Be warm.\n",
    );
    // The same name again, one folder up: shown once, this one as shadowed.
    write(
        &repo.join(".claude/skills/release-notes/SKILL.md"),
        "---\nname: release-notes\ndescription: An older copy\n---\nOLD-BODY\n",
    );
    write(
        &repo.join(".claude/skills/broken/SKILL.md"),
        "---\nname: broken\ndescription: [never closed\n---\n",
    );
    write(
        &root.join("skills/personal/SKILL.md"),
        "---\nname: personal\ndescription: The person's own skill\n---\nPERSONAL-BODY\n",
    );
    write(
        &ws.join(".bumblehive/commands/quick.md"),
        "---\ndescription: A quick look\nmodel: small-model\nallowed-tools: [read_file, grep]\n---\nLook at $ARGUMENTS quickly.\n",
    );
    write(
        &ws.join(".claude/commands/fix-issue.md"),
        "---\ndescription: Fix a GitHub issue\nargument-hint: NUMBER [PRIORITY]\nmodel: haiku\nallowed-tools: Read, Edit\n---\nFix issue #$1 with priority $2. All: $ARGUMENTS\n",
    );
    ws
}

type Script = Arc<dyn Fn(&RecordedRequest) -> MockResponse + Send + Sync>;

struct Fixture {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    mock: MockLlm,
    service: RuntimeService,
}

impl Fixture {
    async fn new(extra: Value, build: impl FnOnce(&Path) -> PathBuf, script: Script) -> Fixture {
        set_test_key();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let ws = build(&root);
        let mock = MockLlm::start().await;
        mock.respond_with(move |request| script(request));
        let mut config = json!({
            "provider": {"kind": "openai", "base_url": format!("{}/v1", mock.url()), "model": "m",
                         "api_key_env": TEST_KEY_ENV, "max_retries": 0, "context_window": 100000},
        });
        bumblehive::config::merge_patch(&mut config, &extra);
        // The config file's folder is the person's: its `skills/` is theirs.
        let config_path = root.join("config.json");
        std::fs::write(&config_path, config.to_string()).unwrap();
        let service = RuntimeService::new(ServiceOptions {
            data_dir: root.join("data"),
            config_path: Some(config_path),
            config: None,
            provider_factory: Arc::new(bumblehive::providers::provider_from_config),
            tools: None,
        })
        .unwrap();
        Fixture {
            _dir: dir,
            ws,
            mock,
            service,
        }
    }

    fn session(&self) -> (String, Subscription) {
        let info = self
            .service
            .create_session(self.ws.to_str().unwrap(), None)
            .unwrap();
        let controller = self.service.controller(&info.session_id).unwrap();
        let (events, _) = controller.subscribe();
        (info.session_id, events)
    }

    async fn command(&self, name: &str, args: Value) -> Value {
        dispatch(&self.service, name, args)
            .await
            .unwrap_or_else(|err| panic!("{name}: {err}"))
    }
}

async fn next_where(events: &mut Subscription, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    tokio::time::timeout(WAIT, async {
        loop {
            let event: Event = events.next_event().await.expect("event stream closed");
            let value = serde_json::to_value(&event).unwrap();
            if pred(&value) {
                return value;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

async fn result_of(events: &mut Subscription, session_id: &str) -> String {
    let result = next_where(events, "result", |v| {
        v["type"] == "result" && v["session_id"] == session_id
    })
    .await;
    result["content"].as_str().unwrap_or("").to_string()
}

fn last_message(request: &RecordedRequest) -> Value {
    request.body["messages"]
        .as_array()
        .and_then(|m| m.last().cloned())
        .unwrap_or(Value::Null)
}

fn skill_tool(request: &RecordedRequest) -> Option<Value> {
    request.body["tools"]
        .as_array()?
        .iter()
        .find(|t| t["function"]["name"] == "skill")
        .cloned()
}

fn call(id: &str, name: &str, args: Value) -> MockResponse {
    MockResponse::sse(openai::tool_answer(&[(id, name, args)], (1, 1)))
}

fn text(answer: &str) -> MockResponse {
    MockResponse::sse(openai::text_answer(&[answer], (1, 1)))
}

/// The model of the main test: on "greet" it loads the skill, then reads one of its
/// files, then runs its script; each tool result is answered by the next step.
fn greeting_model() -> Script {
    Arc::new(|request| {
        let last = last_message(request);
        let content = last["content"].as_str().unwrap_or("");
        if last["role"] == "user" {
            return call("load", "skill", json!({"name": "greet"}));
        }
        if content.contains("GREET-BODY") {
            return call(
                "ref",
                "skill",
                json!({"name": "greet", "file": "references/tone.md"}),
            );
        }
        if content.contains("Be warm.") {
            return call(
                "run",
                "run_command",
                json!({"command": "sh .agents/skills/greet/scripts/hello.sh"}),
            );
        }
        text(&format!("done: {content}"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skills_are_listed_in_the_request_loaded_on_use_and_their_script_asks_like_a_command() {
    // The person's policy asks before every command: the skill's allowed-tools (which
    // names Bash) must not change that. (The sandbox setting is process-wide, so the
    // per-service policy is what this test sets.)
    let fx = Fixture::new(
        json!({"tools": {"policy": {"run_command": "ask"}}}),
        skills_workspace,
        greeting_model(),
    )
    .await;
    let (id, mut events) = fx.session();
    fx.service
        .submit_message(&id, "please greet me".into(), None)
        .await
        .unwrap();
    let ask = next_where(&mut events, "approval_request", |v| {
        v["type"] == "approval_request"
    })
    .await;
    assert_eq!(ask["tool"], "run_command", "{ask}");
    assert_eq!(
        ask["arguments"]["command"],
        "sh .agents/skills/greet/scripts/hello.sh"
    );
    // The person is told how it runs, as for any command (in the sandbox, or why not).
    assert!(ask.to_string().contains("sandbox"), "{ask}");
    let requests = fx.mock.requests();
    // The first request lists every skill by name and description, and none of the bodies.
    let first = &requests[0];
    let tool = skill_tool(first).expect("the skill tool is offered");
    let description = tool["function"]["description"].as_str().unwrap();
    for listed in [
        "- release-notes: Writes release notes from the git log",
        "- greet: Greets the person with the project's script",
        "- personal: The person's own skill",
    ] {
        assert!(
            description.contains(listed),
            "{listed:?} not in {description}"
        );
    }
    assert!(!description.contains("An older copy"), "{description}");
    assert!(!description.contains("broken"), "{description}");
    let whole = first.body.to_string();
    for body in [
        "GREET-BODY",
        "RELEASE-NOTES-BODY",
        "PERSONAL-BODY",
        "OLD-BODY",
    ] {
        assert!(!whole.contains(body), "{body} was sent before it was used");
    }
    // The second request answers the skill call with the whole SKILL.md and its files.
    let loaded = last_message(&requests[1]);
    assert_eq!(loaded["role"], "tool");
    let loaded = loaded["content"].as_str().unwrap();
    assert!(loaded.contains("GREET-BODY"), "{loaded}");
    assert!(
        loaded.contains("Files: references/tone.md, scripts/hello.sh"),
        "{loaded}"
    );
    assert!(
        loaded.contains(
            "Tools it names (allowed-tools): run_command, read_file. Nothing is pre-approved"
        ),
        "{loaded}"
    );
    assert!(!loaded.contains("RELEASE-NOTES-BODY"));
    assert_eq!(
        last_message(&requests[2])["content"].as_str().unwrap(),
        "Be warm.\n"
    );
    fx.service
        .decide_approval(bumblehive::protocol::commands::DecideApproval {
            session_id: id.clone(),
            approval_id: ask["approval_id"].as_str().unwrap().into(),
            approved: true,
            remember: false,
            reason: None,
        })
        .unwrap();
    let answer = result_of(&mut events, &id).await;
    assert!(answer.contains("hello-from-the-skill-script"), "{answer}");

    // What the list costs each request: the skill tool's share of the request, in the
    // context meter's estimate (bytes / 4). Printed for BENCHMARKS.md.
    let spec = serde_json::to_string(&tool).unwrap();
    let tokens = spec.len().div_ceil(4);
    println!(
        "skills list: {} skills, skill tool {} bytes, ~{tokens} tokens per request",
        3,
        spec.len()
    );
    assert!(tokens < 400, "{tokens}");
    fx.service.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skills_list_skills_and_expand_command_from_the_command_table() {
    let fx = Fixture::new(json!({}), skills_workspace, Arc::new(|_| text("ok"))).await;
    let ws = fx.ws.display().to_string();
    let listed = fx.command("list_skills", json!({"workspace": ws})).await;
    let names: Vec<&str> = listed["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["release-notes", "greet", "personal"], "{listed}");
    let notes = &listed["skills"][0];
    assert_eq!(notes["scope"], "workspace");
    assert!(
        notes["source"]
            .as_str()
            .unwrap()
            .ends_with("app/.bumblehive/skills")
    );
    assert!(
        notes["shadowed"][0]
            .as_str()
            .unwrap()
            .ends_with("repo/.claude/skills/release-notes/SKILL.md"),
        "{notes}"
    );
    assert_eq!(listed["skills"][2]["scope"], "user");
    let notices = listed["notices"].to_string();
    assert!(notices.contains("broken/SKILL.md:3:"), "{notices}");
    let commands: Vec<&str> = listed["commands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    // Ours first, then Claude Code's, in the same folder.
    assert_eq!(commands, ["quick", "fix-issue"]);
    let command = &listed["commands"][1];
    assert_eq!(command["description"], "Fix a GitHub issue");
    assert_eq!(command["argument_hint"], "NUMBER [PRIORITY]");
    assert_eq!(command["allowed_tools"], json!(["read_file", "edit_file"]));

    let expanded = fx
        .command(
            "expand_command",
            json!({"workspace": ws, "text": "/fix-issue 123 high"}),
        )
        .await;
    assert_eq!(
        expanded["content"],
        "Fix issue #123 with priority high. All: 123 high"
    );
    assert_eq!(expanded["kind"], "command");
    // Claude Code's `haiku` means a Claude model; this server is an OpenAI-style one.
    assert_eq!(expanded["model"], Value::Null);
    let notices = expanded["notices"].to_string();
    assert!(
        notices.contains("the session's model is used"),
        "{expanded}"
    );
    // The narrower turn is said to the person, not silent.
    assert!(
        notices.contains("/fix-issue runs its turn with only these tools: read_file, edit_file"),
        "{expanded}"
    );
    let skill = fx
        .command(
            "expand_command",
            json!({"workspace": ws, "text": "/release-notes for 1.2"}),
        )
        .await;
    let content = skill["content"].as_str().unwrap();
    assert!(
        content.starts_with("for 1.2\n\n[The person invoked the skill"),
        "{content}"
    );
    assert!(content.contains("RELEASE-NOTES-BODY") && !content.contains("OLD-BODY"));
    let named = fx
        .command(
            "expand_command",
            json!({"workspace": ws, "text": "use $personal here"}),
        )
        .await;
    assert!(named["content"].as_str().unwrap().contains("PERSONAL-BODY"));
    let unknown = dispatch(
        &fx.service,
        "expand_command",
        json!({"workspace": ws, "text": "/nothing-here"}),
    )
    .await
    .unwrap_err();
    assert_eq!(unknown.code(), "not_found");
    fx.service.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skills_a_workspace_without_any_pays_nothing_and_a_profile_names_its_agents_skills() {
    // A workspace with one profile naming one skill; the model delegates to it.
    let build = |root: &Path| {
        let ws = skills_workspace(root);
        write(
            &ws.join(".bumblehive/agents/writer.md"),
            "---\nname: writer\ndescription: Writes\ntools: [read_file]\nskills: [release-notes]\n---\nWrite.\n",
        );
        ws
    };
    let script: Script = Arc::new(|request| {
        let first_user = request.body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_string();
        if first_user.contains("Task:") {
            return text("child done");
        }
        let last = last_message(request);
        let reported = last["content"]
            .as_str()
            .is_some_and(|c| c.starts_with("[Background"));
        if last["role"] == "user" && !reported {
            return call(
                "d1",
                "sub_agent",
                json!({"title": "notes", "task": "write notes", "agent": "writer"}),
            );
        }
        text("parent done")
    });
    let fx = Fixture::new(json!({}), build, script).await;
    let (id, mut events) = fx.session();
    fx.service
        .submit_message(&id, "delegate".into(), None)
        .await
        .unwrap();
    let _ = result_of(&mut events, &id).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let child = loop {
        let found = fx.mock.requests().into_iter().find(|r| {
            r.body["messages"].to_string().contains("write notes")
                && r.body["messages"][0]["content"]
                    .as_str()
                    .unwrap_or("")
                    .contains("You are a Bumblehive sub-agent")
        });
        if let Some(found) = found {
            break found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the child never asked"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let tool = skill_tool(&child).expect("the profile's agents get the skill tool");
    let description = tool["function"]["description"].as_str().unwrap();
    assert!(description.contains("- release-notes:"), "{description}");
    assert!(!description.contains("- greet:"), "{description}");
    fx.service.shutdown().await;

    // No skill anywhere: no tool, so the request carries nothing for skills.
    let plain = Fixture::new(
        json!({}),
        |root: &Path| {
            let ws = root.join("plain");
            std::fs::create_dir_all(&ws).unwrap();
            ws
        },
        Arc::new(|_| text("ok")),
    )
    .await;
    let (id, mut events) = plain.session();
    plain
        .service
        .submit_message(&id, "hi".into(), None)
        .await
        .unwrap();
    let _ = result_of(&mut events, &id).await;
    assert!(skill_tool(&plain.mock.requests()[0]).is_none());
    plain.service.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skills_a_commands_model_and_allowed_tools_hold_for_its_turn_only() {
    let fx = Fixture::new(json!({}), skills_workspace, Arc::new(|_| text("ok"))).await;
    let ws = fx.ws.display().to_string();
    let expanded = fx
        .command(
            "expand_command",
            json!({"workspace": ws, "text": "/quick src/main.rs"}),
        )
        .await;
    assert_eq!(expanded["content"], "Look at src/main.rs quickly.");
    assert_eq!(expanded["model"], "small-model");
    assert_eq!(expanded["allowed_tools"], json!(["read_file", "grep"]));
    // What the composer sends: the text, with the command's choices for this turn.
    let (id, mut events) = fx.session();
    let config = serde_json::from_value(json!({"runtime": {
        "model": expanded["model"], "tools": expanded["allowed_tools"],
    }}))
    .unwrap();
    fx.service
        .submit_message(
            &id,
            expanded["content"].as_str().unwrap().into(),
            Some(config),
        )
        .await
        .unwrap();
    let _ = result_of(&mut events, &id).await;
    fx.service
        .submit_message(&id, "and now as usual".into(), None)
        .await
        .unwrap();
    let _ = result_of(&mut events, &id).await;
    let requests = fx.mock.requests();
    let names = |r: &RecordedRequest| -> Vec<String> {
        r.body["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["function"]["name"].as_str().map(str::to_string))
            .collect()
    };
    assert_eq!(requests[0].body["model"], "small-model");
    assert_eq!(names(&requests[0]), ["read_file", "grep"]);
    assert_eq!(requests[1].body["model"], "m");
    let usual = names(&requests[1]);
    assert!(
        usual.contains(&"run_command".to_string()) && usual.contains(&"skill".to_string()),
        "{usual:?}"
    );
    fx.service.shutdown().await;
}
