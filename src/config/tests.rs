//! Loading the trusted file from disk: missing, valid, broken, not a
//! regular file, too big, in the project; the environment's `bash`.

use super::*;
use std::os::unix::fs::symlink;

struct Dirs {
    _tmp: tempfile::TempDir,
    agent: PathBuf,
    project: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(tmp.path()).unwrap();
    let (agent, project) = (base.join("agent"), base.join("project"));
    std::fs::create_dir_all(agent.join("extensions/pi-python-sandbox")).unwrap();
    std::fs::create_dir_all(&project).unwrap();
    Dirs { _tmp: tmp, agent, project }
}

impl Dirs {
    fn file(&self) -> PathBuf {
        self.agent.join(CONFIG_REL)
    }
    fn write(&self, text: &str) {
        std::fs::write(self.file(), text).unwrap();
    }
    fn load(&self, bash_env: Option<&str>) -> Loaded {
        load(&self.agent, Some(&self.project), bash_env)
    }
}

fn shown(l: &Loaded) -> Vec<String> {
    l.errors.iter().map(|e| e.to_string()).collect()
}

#[test]
fn a_missing_file_is_the_defaults_with_no_error() {
    let d = dirs();
    let l = d.load(None);
    assert_eq!(l.config, TrustedConfig::DEFAULT);
    assert_eq!((l.found, l.bash_source, l.errors.len(), l.notices.len()), (false, Source::Default, 0, 0));
    assert_eq!(l.path, d.file());
    // No agent directory at all is the same.
    let l = load(Path::new("/nonexistent-agent-dir"), None, None);
    assert_eq!((l.config, l.errors), (TrustedConfig::DEFAULT, vec![]));
}

