//! The read-grant conversation of one pi session with pi-tool-permissions.
//!
//! When code reads a path outside the mounts, the result is
//! `permission_needed`; the wrapper asks the user on pi's event bus and
//! hands the answer back here. This module keeps what outlives a sandbox
//! (the last mode event, the denied directories, the prompts that nobody
//! waits for any more) and decides what an answer does:
//!
//! - an `allow` that came with a mode event mounting the path: run the
//!   code again on the new sandbox;
//! - an `allow` without one ("Allow once", or a cancelled editor in the
//!   real client): mount exactly the path that was read, read-only, for
//!   the next sandbox only, and run the code again;
//! - anything else: remember the directory as denied, say why.
//!
//! The wrapper only carries events: it never decides. The loop that runs
//! a call, asks and runs it again is [`orchestrator`]; its target for a
//! session is [`target`].

pub mod orchestrator;
pub mod target;

use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::permissions::{self, Context, ModeEvent, OnceMount, Refusal};

/// How a prompt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Allow,
    Deny,
    /// No answer within the wait.
    Timeout,
    /// The call was aborted while it waited.
    Aborted,
    /// The pi session ended while it waited.
    Shutdown,
}

impl Answer {
    pub fn parse(s: &str) -> Option<Answer> {
        Some(match s {
            "allow" => Answer::Allow,
            "deny" => Answer::Deny,
            "timeout" => Answer::Timeout,
            "aborted" => Answer::Aborted,
            "shutdown" => Answer::Shutdown,
            _ => return None,
        })
    }

    fn why(self, wait_seconds: u64) -> String {
        match self {
            Answer::Allow => "allowed".into(),
            Answer::Deny => "denied by the user".into(),
            Answer::Timeout => format!("no answer within {wait_seconds} s"),
            Answer::Aborted => "the call was aborted".into(),
            Answer::Shutdown => "the session ended".into(),
        }
    }
}

/// What to do after an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// The mounts changed for the grant: run the code again.
    Replay,
    /// Mount this path for the next sandbox only, then run the code again.
    Once(OnceMount),
    /// Unmask this secret of the project (its host path) for the next
    /// sandbox only, then run the code again.
    Unmask(PathBuf),
    /// Do not run again; the diagnostic says why.
    Stop(String),
}

/// A prompt the call stopped waiting for (timeout or abort): the client
/// may still answer it, and a grant then restarts the sandbox for nobody.
#[derive(Debug, Clone)]
struct Abandoned {
    path: PathBuf,
    is_dir: bool,
}

#[derive(Debug, Default)]
struct State {
    mode: Option<ModeEvent>,
    denied: Vec<PathBuf>,
    abandoned: Vec<Abandoned>,
    /// Paths of abandoned prompts the user allowed after the wait: their
    /// next refused read is allowed without a dialog (taken once).
    late_allowed: Vec<PathBuf>,
}

/// What one pi session remembers across its sandboxes.
#[derive(Debug, Default)]
pub struct Grants {
    state: Mutex<State>,
}

/// At most this many abandoned prompts are remembered (oldest dropped).
const MAX_ABANDONED: usize = 16;

impl Grants {
    pub fn set_mode(&self, event: ModeEvent) {
        self.state.lock().mode = Some(event);
    }

    pub fn mode(&self) -> Option<ModeEvent> {
        self.state.lock().mode.clone()
    }

    pub fn denied(&self) -> Vec<PathBuf> {
        self.state.lock().denied.clone()
    }

    /// Remember that reads under `dir` were denied.
    pub fn deny(&self, dir: PathBuf) {
        let mut st = self.state.lock();
        if !st.denied.contains(&dir) {
            st.denied.push(dir);
        }
    }

    /// Forget the session's denials (the user cleared them); returns how
    /// many there were. Mode, grants and abandoned prompts stay.
    pub fn clear_denials(&self) -> usize {
        std::mem::take(&mut self.state.lock().denied).len()
    }

    /// Forget everything (the pi session ended).
    pub fn clear(&self) {
        *self.state.lock() = State::default();
    }

    /// The abandoned prompt whose path `roots` now cover, taken from the
    /// list: a late answer to it caused this mount change.
    pub fn take_late(&self, roots: &[PathBuf]) -> Option<PathBuf> {
        let mut st = self.state.lock();
        let i = st.abandoned.iter().position(|a| {
            let dir = permissions::covering_dir(&a.path, a.is_dir);
            roots.iter().any(|r| a.path.starts_with(r) || dir.starts_with(r))
        })?;
        Some(st.abandoned.remove(i).path)
    }

