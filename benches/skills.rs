//! Skill discovery at a session start: 200 skills spread over the workspace's, the repository's and the person's folders, found and parsed as every turn does, and the tokens their list adds to each request. `cargo bench --bench skills` (add `-- --quick` for a tiny smoke run).
// A benchmark that cannot set itself up should stop loudly, like a test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use bumblehive::skills::{SkillTool, UserDirs, discover};
use bumblehive::tools::Tool;

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let count = 200;
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    let ws = repo.join("app");
    std::fs::create_dir_all(repo.join(".git")).unwrap();
    let home = dir.path().join("home");
    let config = dir.path().join("config");
    let folders = [
        ws.join(".bumblehive/skills"),
        ws.join(".agents/skills"),
        ws.join(".claude/skills"),
        repo.join(".claude/skills"),
        home.join(".agents/skills"),
        home.join(".claude/skills"),
        config.join("skills"),
    ];
    for i in 0..count {
        let name = format!("skill-{i:03}");
        // A realistic SKILL.md: frontmatter, then a few KiB of instructions that
        // discovery must not pay for.
        let body = "Step: do the thing carefully and check the result.\n".repeat(60);
        write(
            &folders[i % folders.len()].join(&name).join("SKILL.md"),
            &format!(
                "---\nname: {name}\ndescription: Handles task number {i} of the project: when to use it, what it needs, and what it produces.\nallowed-tools: Bash(git:*) Read\nmetadata:\n  author: bench\n---\n{body}"
            ),
        );
        write(
            &folders[i % folders.len()]
                .join(&name)
                .join("scripts/run.sh"),
            "echo run\n",
        );
    }
    let user = UserDirs {
        home: Some(home),
        config: Some(config),
    };
    let runs = if quick { 5 } else { 200 };
    // Once to warm the page cache, as a session start after the app has run.
    let catalog = discover(&ws, &user);
    assert_eq!(catalog.skills.len(), count, "{:?}", catalog.notices);
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            let catalog = discover(&ws, &user);
            let spent = start.elapsed();
            assert_eq!(catalog.skills.len(), count);
            spent
        })
        .collect();
    times.sort();
    let median = times[times.len() / 2];
    let p95 = times[times.len() * 95 / 100];
    let tool = SkillTool::new(catalog.skills.clone());
    let spec = serde_json::json!({
        "type": "function",
        "function": {"name": tool.name(), "description": tool.description(), "parameters": tool.parameters()},
    })
    .to_string();
    println!(
        "skills discovery: {count} skills in 7 folders, median {:.2} ms, p95 {:.2} ms ({runs} runs; target < 5 ms)",
        median.as_secs_f64() * 1000.0,
        p95.as_secs_f64() * 1000.0
    );
    println!(
        "skills list: skill tool {} bytes, ~{} tokens per request (bytes / 4, the context meter's estimate)",
        spec.len(),
        spec.len().div_ceil(4)
    );
    let three = SkillTool::new(catalog.skills[..3].to_vec());
    println!(
        "skills list with 3 skills: ~{} tokens per request",
        (three.description().len() + 300).div_ceil(4)
    );
}
