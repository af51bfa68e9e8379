//! The path-escape corpus: hundreds of ways out of the workspace (`..` chains, absolute paths, symlinks out, loops, unicode lookalikes, NUL and control characters, JSON escapes, over-long names), generated here and run against every file tool; nothing outside may be read, listed, written or created without an approval.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bumblehive::approvals::{ApprovalBook, SessionGate};
use bumblehive::config::ToolPolicy;
use bumblehive::protocol::Event;
use bumblehive::tools::{Access, ApprovalAsk, ToolRegistry};
use serde_json::{Value, json};

use crate::support::WAIT;
use crate::tools::{RecordingGate, context};

/// What a case must do, known from how it was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Resolves inside the workspace: never treated as outside (it may still fail, e.g.
    /// a folder given to read_file).
    Inside,
    /// Resolves outside: never succeeds without the person's yes; only an outside
    /// approval (here always denied) or an error.
    Outside,
    /// Refused before anything is touched: an error and no approval asked.
    Invalid,
}

#[derive(Debug, Clone)]
struct Case {
    path: String,
    expect: Expect,
    /// The path is spliced raw into the arguments' JSON text (JSON escapes such as
    /// `\ud800` or `\u002e` reach the tool's argument parser as the model sent them).
    json_text: bool,
    /// Names a real system file: only used with tools that do not write.
    system: bool,
}

/// The fixture all cases are built against. Everything outside `ws` carries `token`, so
/// a leak of content (`secret`) or of a listing (`only_name`) is recognisable.
struct Corpus {
    _dir: tempfile::TempDir,
    /// The temp root: `ws/`, the outside folder and `wsevil/` live here.
    root: PathBuf,
    ws: PathBuf,
    out: String,
    token: String,
    secret: String,
    only_name: String,
    cases: Vec<Case>,
}

fn symlink(target: impl AsRef<Path>, link: impl AsRef<Path>) {
    std::os::unix::fs::symlink(target, link).unwrap();
}