    /// An allow without a mode event ("Allow once") that came after the
    /// call stopped waiting for the prompt about `path`: the denial the
    /// timeout (or abort) made is lifted, and the next refused read of
    /// the path is allowed without asking. Returns the path when it was
    /// such a prompt (a late grant with a mode event took it already).
    pub fn allow_late(&self, path: &str) -> Option<PathBuf> {
        let normal = permissions::normalize(path)?;
        let mut st = self.state.lock();
        let i = st.abandoned.iter().position(|a| a.path == normal)?;
        let a = st.abandoned.remove(i);
        let dir = permissions::covering_dir(&a.path, a.is_dir);
        st.denied.retain(|d| *d != a.path && *d != dir);
        st.late_allowed.push(a.path.clone());
        let excess = st.late_allowed.len().saturating_sub(MAX_ABANDONED);
        st.late_allowed.drain(..excess);
        Some(a.path)
    }

    /// Whether a refused read of `path` was allowed late (see
    /// [`Grants::allow_late`]); taken once.
    pub fn take_late_allowed(&self, path: &str) -> bool {
        let Some(normal) = permissions::normalize(path) else { return false };
        let mut st = self.state.lock();
        let Some(i) = st.late_allowed.iter().position(|p| *p == normal) else { return false };
        st.late_allowed.remove(i);
        true
    }

    /// Decide what `answer` to `prompt` does. `remounted`: the mounts
    /// changed while the prompt was open (the client's mode event came
    /// first). `resolve` is realpath.
    pub fn answer(
        &self,
        prompt: Prompt<'_>,
        answer: Answer,
        remounted: bool,
        ctx: &Context,
        resolve: impl Fn(&Path) -> std::io::Result<PathBuf>,
    ) -> Next {
        let Prompt { path, is_dir, secret } = prompt;
        // Only what a prompt can have shown: the plain absolute path
        // `read_decision` asks about, never one a `..` or `.` turns into
        // another (`secrets/./README.md/..` is the directory `secrets`).
        if path.len() > permissions::MAX_PROMPT_PATH_BYTES || permissions::not_plain(path) {
            return Next::Stop(format!(
                "{} is not written as the plain absolute path it names; nothing was granted.",
                crate::display::display_line(path)
            ));
        }
        let Some(normal) = permissions::normalize(path) else {
            return Next::Stop(format!(
                "{} is not an absolute path; nothing was granted.",
                crate::display::display_line(path)
            ));
        };
        if answer != Answer::Allow {
            if matches!(answer, Answer::Timeout | Answer::Aborted) {
                let mut st = self.state.lock();
                st.abandoned.push(Abandoned { path: normal.clone(), is_dir });
                let excess = st.abandoned.len().saturating_sub(MAX_ABANDONED);
                st.abandoned.drain(..excess);
            }
            // A secret's denial is about it alone, not its directory.
            self.deny(if secret.is_some() { normal.clone() } else { permissions::covering_dir(&normal, is_dir) });
            return Next::Stop(permissions::denied_diagnostic(path, &answer.why(PROMPT_WAIT_SECONDS)));
        }
        if remounted {
            return Next::Replay;
        }
        if let Some(host) = secret {
            return Next::Unmask(host.to_path_buf());
        }
        match once_mount(&normal, is_dir, ctx, resolve) {
            Ok(m) => Next::Once(m),
            Err(why) => Next::Stop(format!(
                "Read access to {} was allowed once, but it cannot be mounted: {why}. The code was not run again.",
                crate::display::display_line(path)
            )),
        }
    }
}

/// The read prompt an answer is about: the path it showed (`is_dir`: the
/// code listed a directory) and `secret`, the host path when the path is a
/// masked secret of the project (a denial then covers just it, an allow
/// once unmasks just it).
#[derive(Debug, Clone, Copy)]
pub struct Prompt<'a> {
    pub path: &'a str,
    pub is_dir: bool,
    pub secret: Option<&'a Path>,
}

/// How long the wrapper waits for an answer (it says so in its progress).
pub const PROMPT_WAIT_SECONDS: u64 = 30;

/// Why an allowed-once path cannot be mounted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OnceError {
    #[error("{}: {reason}", crate::display::one_line(path))]
    Refused { path: PathBuf, reason: Refusal },
    #[error("{} is {} now", crate::display::one_line(path), if *dir { "a directory" } else { "not a directory" })]
    KindChanged { path: PathBuf, dir: bool },
    #[error("{} is not a regular file or a directory", crate::display::one_line(path))]
    NotFileOrDir { path: PathBuf },
}