#[test]
fn a_valid_file_applies_and_says_where_bash_came_from() {
    let d = dirs();
    d.write(r#"{"bash": "host", "filesystem": {"additionalAllowRead": ["/opt/x/"]}}"#);
    let l = d.load(None);
    assert!(l.errors.is_empty(), "{:?}", l.errors);
    assert_eq!((l.config.bash, l.bash_source, l.found), (Bash::Host, Source::File, true));
    assert_eq!(l.config.additional_allow_read, [PathBuf::from("/opt/x")]);
    d.write(r#"{"userBash": "sandbox"}"#);
    let l = d.load(None);
    assert_eq!((l.config.bash, l.bash_source, l.config.user_bash), (Bash::Sandbox, Source::Default, UserBash::Sandbox));
}

#[test]
fn the_environment_wins_over_the_file_both_ways_and_a_bad_value_keeps_bash_sandboxed() {
    let d = dirs();
    d.write(r#"{"bash": "host"}"#);
    for (v, want) in [("0", Bash::Host), ("off", Bash::Host), ("1", Bash::Sandbox), (" YES ", Bash::Sandbox)] {
        let l = d.load(Some(v));
        assert_eq!((l.config.bash, l.bash_source), (want, Source::Environment), "{v}");
        assert!(l.errors.is_empty());
    }
    let l = d.load(Some(""));
    assert_eq!((l.config.bash, l.bash_source), (Bash::Host, Source::File), "empty is unset");
    let l = d.load(Some("maybe"));
    assert_eq!((l.config.bash, l.bash_source), (Bash::Sandbox, Source::Fallback));
    assert_eq!(
        shown(&l),
        ["PI_SANDBOX_BASH=\"maybe\" is not `0`, `false`, `off`, `no`, `1`, `true`, `on` or `yes`: bash stays sandboxed"]
    );
    // With no file, the environment alone turns the sandboxed bash off.
    let e = dirs();
    assert_eq!(e.load(Some("false")).config.bash, Bash::Host);
}

#[test]
fn a_broken_part_falls_back_and_its_source_says_so() {
    let d = dirs();
    d.write(r#"{"bash": 1, "env": {"passthrough": ["NPM_TOKEN"]}}"#);
    let l = d.load(None);
    assert_eq!((l.config.bash, l.bash_source), (Bash::Sandbox, Source::Fallback));
    assert_eq!(l.config.env_passthrough, ["NPM_TOKEN"]);
    assert_eq!(shown(&l), ["bash: expected a string, found a number"]);
}

#[test]
fn a_file_that_is_not_json_makes_everything_most_restrictive() {
    let d = dirs();
    d.write("{\"bash\": \"host\"");
    let l = d.load(None);
    assert_eq!(l.config, TrustedConfig::most_restrictive(Part::ALL));
    assert_eq!(l.bash_source, Source::Fallback);
    assert!(shown(&l)[0].starts_with("not valid JSON: EOF while parsing"), "{:?}", shown(&l));
    std::fs::write(d.file(), b"{\"bash\": \"h\xffst\"}").unwrap();
    assert_eq!(shown(&d.load(None)), ["the file is not UTF-8"]);
}

#[test]
fn a_file_too_big_or_not_regular_is_an_error_and_everything_most_restrictive() {
    let d = dirs();
    d.write(&format!("{{\"bash\": \"host\"}}{}", " ".repeat(MAX_FILE_BYTES as usize)));
    let l = d.load(None);
    assert_eq!(
        (l.config.clone(), shown(&l)),
        (TrustedConfig::most_restrictive(Part::ALL), vec![format!("the file is larger than {MAX_FILE_BYTES} bytes")])
    );
    std::fs::remove_file(d.file()).unwrap();
    std::fs::create_dir(d.file()).unwrap();
    assert_eq!(shown(&d.load(None)), ["the file is a directory, not a regular file"]);
    std::fs::remove_dir(d.file()).unwrap();
    nix::unistd::mkfifo(&d.file(), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    // A named pipe with no writer: opened without blocking, refused.
    let l = d.load(None);
    assert_eq!(shown(&l), ["the file is a named pipe, not a regular file"]);
    assert_eq!(l.config, TrustedConfig::most_restrictive(Part::ALL));
}

#[test]
fn a_link_is_followed_to_a_regular_file_and_a_dangling_one_is_an_error() {
    let d = dirs();
    let elsewhere = d.agent.join("dotfiles-config.json");
    std::fs::write(&elsewhere, r#"{"bash": "host"}"#).unwrap();
    symlink(&elsewhere, d.file()).unwrap();
    let l = d.load(None);
    assert_eq!((l.config.bash, l.errors.len()), (Bash::Host, 0));
    std::fs::remove_file(&elsewhere).unwrap();
    let l = d.load(None);
    assert_eq!(shown(&l), [format!("the file is a link to `{}`, which does not exist", elsewhere.display())]);
    assert_eq!(l.config, TrustedConfig::most_restrictive(Part::ALL));
}

#[test]
fn a_trusted_file_inside_the_project_outside_its_pi_dir_is_not_trusted() {
    let d = dirs();
    // Through a link into the project's tree, where the sandbox can write.
    let planted = d.project.join("cfg.json");
    std::fs::write(&planted, r#"{"bash": "host"}"#).unwrap();
    symlink(&planted, d.file()).unwrap();
    let l = d.load(None);
    assert_eq!(l.config, TrustedConfig::most_restrictive(Part::ALL));
    assert_eq!(
        shown(&l),
        [format!(
            "the file is `{}`, inside the project, where the sandbox can write: it is not trusted (move the agent directory out of the project)",
            planted.display()
        )]
    );
    // The agent directory in the project's `.pi` (pi run in the home
    // directory: `~/.pi/agent`): trusted, and not named as the project's.
    let agent = d.project.join(".pi/agent");
    std::fs::create_dir_all(agent.join("extensions/pi-python-sandbox")).unwrap();
    std::fs::write(agent.join(CONFIG_REL), r#"{"bash": "host"}"#).unwrap();
    let l = load(&agent, Some(&d.project), None);
    assert_eq!((l.config.bash, l.errors.len(), l.notices.len()), (Bash::Host, 0, 0), "{:?}", l);
    // pi started in `/home`: the agent directory is `<project>/u/.pi/agent`.
    let deeper = d.project.join("u/.pi/agent");
    std::fs::create_dir_all(deeper.join("extensions/pi-python-sandbox")).unwrap();
    std::fs::write(deeper.join(CONFIG_REL), r#"{"bash": "host"}"#).unwrap();
    let l = load(&deeper, Some(&d.project), None);
    assert_eq!((l.config.bash, l.errors.len()), (Bash::Host, 0), "{:?}", l.errors);
    // Anywhere else in the project: not trusted.
    let fake = d.project.join("x");
    std::fs::create_dir_all(fake.join("extensions/pi-python-sandbox")).unwrap();
    std::fs::write(fake.join(CONFIG_REL), r#"{"bash": "host"}"#).unwrap();
    assert_eq!(load(&fake, Some(&d.project), None).config.bash, Bash::Sandbox);
}

#[test]
fn a_relative_agent_dir_is_an_error() {
    let l = load(Path::new("rel/agent"), None, None);
    assert_eq!(l.config, TrustedConfig::most_restrictive(Part::ALL));
    assert_eq!(shown(&l), ["the agent directory `rel/agent` is not an absolute path (set PI_CODING_AGENT_DIR to one)"]);
}

#[test]
fn a_projects_file_is_ignored_with_a_notice() {
    let d = dirs();
    let own = d.project.join(PROJECT_FILE_REL);
    std::fs::create_dir_all(own.parent().unwrap()).unwrap();
    std::fs::write(&own, r#"{"bash": "host", "env": {"passthrough": ["AWS_SECRET_ACCESS_KEY"]}}"#).unwrap();
    let l = d.load(None);
    assert_eq!(l.config, TrustedConfig::DEFAULT);
    assert!(l.errors.is_empty());
    assert_eq!(l.notices.len(), 1);
    assert!(l.notices[0].contains(PROJECT_FILE_REL), "{:?}", l.notices);
}