impl Corpus {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let token = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        let out = format!("bh-out-{token}");
        let secret = format!("OUTSIDE-MARKER-{token}");
        let only_name = format!("zz-outside-only-{token}.txt");
        let ws = root.join("ws");
        let o = root.join(&out);
        for dir in [ws.join("sub/deeper"), o.join("nested"), root.join("wsevil")] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(ws.join("inside.txt"), "INSIDE-MARKER top\n").unwrap();
        std::fs::write(ws.join("sub/file.txt"), "INSIDE-MARKER sub\n").unwrap();
        std::fs::write(ws.join("sub/deeper/deep.txt"), "INSIDE-MARKER deep\n").unwrap();
        for file in [
            o.join("secret.txt"),
            o.join(&only_name),
            o.join("nested/n.txt"),
            root.join("wsevil/secret.txt"),
            root.join("secret.txt"),
        ] {
            std::fs::write(file, format!("{secret}\n")).unwrap();
        }
        // Ways out.
        symlink(format!("../{out}"), ws.join("link_out"));
        symlink(&o, ws.join("link_abs"));
        symlink("/", ws.join("link_root"));
        symlink("/tmp", ws.join("link_tmp"));
        symlink("..", ws.join("link_up"));
        symlink("../..", ws.join("sub/link_up2"));
        symlink("sub/link_up2", ws.join("link_via_sub"));
        symlink("chain2", ws.join("chain1"));
        symlink("chain3", ws.join("chain2"));
        symlink("link_out", ws.join("chain3"));
        symlink(format!("../../../{out}"), ws.join("sub/deeper/link_far"));
        symlink(format!("../{out}/secret.txt"), ws.join("file_link"));
        symlink(o.join("secret.txt"), ws.join("file_link_abs"));
        symlink(
            format!("../{out}/new-{token}-dangling.txt"),
            ws.join("dangling_out"),
        );
        symlink(
            o.join(format!("new-{token}-dangling-abs.txt")),
            ws.join("dangling_abs"),
        );
        symlink(format!("../{out}/new-{token}-dir"), ws.join("dangling_dir"));
        symlink("../wsevil", ws.join("link_evil"));
        // Loops.
        symlink("loop", ws.join("loop"));
        symlink("loopb", ws.join("loopa"));
        symlink("loopa", ws.join("loopb"));
        symlink("loopdeep/x", ws.join("loopdeep"));
        symlink(".", ws.join("selfdir"));
        // Links that stay inside (controls: they must keep working without approval).
        symlink("sub", ws.join("link_in"));
        symlink(&ws, ws.join("link_ws"));
        symlink("link_in", ws.join("link_in_chain"));
        symlink("inside.txt", ws.join("file_in"));
        symlink("new-inside.txt", ws.join("dangling_in"));
        symlink("../ws/sub", ws.join("link_out_and_back"));
        // A hard link: an outside file under an inside name (finding 7).
        std::fs::hard_link(o.join("secret.txt"), ws.join("hard.txt")).unwrap();
        let mut corpus = Corpus {
            _dir: dir,
            root,
            ws,
            out,
            token,
            secret,
            only_name,
            cases: Vec::new(),
        };
        corpus.generate();
        corpus
    }

    fn add(&mut self, path: impl Into<String>, expect: Expect) {
        self.cases.push(Case {
            path: path.into(),
            expect,
            json_text: false,
            system: false,
        });
    }

    fn generate(&mut self) {
        use Expect::*;
        let out = self.out.clone();
        let token = self.token.clone();
        let root = self.root.display().to_string();
        let ws = self.ws.display().to_string();
        let new = format!("new-{token}.txt");

        // 1. `..` chains after prefixes of known depth: k ≤ depth stays in, more leaves.
        let prefixes: Vec<(String, usize)> = vec![
            ("".into(), 0),
            ("./".into(), 0),
            ("sub/".into(), 1),
            ("sub/deeper/".into(), 2),
            ("sub/./deeper/".into(), 2),
            ("sub//deeper//".into(), 2),
            ("link_in/".into(), 1),
            ("newdir/".into(), 1),
            ("newdir/newer/".into(), 2),
            (format!("{ws}/"), 0),
            (format!("{ws}/sub/"), 1),
        ];
        let tails = [
            format!("{out}/secret.txt"),
            format!("{out}/{new}"),
            out.clone(),
            format!("{out}/nested/../secret.txt"),
        ];
        for (prefix, depth) in &prefixes {
            for k in 0..=depth + 3 {
                let dots = "../".repeat(k);
                if k <= *depth {
                    self.add(format!("{prefix}{dots}x-{token}.txt"), Inside);
                } else {
                    for tail in &tails {
                        self.add(format!("{prefix}{dots}{tail}"), Outside);
                    }
                }
            }
        }
        for mixed in [
            format!("sub/../sub/../../{out}/secret.txt"),
            format!("sub/deeper/../../../{out}/secret.txt"),
            format!("sub/../../ws/../{out}/secret.txt"),
            format!("./sub/.././../{out}/secret.txt"),
            format!("newdir/../../{out}/secret.txt"),
            format!("inside.txt/../../{out}/secret.txt"),
            "../wsevil/secret.txt".into(),
            "../ws-evil-but-missing/x".into(),
            "..".into(),
            "../".into(),
            "sub/../..".into(),
            "../secret.txt".into(),
        ] {
            self.add(mixed, Outside);
        }
        for inside in [
            "sub/../inside.txt",
            "sub/deeper/../../inside.txt",
            "../ws/inside.txt",
            "../ws/sub/../inside.txt",
            ".",
            "./",
            "sub/..",
            "inside.txt",
            "inside.txt/x",
        ] {
            self.add(inside, Inside);
        }

        // 2. Absolute paths.
        for outside in [
            format!("{root}/{out}/secret.txt"),
            format!("{root}//{out}//secret.txt"),
            format!("{root}/./{out}/./secret.txt"),
            format!("{root}/{out}/{new}"),
            format!("{root}/{out}"),
            format!("{root}/{out}/nested/n.txt"),
            format!("{ws}/../{out}/secret.txt"),
            format!("{ws}/sub/../../{out}/secret.txt"),
            format!("{ws}/../ws/../{out}/secret.txt"),
            format!("{ws}/.."),
            format!("{root}/wsevil/secret.txt"),
            format!("{root}/wsevil"),
            format!("{root}/secret.txt"),
            root.clone(),
            "/".into(),
            "//".into(),
            "/..".into(),
            "/tmp".into(),
            format!("/nonexistent-{token}/{new}"),
            format!("{ws}evil/secret.txt"),
        ] {
            self.add(outside, Outside);
        }
        for inside in [
            ws.clone(),
            format!("{ws}/"),
            format!("{ws}/inside.txt"),
            format!("{ws}/sub/../inside.txt"),
            format!("{ws}//sub///file.txt"),
            format!("{ws}/./sub/./file.txt"),
            format!(
                "{root}/../{}/ws/inside.txt",
                self.root.file_name().unwrap().to_str().unwrap()
            ),
        ] {
            self.add(inside, Inside);
        }
        for system in [
            "/etc/passwd",
            "/etc",
            "/proc/self/environ",
            "/etc/../etc/hostname",
        ] {
            self.cases.push(Case {
                path: system.into(),
                expect: Outside,
                json_text: false,
                system: true,
            });
        }

        // 3. Symlinks that leave, by every kind of target.
        let to_out = ["link_out", "link_abs", "chain1", "sub/deeper/link_far"];
        let to_out_tails = [
            "".to_string(),
            "/".into(),
            "/.".into(),
            "/secret.txt".into(),
            format!("/{new}"),
            "/nested/../secret.txt".into(),
            "/nested/n.txt".into(),
            format!("/../{out}/secret.txt"),
            format!("/../ws/../{out}/secret.txt"),
        ];
        for link in to_out {
            for tail in &to_out_tails {
                self.add(format!("{link}{tail}"), Outside);
            }
        }
        let to_root = ["link_up", "sub/link_up2", "link_via_sub"];
        let to_root_tails = [
            "".to_string(),
            "/".into(),
            format!("/{out}/secret.txt"),
            format!("/{out}"),
            format!("/{new}"),
            "/wsevil/secret.txt".into(),
        ];
        for link in to_root {
            for tail in &to_root_tails {
                self.add(format!("{link}{tail}"), Outside);
            }
        }
        for path in [
            "link_root".to_string(),
            format!("link_root/{new}"),
            format!("link_root/tmp/{new}"),
            "link_tmp".into(),
            format!("link_tmp/{new}"),
            "link_evil".into(),
            "link_evil/secret.txt".into(),
            format!("link_evil/{new}"),
            "file_link".into(),
            "file_link_abs".into(),
            "file_link/../secret.txt".into(),
            "file_link_abs/.".into(),
            "dangling_out".into(),
            "dangling_abs".into(),
            format!("dangling_dir/x-{token}.txt"),
            "dangling_dir".into(),
            "selfdir/link_out/secret.txt".into(),
            format!("link_in/link_up2/{out}/secret.txt"),
            format!("link_ws/../{out}/secret.txt"),
            format!("link_ws/link_out/{new}"),
        ] {
            self.add(path, Outside);
        }
        self.cases.push(Case {
            path: "link_root/etc/passwd".into(),
            expect: Outside,
            json_text: false,
            system: true,
        });
        for inside in [
            "link_in".to_string(),
            "link_in/file.txt".into(),
            "link_in/deeper/deep.txt".into(),
            format!("link_in/x-{token}.txt"),
            "link_in/../inside.txt".into(),
            "link_ws".into(),
            "link_ws/inside.txt".into(),
            "link_ws/sub/file.txt".into(),
            "selfdir".into(),
            "selfdir/inside.txt".into(),
            format!("{}inside.txt", "selfdir/".repeat(10)),
            "link_in_chain/file.txt".into(),
            "file_in".into(),
            "dangling_in".into(),
            "link_out_and_back".into(),
            "link_out_and_back/file.txt".into(),
            "link_out/../ws/inside.txt".into(),
            "link_up/ws/inside.txt".into(),
        ] {
            self.add(inside, Inside);
        }

        // 4. Loops and too many links: errors, no approval.
        for looping in [
            "loop".to_string(),
            format!("loop/x-{token}.txt"),
            "loopa".into(),
            "loopb/b/c".into(),
            "sub/../loopa/x".into(),
            "loopdeep".into(),
            "loopdeep/y".into(),
            format!("{ws}/loop"),
            format!("{}inside.txt", "selfdir/".repeat(45)),
            format!("link_in/../loop/{new}"),
        ] {
            self.add(looping, Invalid);
        }

        // 5. Lookalikes and encodings that are only names: they stay inside.
        for lookalike in [
            "\u{2025}",         // two dot leader
            "\u{FF0E}\u{FF0E}", // fullwidth full stops
            "\u{2024}\u{2024}", // one dot leaders
            "\u{FE52}\u{FE52}", // small full stops
            "..\u{0338}",       // combining long solidus overlay
            ".\u{200B}.",       // zero width space between the dots
            "\u{200B}..",       // zero width space before
            "..\u{200D}",       // zero width joiner after
            "%2e%2e",
            "%2E%2E",
            "..%2f..",
            "..%c0%af..",
            "..%255c..",
            ".. ",
            " ..",
            ". .",
            "...",
            "....",
            "~",
            "$HOME",
            "file:",
        ] {
            self.add(format!("{lookalike}/{out}/secret.txt"), Inside);
        }
        for joined in [
            format!("..\u{2215}{out}\u{2215}secret.txt"), // division slash
            format!("..\u{2044}{out}"),                   // fraction slash
            format!("\u{FF0E}\u{FF0E}\u{FF0F}{out}"),     // fullwidth solidus
            format!("..\\{out}\\secret.txt"),
            format!("..\\..\\{out}"),
            format!("C:\\{out}\\secret.txt"),
            format!("\\\\server\\{out}"),
            "file:///etc/passwd".into(),
            "inside.txt\u{FEFF}".into(),
        ] {
            self.add(joined, Inside);
        }

        // 6. NUL, control and text-direction characters: refused.
        for bad in [
            "a\0b".to_string(),
            "\0".into(),
            format!("../\0{out}"),
            "inside.txt\0.png".into(),
            format!("inside.txt\n../{out}/secret.txt"),
            "sub\r/file.txt".into(),
            "a\u{1b}[2Jb".into(),
            "\u{202E}txt.exe".into(),
            "inside\u{2066}.txt".into(),
            "tab\there".into(),
            "del\u{7f}".into(),
            "c1\u{85}".into(),
        ] {
            self.add(bad, Invalid);
        }

        // 7. JSON escapes as the model sends them: decoded before any decision.
        for (raw, expect) in [
            (r"\ud800".to_string(), Invalid),
            (r"\udfff/..".into(), Invalid),
            (format!(r"..\ud83d/{out}"), Invalid),
            (r"\u0000".into(), Invalid),
            (format!(r"\u002e\u002e/{out}/secret.txt"), Outside),
            (format!(r"\u002E\u002E\u002F{out}\u002Fsecret.txt"), Outside),
            (r"\u202e".into(), Invalid),
            (r"inside\u000a.txt".into(), Invalid),
            (format!(r"sub\/..\/..\/{out}\/secret.txt"), Outside),
            (r"\u0069nside.txt".into(), Inside),
        ] {
            self.cases.push(Case {
                path: raw,
                expect,
                json_text: true,
                system: false,
            });
        }

        // 8. Lengths: names over 255 bytes and paths over 4096 bytes are refused.
        self.add("a".repeat(256), Invalid);
        self.add("ä".repeat(128), Invalid);
        self.add(format!("sub/{}/x", "b".repeat(300)), Invalid);
        self.add("x/".repeat(2100), Invalid);
        self.add(format!("{}{out}", "../".repeat(1366)), Invalid);
        self.add(
            format!("{}../{out}/secret.txt", "sub/../".repeat(600)),
            Invalid,
        );
        self.add(
            format!("{}../{out}/secret.txt", "sub/../".repeat(500)),
            Outside,
        );
        self.add(format!("{}{out}/secret.txt", "../".repeat(1000)), Outside);
        self.add("a".repeat(255), Inside);
        self.add(format!("{}x", "a/".repeat(2000)), Inside);
        self.add("", Invalid);

        // 9. A missing name, `..`, then a symlink (finding 1: the link after `..` was
        // taken as a plain name), and a hard link to an outside file.
        for missing in ["nope/", "nope/newer/../", "sub/nope/../", "nope/../nope2/"] {
            for link in [
                "link_out".to_string(),
                "link_out/secret.txt".into(),
                format!("link_out/{new}"),
                "link_abs/nested".into(),
                "link_abs/nested/n.txt".into(),
                "chain1".into(),
                "link_up".into(),
                format!("link_root/tmp/{new}"),
                "file_link".into(),
                "dangling_out".into(),
                format!("dangling_dir/a/b/{new}"),
                "link_evil".into(),
            ] {
                self.add(format!("{missing}../{link}"), Outside);
            }
            self.add(format!("{missing}../link_in/file.txt"), Inside);
            self.add(format!("{missing}../inside.txt"), Inside);
        }
        self.add("hard.txt", Outside);
        self.add("nope/../hard.txt", Outside);
    }

    /// Everything outside the workspace under the temp root: path → what it is.
    fn outside_state(&self) -> BTreeMap<PathBuf, String> {
        fn walk(dir: &Path, skip: &Path, into: &mut BTreeMap<PathBuf, String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path == skip {
                    continue;
                }
                let meta = std::fs::symlink_metadata(&path).unwrap();
                let what = if meta.file_type().is_symlink() {
                    format!("link -> {}", std::fs::read_link(&path).unwrap().display())
                } else if meta.is_dir() {
                    walk(&path, skip, into);
                    "dir".into()
                } else {
                    format!("file {:?}", std::fs::read(&path).unwrap())
                };
                into.insert(path, what);
            }
        }
        let mut state = BTreeMap::new();
        walk(&self.root, &self.ws, &mut state);
        state
    }

    /// Places a deep escape would land in when a write went through.
    fn canaries(&self) -> Vec<PathBuf> {
        let new = format!("new-{}.txt", self.token);
        vec![
            PathBuf::from("/tmp").join(&self.out),
            PathBuf::from("/").join(&self.out),
            PathBuf::from("/tmp").join(&new),
            PathBuf::from("/").join(&new),
            PathBuf::from(format!("/nonexistent-{}", self.token)),
        ]
    }

    /// Builds a tool's arguments for a case.
    fn arguments(&self, case: &Case, args: &Value, field: &str) -> Value {
        if !case.json_text {
            let mut args = args.clone();
            args[field] = Value::String(case.path.clone());
            return args;
        }
        let mut args = args.clone();
        args[field] = Value::String("@@PATH@@".into());
        Value::String(
            args.to_string()
                .replace("\"@@PATH@@\"", &format!("\"{}\"", case.path)),
        )
    }
}