/// The allow-once mount for a read of `path`: exactly it, where it
/// resolves, checked like a read root (no reserved mount, nothing inside
/// the project or the session's directories, no host secret) on both the
/// path and its target.
fn once_mount(
    path: &Path,
    is_dir: bool,
    ctx: &Context,
    resolve: impl Fn(&Path) -> std::io::Result<PathBuf>,
) -> Result<OnceMount, OnceError> {
    let check = |p: &Path| match ctx.refusal(p) {
        Some(reason) => Err(OnceError::Refused { path: p.to_path_buf(), reason }),
        None => Ok(()),
    };
    let unresolvable = |e: std::io::Error| OnceError::Refused {
        path: path.to_path_buf(),
        reason: Refusal::Unresolvable(e.to_string()),
    };
    check(path)?;
    let source = resolve(path).map_err(unresolvable)?;
    check(&source)?;
    let meta = std::fs::metadata(&source).map_err(unresolvable)?;
    if meta.is_dir() != is_dir {
        return Err(OnceError::KindChanged { path: path.to_path_buf(), dir: meta.is_dir() });
    }
    if !meta.is_dir() && !meta.is_file() {
        return Err(OnceError::NotFileOrDir { path: path.to_path_buf() });
    }
    Ok(OnceMount { path: path.to_path_buf(), source, is_dir })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostsecrets::HostSecrets;

    /// The prompt about `path`, no secret.
    fn prompt(path: &str, is_dir: bool) -> Prompt<'_> {
        Prompt { path, is_dir, secret: None }
    }

    static NONE: HostSecrets = HostSecrets { entries: Vec::new(), in_home: Vec::new() };

    fn ctx(project: &Path) -> Context<'_> {
        Context { project: Some(project), home: None, secrets: &NONE, writable: &[], project_secrets: Some(&[]) }
    }

    fn ident(p: &Path) -> std::io::Result<PathBuf> {
        std::fs::canonicalize(p)
    }

    #[test]
    fn a_denial_is_remembered_by_its_directory_and_says_why() {
        let g = Grants::default();
        let project = Path::new("/nonexistent-project");
        let next = g.answer(prompt("/srv/data/a.csv", false), Answer::Deny, false, &ctx(project), ident);
        assert!(matches!(&next, Next::Stop(d) if d.contains("denied by the user")), "{next:?}");
        let next = g.answer(prompt("/srv/list", true), Answer::Timeout, false, &ctx(project), ident);
        assert!(matches!(&next, Next::Stop(d) if d.contains("no answer within 30 s")), "{next:?}");
        assert_eq!(g.denied(), [PathBuf::from("/srv/data"), "/srv/list".into()]);
    }

    #[test]
    fn an_answer_for_a_path_no_prompt_could_show_grants_nothing() {
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let dir = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir(dir.join("secrets")).unwrap();
        std::fs::write(dir.join("secrets/README.md"), "x").unwrap();
        let g = Grants::default();
        let project = Path::new("/nonexistent-project");
        let plain = dir.join("secrets/README.md").display().to_string();
        // Baseline: the plain path is allowed once, exactly.
        assert!(matches!(g.answer(prompt(&plain, false), Answer::Allow, false, &ctx(project), ident), Next::Once(_)));
        for crooked in
            [format!("{plain}/.."), format!("{}/secrets/./README.md/..", dir.display()), format!("{plain}//")]
        {
            let next = g.answer(prompt(&crooked, true), Answer::Allow, false, &ctx(project), ident);
            assert!(matches!(&next, Next::Stop(d) if d.contains("nothing was granted")), "{crooked}: {next:?}");
        }
        assert!(g.denied().is_empty());
    }

    #[test]
    fn allow_after_a_mount_change_replays_and_allow_alone_is_once_for_exactly_the_path() {
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let dir = std::fs::canonicalize(t.path()).unwrap();
        std::fs::write(dir.join("f.txt"), "x").unwrap();
        std::os::unix::fs::symlink(dir.join("f.txt"), dir.join("link")).unwrap();
        let g = Grants::default();
        let project = Path::new("/nonexistent-project");
        let file = dir.join("f.txt").display().to_string();
        assert_eq!(g.answer(prompt(&file, false), Answer::Allow, true, &ctx(project), ident), Next::Replay);
        assert_eq!(
            g.answer(prompt(&file, false), Answer::Allow, false, &ctx(project), ident),
            Next::Once(OnceMount { path: dir.join("f.txt"), source: dir.join("f.txt"), is_dir: false })
        );
        // Through a link: mounted where the code read it, from where it points.
        let link = dir.join("link").display().to_string();
        assert_eq!(
            g.answer(prompt(&link, false), Answer::Allow, false, &ctx(project), ident),
            Next::Once(OnceMount { path: dir.join("link"), source: dir.join("f.txt"), is_dir: false })
        );
        // A listing is the directory itself, never its parent.
        assert_eq!(
            g.answer(prompt(&dir.display().to_string(), true), Answer::Allow, false, &ctx(project), ident),
            Next::Once(OnceMount { path: dir.clone(), source: dir.clone(), is_dir: true })
        );
        assert!(g.denied().is_empty());
    }

    #[test]
    fn allow_once_refuses_what_a_root_could_not_be() {
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let dir = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir(dir.join("proj")).unwrap();
        std::fs::write(dir.join("proj/x"), "x").unwrap();
        std::os::unix::fs::symlink(dir.join("proj/x"), dir.join("into-project")).unwrap();
        std::os::unix::fs::symlink("/usr/lib/os-release", dir.join("into-usr")).unwrap();
        let home = dir.join("home");
        std::fs::create_dir_all(home.join(".ssh")).unwrap();
        std::fs::write(home.join(".ssh/id_rsa"), "k").unwrap();
        let secrets = HostSecrets::new(None, Some(&home), &[]);
        let writable = [dir.join("session")];
        std::fs::create_dir(&writable[0]).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", writable[0].join("planted")).unwrap();
        let c = Context {
            project: Some(&dir.join("proj")),
            home: Some(&home),
            secrets: &secrets,
            writable: &writable,
            project_secrets: Some(&[]),
        };
        let g = Grants::default();
        let stop = |p: &Path, is_dir: bool| match g.answer(
            prompt(&p.display().to_string(), is_dir),
            Answer::Allow,
            false,
            &c,
            ident,
        ) {
            Next::Stop(d) => d,
            other => panic!("{other:?}"),
        };
        assert!(stop(&dir.join("into-project"), false).contains("inside the project"));
        assert!(stop(&dir.join("into-usr"), false).contains("reserved sandbox mount /usr"));
        // A link the sandbox planted in its own directories is never followed into a grant.
        assert!(stop(&writable[0].join("planted"), false).contains("the session's own directories"));
        assert!(stop(&home.join(".ssh/id_rsa"), false).contains("host secret"));
        assert!(stop(&home.join(".ssh"), true).contains("host secret"));
        assert!(stop(&dir.join("missing"), false).contains("cannot be resolved"));
        assert!(stop(&dir.join("proj"), false).contains("inside the project"));
        assert!(stop(&home, false).contains("is a directory now"));
    }

    #[test]
    fn a_secret_of_the_project_is_unmasked_once_and_denied_alone() {
        let g = Grants::default();
        let project = Path::new("/home/u/proj");
        let host = Path::new("/home/u/proj/sub/.env");
        let env = Prompt { secret: Some(host), ..prompt("/workspace/sub/.env", false) };
        let next = g.answer(env, Answer::Allow, false, &ctx(project), ident);
        assert_eq!(next, Next::Unmask(host.to_path_buf()));
        // A granted root that covers it came first: the mounts changed, so a replay.
        let next = g.answer(env, Answer::Allow, true, &ctx(project), ident);
        assert_eq!(next, Next::Replay);
        let _ = g.answer(env, Answer::Deny, false, &ctx(project), ident);
        assert_eq!(g.denied(), [PathBuf::from("/workspace/sub/.env")], "not all of /workspace/sub");
    }

    #[test]
    fn a_late_allow_once_lifts_the_denial_and_allows_the_next_read_once() {
        let g = Grants::default();
        assert_eq!(g.allow_late("/srv/data/a.csv"), None, "no prompt was abandoned");
        let project = Path::new("/nonexistent-project");
        let _ = g.answer(prompt("/srv/data/a.csv", false), Answer::Timeout, false, &ctx(project), ident);
        assert_eq!(g.denied(), [PathBuf::from("/srv/data")], "the timeout denied the directory");
        assert_eq!(g.allow_late("/srv/data/a.csv"), Some(PathBuf::from("/srv/data/a.csv")));
        assert!(g.denied().is_empty(), "the denial the timeout made is lifted");
        assert!(!g.take_late_allowed("/srv/data/b.csv"), "only that path");
        assert!(g.take_late_allowed("/srv/data/a.csv"));
        assert!(!g.take_late_allowed("/srv/data/a.csv"), "taken once");
        assert_eq!(g.allow_late("/srv/data/a.csv"), None, "answered once");
    }

    #[test]
    fn a_late_grant_is_matched_to_the_prompt_nobody_waited_for() {
        let g = Grants::default();
        let project = Path::new("/nonexistent-project");
        let _ = g.answer(prompt("/srv/data/a.csv", false), Answer::Aborted, false, &ctx(project), ident);
        let _ = g.answer(prompt("/srv/other/b.csv", false), Answer::Deny, false, &ctx(project), ident);
        assert_eq!(g.take_late(&["/srv/other".into()]), None, "a deny is an answer, not an abandoned prompt");
        assert_eq!(g.take_late(&["/srv".into()]), Some(PathBuf::from("/srv/data/a.csv")));
        assert_eq!(g.take_late(&["/srv".into()]), None, "taken once");
    }
}