/// What each tool is asked to do with a case's path.
fn tool_arguments(tool: &str) -> (Value, &'static str) {
    match tool {
        "read_file" => (json!({}), "path"),
        "write_file" => (json!({"content": "PWNED"}), "path"),
        "edit_file" => (
            json!({"old_string": "MARKER", "new_string": "PWNED"}),
            "path",
        ),
        "list_dir" => (json!({"depth": 3, "include_ignored": true}), "path"),
        "glob" => (json!({"pattern": "**/*", "include_ignored": true}), "path"),
        "grep" => (json!({"pattern": "MARKER"}), "path"),
        "run_command" => (
            json!({"command": "cat secret.txt nested/n.txt 2>&1; ls -a"}),
            "cwd",
        ),
        other => panic!("no corpus arguments for {other}"),
    }
}

fn writes(tool: &str) -> bool {
    matches!(tool, "write_file" | "edit_file" | "run_command")
}

/// Runs the whole corpus against one tool with a person who approves only what is inside
/// the workspace. Returns how many cases were tried.
async fn run_corpus(tool: &str) -> usize {
    let corpus = Corpus::new();
    let before = corpus.outside_state();
    let gate = RecordingGate::inside_only();
    let ctx = context(&corpus.ws, gate.clone());
    let registry = ToolRegistry::standard();
    let (base, field) = tool_arguments(tool);
    let mut tried = 0;
    let mut denied = 0;
    let mut failures = Vec::new();
    for case in &corpus.cases {
        if case.system && writes(tool) {
            continue;
        }
        tried += 1;
        let arguments = corpus.arguments(case, &base, field);
        let asked_before = gate.asks().len();
        let result = tokio::time::timeout(WAIT, registry.call(&ctx, tool, arguments))
            .await
            .unwrap_or_else(|_| panic!("{tool} hung on {:?}", case.path));
        let asks: Vec<ApprovalAsk> = gate.asks()[asked_before..].to_vec();
        let outside_asks = asks.iter().filter(|a| a.access == Access::Outside).count();
        let text = match &result {
            Ok(text) => text.clone(),
            Err(err) => err.to_string(),
        };
        let leaked = text.contains(&corpus.secret) || text.contains(&corpus.only_name);
        let problem = match case.expect {
            _ if leaked => Some("outside content or names in the output"),
            Expect::Inside if outside_asks > 0 => Some("an inside path was treated as outside"),
            Expect::Outside if result.is_ok() => Some("succeeded outside the workspace"),
            Expect::Outside if asks.iter().any(|a| a.access != Access::Outside) => {
                Some("an outside path was treated as inside")
            }
            Expect::Invalid if result.is_ok() => Some("an invalid path was accepted"),
            Expect::Invalid if !asks.is_empty() => {
                Some("an invalid path reached the approval gate")
            }
            _ => None,
        };
        if outside_asks > 0 {
            denied += 1;
        }
        if let Some(problem) = problem {
            failures.push(format!(
                "{problem}: {:?} ({:?}) -> {text:?}",
                case.path, case.expect
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{tool}: {} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(
        corpus.outside_state(),
        before,
        "{tool} changed something outside the workspace"
    );
    for canary in corpus.canaries() {
        assert!(!canary.exists(), "{tool} created {}", canary.display());
    }
    assert!(tried >= 200, "{tool}: only {tried} cases");
    assert!(
        denied >= 40,
        "{tool}: only {denied} cases reached an outside approval"
    );
    eprintln!(
        "{tool}: {tried} escape cases tried, {denied} stopped at an outside approval, none reached outside"
    );
    tried
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_escape_corpus_read_file() {
    run_corpus("read_file").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_escape_corpus_write_file() {
    run_corpus("write_file").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_escape_corpus_edit_file() {
    run_corpus("edit_file").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_escape_corpus_list_dir() {
    run_corpus("list_dir").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_escape_corpus_glob() {
    run_corpus("glob").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_escape_corpus_grep() {
    run_corpus("grep").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_escape_corpus_run_command_cwd() {
    run_corpus("run_command").await;
}

#[test]
fn path_corpus_covers_every_category() {
    let corpus = Corpus::new();
    let count = |expect| corpus.cases.iter().filter(|c| c.expect == expect).count();
    let (inside, outside, invalid) = (
        count(Expect::Inside),
        count(Expect::Outside),
        count(Expect::Invalid),
    );
    eprintln!(
        "path corpus: {} cases ({inside} inside, {outside} outside, {invalid} invalid)",
        corpus.cases.len()
    );
    assert!(corpus.cases.len() >= 300);
    assert!(outside >= 200 && inside >= 50 && invalid >= 30);
    let has = |pred: &dyn Fn(&Case) -> bool| corpus.cases.iter().any(pred);
    assert!(has(&|c| c.path.contains('\0')));
    assert!(has(&|c| c.path.len() > 4096));
    assert!(has(&|c| c.path.contains('\u{FF0E}')));
    assert!(has(&|c| c.path.starts_with("loop")));
    assert!(has(&|c| c.path.starts_with("link_out")));
    assert!(has(&|c| c.json_text));
    assert!(has(&|c| c.path == "nope/../link_out"));
    assert!(has(&|c| c.path == "hard.txt"));
}

/// A glob pattern cannot climb out either: patterns are relative to the searched folder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_glob_and_grep_patterns_cannot_escape() {
    let corpus = Corpus::new();
    let gate = RecordingGate::inside_only();
    let ctx = context(&corpus.ws, gate.clone());
    let registry = ToolRegistry::standard();
    let out = &corpus.out;
    for pattern in [
        "../**".to_string(),
        "../*".into(),
        format!("../{out}/*"),
        "**/../../**".into(),
        "/**".into(),
        format!("{}/**", corpus.root.display()),
        "link_out/**".into(),
        "link_up/**".into(),
        "**/secret.txt".into(),
        "**/*".into(),
        "**".into(),
        "*/../../*".into(),
    ] {
        for tool in ["glob", "grep"] {
            let args = match tool {
                "glob" => json!({"pattern": pattern, "include_ignored": true}),
                _ => json!({"pattern": "MARKER", "glob": pattern}),
            };
            let text = match registry.call(&ctx, tool, args).await {
                Ok(text) | Err(bumblehive::tools::ToolError::Failed(text)) => text,
                Err(err) => err.to_string(),
            };
            assert!(
                !text.contains(&corpus.secret)
                    && !text.contains(&corpus.only_name)
                    && !text.contains("nested/n.txt"),
                "{tool} {pattern:?}: {text}"
            );
        }
    }
    assert!(gate.prompts().is_empty());
}

/// "Always allow" and an `allow` policy never cover an outside path: with write_file both
/// remembered and allowed for the session, every outside case of the corpus still shows
/// the person a request (not rememberable), and no inside case does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_always_allow_never_covers_outside() {
    let corpus = Corpus::new();
    let before = corpus.outside_state();
    let book = Arc::new(ApprovalBook::default());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
    let gate = Arc::new(SessionGate {
        book: book.clone(),
        session_id: "s".into(),
        parent_session_id: None,
        title: None,
        lineage: vec!["s".into()],
        worktree: None,
        runs_on: None,
        policy: Box::new(|tool| (tool == "edit_file").then_some(ToolPolicy::Allow)),
        emit: Arc::new(move |event| {
            let _ = tx.send(event);
        }),
    });
    // The person: approves inside asks with "remember", denies everything outside.
    let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
    let person = tokio::spawn({
        let book = book.clone();
        let requests = requests.clone();
        async move {
            while let Some(event) = rx.recv().await {
                if let Event::ApprovalRequest(info) = event {
                    requests.lock().unwrap().push(info.clone());
                    book.decide("s", &info.approval_id, info.rememberable, true, None);
                }
            }
        }
    });
    let ctx = context(&corpus.ws, gate);
    let registry = ToolRegistry::standard();
    // Remember write_file for this session with one inside write.
    registry
        .call(
            &ctx,
            "write_file",
            json!({"path": "first.txt", "content": "x"}),
        )
        .await
        .unwrap();
    assert_eq!(requests.lock().unwrap().len(), 1);
    let mut tried = 0;
    for tool in ["write_file", "edit_file"] {
        let (base, field) = tool_arguments(tool);
        for case in corpus.cases.iter().filter(|c| !c.system) {
            tried += 1;
            let asked = requests.lock().unwrap().len();
            let result = tokio::time::timeout(
                WAIT,
                registry.call(&ctx, tool, corpus.arguments(case, &base, field)),
            )
            .await
            .unwrap_or_else(|_| panic!("{tool} hung on {:?}", case.path));
            let new: Vec<_> = requests.lock().unwrap()[asked..].to_vec();
            match case.expect {
                Expect::Inside => assert!(new.is_empty(), "{tool} {:?} asked: {new:?}", case.path),
                Expect::Outside => {
                    assert!(result.is_err(), "{tool} {:?} succeeded outside", case.path);
                    assert!(
                        new.iter().all(|r| !r.rememberable),
                        "{tool} {:?}: {new:?}",
                        case.path
                    );
                }
                Expect::Invalid => {
                    assert!(result.is_err() && new.is_empty(), "{tool} {:?}", case.path)
                }
            }
        }
    }
    assert_eq!(corpus.outside_state(), before);
    for canary in corpus.canaries() {
        assert!(!canary.exists(), "created {}", canary.display());
    }
    let shown = requests.lock().unwrap().len();
    eprintln!(
        "always-allow corpus: {tried} cases, {} outside requests shown",
        shown - 1
    );
    assert!(shown > 200);
    person.abort();
}
