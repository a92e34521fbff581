//! The grant loop: run a call; when the sandbox refused a read, decide
//! whether to ask (an earlier denial, a host secret, no permission
//! extension or no UI refuse at once), ask the user through a callback,
//! apply the answer (a remount, a path allowed once, a secret unmasked
//! once), and run the call again, or not, as the runtime chooses.
//!
//! Nothing here knows how the user is asked (the wrapper carries pi's bus
//! messages behind the `ask` callback), what runs (the [`Target`]), or
//! which detector saw the denial: a [`Denial`] is a path, whether it was
//! a listing, and whether it was a masked secret.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{Answer, Grants, Next, Prompt};
use crate::display::display_line;
use crate::outcome::{Outcome, Status};
use crate::permissions::{self, Context, OnceMount, ReadDecision};

/// A read the sandbox refused, whichever detector saw it. `secret` is the
/// sandbox's word that it was a masked secret; decisions use the
/// session's own list of masks instead ([`Target::mask_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub path: String,
    pub is_directory: bool,
    pub secret: bool,
}

impl Denial {
    /// The denial a result reports, if it is one.
    pub fn of(o: &Outcome) -> Option<Denial> {
        if o.status != Status::PermissionNeeded {
            return None;
        }
        Some(Denial {
            path: o.permission_path.clone()?,
            is_directory: o.permission_is_dir,
            secret: o.permission_secret,
        })
    }
}

pub use crate::runtime::AfterGrant;

/// What the session hides at a sandbox path, by its own list of masks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mask {
    None,
    /// A host secret in the project (the mask's sandbox path): never granted.
    HostSecret(String),
    /// A secret of the project, at this host path.
    Secret(PathBuf),
    /// A secret of the project reached under another name than the
    /// project's mount point (a read root around the project shows it at
    /// its host path, masked): its sandbox path under the mount point.
    SecretElsewhere(String),
}

/// What the loop needs of a sandbox session.
pub trait Target {
    /// Run the call (again).
    fn run(&self) -> impl Future<Output = Outcome> + Send;
    /// The runtime's choice once a grant is in place.
    fn after_grant(&self) -> AfterGrant;
    /// What the session masks at `path`.
    fn mask_of(&self, path: &str) -> Mask;
    /// Whether the sandbox path `path` is the project's (under its mount
    /// point or one of its host names, links to it).
    fn in_project(&self, path: &str) -> bool;
    /// A permission-mode event has been applied to the session.
    fn permissions_seen(&self) -> bool;
    /// Counts effective changes of the mounts.
    fn mount_epoch(&self) -> u64;
    /// Call `f` with what deciding a grant needs (its `resolve` is realpath).
    fn with_context<R>(&self, f: impl FnOnce(&Context<'_>) -> R) -> R;
    /// Mount `once` in the next sandbox only, together with `kept` (the
    /// paths allowed once earlier in the same call, which a restart would
    /// otherwise drop); false when `once` already is.
    fn mount_once(&self, once: OnceMount, kept: &[OnceMount]) -> bool;
    /// Unmask the project's secret at `host` in the next sandbox only,
    /// with `kept` as for [`Target::mount_once`]; false when it already is.
    fn unmask_once(&self, host: PathBuf, kept: &[PathBuf]) -> bool;
    /// The next run is the call run again after a grant: it starts from
    /// the state before the call's first run where it can.
    fn rerun_after_grant(&self) {}
    /// How that run went: `Ok` with the interpreter's state kept (the
    /// grant reached the running sandbox), or why the sandbox restarted.
    fn take_rerun(&self) -> Option<Result<(), crate::live_grants::Restarted>> {
        None
    }
}

/// Whether to ask the user about a denial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Ask,
    /// Refused without asking; why.
    Refuse(String),
}

/// What an answer did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    Granted(Grant),
    /// Nothing to run again; why.
    Stop(String),
}

/// A grant in place for the next run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    /// The mode event that came with the answer mounts the path.
    Remounted,
    /// The path alone is mounted read-only for the next sandbox.
    Once { is_dir: bool },
    /// The project's secret alone is unmasked for the next sandbox.
    Unmasked,
}

const UNTIL_RESTART: &str = "until the sandbox restarts (a reset, a mode change, or a failure that is not rolled back)";

impl Grant {
    fn what(is_dir: bool) -> &'static str {
        if is_dir {
            "directory"
        } else {
            "file"
        }
    }

    /// What the result of the call run again tells.
    pub fn rerun_note(&self, path: &str) -> String {
        let shown = display_line(path);
        match self {
            Grant::Remounted => {
                format!("Read access to {shown} was granted, so the sandbox restarted with it and this call ran again.")
            }
            Grant::Once { is_dir } => {
                let what = Grant::what(*is_dir);
                format!(
                    "Read access to {shown} was allowed once: the sandbox restarted with just that {what} mounted \
                     read-only, and this call ran again. The {what} stays readable {UNTIL_RESTART} and is not mounted \
                     again after that."
                )
            }
            Grant::Unmasked => format!(
                "Read access to {shown}, which looks like a secret, was allowed once: the sandbox restarted with just \
                 that path unmasked, and this call ran again. It stays readable {UNTIL_RESTART} and is masked again \
                 after that."
            ),
        }
    }

    /// What the result of the call run again tells when the grant reached
    /// the running sandbox: its state was kept.
    pub fn live_note(&self, path: &str) -> String {
        let shown = display_line(path);
        let again = "this call ran again on the same interpreter, from its state before the call (variables kept; \
                     nothing of the first run remains)";
        match self {
            Grant::Remounted => {
                format!("Read access to {shown} was granted and mounted in the running sandbox; {again}.")
            }
            Grant::Once { is_dir } => {
                let what = Grant::what(*is_dir);
                format!(
                    "Read access to {shown} was allowed once: just that {what} was mounted read-only in the running \
                     sandbox, and {again}. The {what} stays readable {UNTIL_RESTART} and is not mounted again after \
                     that."
                )
            }
            Grant::Unmasked => format!(
                "Read access to {shown}, which looks like a secret, was allowed once: just that path was unmasked in \
                 the running sandbox, and {again}. It stays readable {UNTIL_RESTART} and is masked again after that."
            ),
        }
    }

    /// What the result tells when the runtime does not run the call again.
    pub fn not_rerun_text(&self, path: &str) -> String {
        let shown = display_line(path);
        let granted = match self {
            Grant::Remounted => "read access to it was granted".to_string(),
            Grant::Once { is_dir } => format!(
                "it was allowed once: the next sandbox has just that {} mounted read-only, {UNTIL_RESTART}",
                Grant::what(*is_dir)
            ),
            Grant::Unmasked => format!("it was allowed once: the next sandbox shows just that path, {UNTIL_RESTART}"),
        };
        let missing =
            if matches!(self, Grant::Unmasked) { "is hidden as a secret" } else { "was outside the sandbox mounts" };
        format!(
            "The command needed {shown}, which {missing}; {granted}. The command was not run again (its side effects \
             would repeat): run it again to use the grant."
        )
    }
}

/// How a call went through the loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The last run's result; after a prompt its `duration_ms` covers the
    /// runs and the wait, and `waited_ms` the wait.
    pub outcome: Outcome,
    /// Why the loop stopped at a denial (refused, denied, not granted, or
    /// granted and not run again), for the result.
    pub diagnostic: Option<String>,
}

/// One sandbox's grant loop over its pi session's [`Grants`].
#[derive(Debug, Default)]
pub struct GrantLoop {
    grants: Arc<Grants>,
    /// The mount epoch when the open prompt was opened: a mount change
    /// from then on answers it.
    prompt_epoch: Mutex<Option<u64>>,
    /// Told by the next result that ran: a grant made through
    /// [`GrantLoop::apply`] alone, outside [`GrantLoop::run`].
    pending_note: Mutex<Option<String>>,
    /// What was allowed once during the call [`GrantLoop::run`] runs: kept
    /// for its reruns (a call that reads two such files needs both).
    this_call: Mutex<CallGrants>,
}

/// The allow-once grants of one call.
#[derive(Debug, Default)]
struct CallGrants {
    once: Vec<OnceMount>,
    unmasked: Vec<PathBuf>,
}

impl GrantLoop {
    pub fn new(grants: Arc<Grants>) -> Self {
        GrantLoop { grants, ..GrantLoop::default() }
    }

    pub fn grants(&self) -> &Arc<Grants> {
        &self.grants
    }

    /// Whether to ask about `d`; an `Ask` opens the prompt.
    pub fn decide(&self, t: &impl Target, d: &Denial, has_ui: bool) -> Decision {
        let seen = self.grants.mode().is_some() || t.permissions_seen();
        let secret = match t.mask_of(&d.path) {
            Mask::HostSecret(mask) => return Decision::Refuse(host_secret_refusal(&d.path, &mask)),
            Mask::SecretElsewhere(at) => return Decision::Refuse(secret_elsewhere_refusal(&d.path, &at)),
            Mask::Secret(host) => Some(host),
            Mask::None if t.in_project(&d.path) => return Decision::Refuse(in_project_refusal(&d.path)),
            Mask::None => None,
        };
        if secret.is_none() {
            if let Some(why) = t.with_context(|ctx| never_granted(&d.path, ctx)) {
                return Decision::Refuse(why);
            }
        }
        match permissions::read_decision(&d.path, &self.grants.denied(), seen, has_ui, secret.as_deref()) {
            ReadDecision::Prompt => {
                *self.prompt_epoch.lock() = Some(t.mount_epoch());
                Decision::Ask
            }
            ReadDecision::Deny(why) => Decision::Refuse(why),
        }
    }

    /// Apply `answer` to the prompt about `d`, and close it.
    pub fn apply(&self, t: &impl Target, d: &Denial, answer: Answer) -> Applied {
        let remounted = self.prompt_epoch.lock().take().is_some_and(|e| e != t.mount_epoch());
        let shown = display_line(&d.path);
        let secret = match t.mask_of(&d.path) {
            Mask::HostSecret(mask) => return Applied::Stop(host_secret_refusal(&d.path, &mask)),
            Mask::SecretElsewhere(at) => return Applied::Stop(secret_elsewhere_refusal(&d.path, &at)),
            Mask::Secret(host) => Some(host),
            Mask::None if t.in_project(&d.path) => return Applied::Stop(in_project_refusal(&d.path)),
            Mask::None => None,
        };
        let next = t.with_context(|ctx| {
            let prompt = Prompt { path: &d.path, is_dir: d.is_directory, secret: secret.as_deref() };
            self.grants.answer(prompt, answer, remounted, ctx, |p| ctx.resolve(p))
        });
        match next {
            Next::Replay => Applied::Granted(Grant::Remounted),
            Next::Unmask(host) => {
                let kept = self.this_call.lock().unmasked.clone();
                if t.unmask_once(host.clone(), &kept) {
                    self.this_call.lock().unmasked.push(host);
                    Applied::Granted(Grant::Unmasked)
                } else {
                    Applied::Stop(format!(
                        "Read access to {shown} was allowed once, but it is already unmasked for this sandbox; the \
                         code was not run again."
                    ))
                }
            }
            Next::Once(m) => {
                let is_dir = m.is_dir;
                let kept = self.this_call.lock().once.clone();
                if t.mount_once(m.clone(), &kept) {
                    self.this_call.lock().once.push(m);
                    Applied::Granted(Grant::Once { is_dir })
                } else {
                    // Nothing changed: a rerun would meet the same sandbox.
                    Applied::Stop(format!(
                        "Read access to {shown} was allowed once, but that {} is already mounted for this sandbox; \
                         the code was not run again.",
                        Grant::what(is_dir)
                    ))
                }
            }
            Next::Stop(why) => Applied::Stop(why),
        }
    }

    /// The next run's result tells `note` (a grant applied outside the loop).
    pub fn note_for_next_run(&self, note: String) {
        *self.pending_note.lock() = Some(note);
    }

    /// Run once, telling the note a grant left for it.
    pub async fn run_once(&self, t: &impl Target) -> Outcome {
        let note = self.pending_note.lock().take();
        let mut o = t.run().await;
        if o.started {
            o.replay = note;
        }
        o
    }

    /// Run the call through the loop: each denial is decided, asked about
    /// with `ask` and applied; the runtime says whether the call runs again.
    pub async fn run<T, F, Fut>(&self, t: &T, has_ui: bool, mut ask: F) -> Finished
    where
        T: Target,
        F: FnMut(&Denial) -> Fut,
        Fut: Future<Output = Answer>,
    {
        let started = Instant::now();
        let mut waited = Duration::ZERO;
        *self.this_call.lock() = CallGrants::default();
        let mut outcome = self.run_once(t).await;
        let mut diagnostic = None;
        let mut granted: Option<String> = None;
        while let Some(d) = Denial::of(&outcome) {
            if granted.as_deref() == Some(d.path.as_str()) {
                // The grant changed nothing for this read: asking again
                // would loop.
                diagnostic = Some(granted_in_vain(&d.path));
                break;
            }
            if let Decision::Refuse(why) = self.decide(t, &d, has_ui) {
                diagnostic = Some(why);
                break;
            }
            // An allow that came after an earlier call stopped waiting.
            let answer = if self.grants.take_late_allowed(&d.path) {
                Answer::Allow
            } else {
                let since = Instant::now();
                let answer = ask(&d).await;
                waited += since.elapsed();
                answer
            };
            let grant = match self.apply(t, &d, answer) {
                Applied::Granted(g) => g,
                Applied::Stop(why) => {
                    diagnostic = Some(why);
                    break;
                }
            };
            if t.after_grant() == AfterGrant::NameWhatWasMissing {
                diagnostic = Some(grant.not_rerun_text(&d.path));
                break;
            }
            granted = Some(d.path.clone());
            t.rerun_after_grant();
            outcome = t.run().await;
            let way = t.take_rerun();
            if outcome.started {
                outcome.replay = Some(match way {
                    Some(Ok(())) => grant.live_note(&d.path),
                    Some(Err(why)) => format!("{} Interpreter state was lost: {why}.", grant.rerun_note(&d.path)),
                    None => grant.rerun_note(&d.path),
                });
            }
        }
        *self.this_call.lock() = CallGrants::default();
        let waited_ms = waited.as_millis() as u64;
        if waited_ms > 0 {
            outcome.duration_ms = started.elapsed().as_millis() as u64;
            outcome.waited_ms = waited_ms;
        }
        Finished { outcome, diagnostic }
    }
}

/// Why a read of a path in the project that the sandbox refused (it
/// leads out of the mounts through a link there) is refused without
/// asking: the project is mounted whole, under each of its names, and no
/// grant mounts a path inside it.
fn in_project_refusal(path: &str) -> String {
    format!(
        "{} is in the project, but it leads outside the sandbox mounts through a link; it was refused without \
         asking, as no grant mounts a path inside the project. Grant read access to the link's target directory \
         (pi-tool-permissions' readAllowPaths, or a read root), or copy the data into the project or /scratch.",
        display_line(path)
    )
}

/// Why no answer could ever make `path` readable, worded for the result:
/// it is (or resolves to) a host secret, a reserved sandbox mount or the
/// whole filesystem. A grant of a directory around a host secret masks
/// it, and an allow once refuses it, so the user is not asked.
fn never_granted(path: &str, ctx: &Context<'_>) -> Option<String> {
    if permissions::not_plain(path) || path.len() > permissions::MAX_PROMPT_PATH_BYTES {
        return None; // refused by `read_decision`, with its own words
    }
    let p = permissions::normalize(path)?;
    let never = |r: &permissions::Refusal| {
        matches!(
            r,
            permissions::Refusal::Reserved(_)
                | permissions::Refusal::WholeFilesystem
                | permissions::Refusal::HostSecret(_)
        )
    };
    let reason =
        ctx.refusal(&p).filter(never).or_else(|| ctx.resolve(&p).ok().and_then(|r| ctx.refusal(&r)).filter(never))?;
    Some(format!(
        "{} can never be made readable: {reason}. It was refused without asking: no grant mounts it (a grant of a \
         directory around it masks it). Copy what the code needs into the project or /scratch.",
        display_line(path)
    ))
}

/// Why a read of a host secret in the project is refused without asking.
/// Why a read granted and refused again is not asked about again.
fn granted_in_vain(path: &str) -> String {
    format!(
        "Read access to {} was granted, but the code's read of it was refused again in the new sandbox; it was \
         not asked about again. The path may be masked or reserved under the name the code used.",
        display_line(path)
    )
}

/// Why a project secret read under another name than the project's mount
/// point is refused without asking: masked there as under the mount point,
/// where a grant can unmask it.
fn secret_elsewhere_refusal(path: &str, at: &str) -> String {
    format!(
        "{} is the project's secret {} (masked by {}), here under a read root around the project, where it is \
         masked too; no grant of that root unmasks it. Read it as {} to be asked about it.",
        display_line(path),
        display_line(at),
        crate::secrets::SECRETS_ENV,
        display_line(at)
    )
}

fn host_secret_refusal(path: &str, mask: &str) -> String {
    format!(
        "{} is a host secret (under {}: a credential store or history that the host-secret list names), so the \
         sandbox hides it in every mode and no grant unmasks it; copy what the code needs into the project or \
         /scratch, or see {}.",
        display_line(path),
        display_line(mask),
        crate::hostsecrets::HOST_SECRETS_ENV
    )
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    use super::*;
    use crate::hostsecrets::HostSecrets;
    use crate::outcome::{render, StateFate};
    use crate::permissions::ModeEvent;

    static NONE: HostSecrets = HostSecrets { entries: Vec::new(), in_home: Vec::new() };

    /// A session that answers with scripted results and records grants.
    struct Fake {
        runs: Mutex<VecDeque<Outcome>>,
        ran: AtomicUsize,
        after: AfterGrant,
        masks: Vec<(String, Mask)>,
        epoch: Arc<AtomicU64>,
        once: Mutex<Vec<OnceMount>>,
        unmasked: Mutex<Vec<PathBuf>>,
        /// Each grant restarts: the allow-once paths are only what it names.
        forgets: bool,
        /// The host secrets are those of this home directory.
        home: Option<PathBuf>,
    }

    impl Fake {
        fn new(runs: Vec<Outcome>) -> Fake {
            Fake {
                runs: Mutex::new(runs.into()),
                ran: AtomicUsize::new(0),
                after: AfterGrant::RunAgain,
                masks: Vec::new(),
                epoch: Arc::default(),
                once: Mutex::default(),
                unmasked: Mutex::default(),
                forgets: false,
                home: None,
            }
        }
    }

    impl Target for Fake {
        fn run(&self) -> impl Future<Output = Outcome> + Send {
            self.ran.fetch_add(1, Ordering::SeqCst);
            std::future::ready(self.runs.lock().pop_front().expect("a scripted result for every run"))
        }
        fn after_grant(&self) -> AfterGrant {
            self.after
        }
        fn mask_of(&self, path: &str) -> Mask {
            self.masks.iter().find(|(p, _)| p == path).map_or(Mask::None, |(_, m)| m.clone())
        }
        fn in_project(&self, path: &str) -> bool {
            ["/workspace", "/nonexistent-project"].iter().any(|p| Path::new(path).starts_with(p))
        }
        fn permissions_seen(&self) -> bool {
            false // the pi session's mode event says so (see `looped`)
        }
        fn mount_epoch(&self) -> u64 {
            self.epoch.load(Ordering::SeqCst)
        }
        fn with_context<R>(&self, f: impl FnOnce(&Context<'_>) -> R) -> R {
            let project = Path::new("/nonexistent-project");
            let secrets = self.home.as_deref().map(|h| HostSecrets::new(None, Some(h), &[]));
            f(&Context {
                project: Some(project),
                home: self.home.as_deref(),
                secrets: secrets.as_ref().unwrap_or(&NONE),
                writable: &[],
                project_secrets: Some(&[]),
            })
        }
        fn mount_once(&self, once: OnceMount, kept: &[OnceMount]) -> bool {
            let mut all = self.once.lock();
            if all.contains(&once) {
                return false;
            }
            // A restart forgets what the last sandbox had allowed once.
            if self.forgets {
                all.clear();
                all.extend(kept.iter().cloned());
            }
            all.push(once);
            self.epoch.fetch_add(1, Ordering::SeqCst);
            true
        }
        fn unmask_once(&self, host: PathBuf, _kept: &[PathBuf]) -> bool {
            let mut all = self.unmasked.lock();
            if all.contains(&host) {
                return false;
            }
            all.push(host);
            self.epoch.fetch_add(1, Ordering::SeqCst);
            true
        }
    }

    use std::path::Path;

    fn ran(status: Status) -> Outcome {
        Outcome {
            state: StateFate::Kept,
            started: true,
            duration_ms: 5,
            diagnostic: None,
            ..Outcome::static_result(status, 1, String::new())
        }
    }

    fn denied(path: &Path, is_dir: bool) -> Outcome {
        Outcome {
            permission_path: Some(path.display().to_string()),
            permission_is_dir: is_dir,
            ..ran(Status::PermissionNeeded)
        }
    }

    /// A loop whose pi session has a permission extension (a mode event).
    fn looped() -> GrantLoop {
        let grants = Arc::new(Grants::default());
        grants.set_mode(ModeEvent { mode: Some("manual".into()), writable: false, read_roots: Vec::new() });
        GrantLoop::new(grants)
    }

    fn block<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
    }

    /// Runs `l` on `t`, answering every prompt with `answers` in turn; returns the
    /// result and the denials asked about.
    fn drive(l: &GrantLoop, t: &Fake, has_ui: bool, answers: &[Answer]) -> (Finished, Vec<Denial>) {
        let asked = Mutex::new(Vec::new());
        let finished = block(l.run(t, has_ui, |d| {
            let mut a = asked.lock();
            a.push(d.clone());
            std::future::ready(*answers.get(a.len() - 1).expect("no more prompts than answers"))
        }));
        (finished, asked.into_inner())
    }

    fn data_file() -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let file = std::fs::canonicalize(t.path()).unwrap().join("data.csv");
        std::fs::write(&file, "1,2\n").unwrap();
        (t, file)
    }

    #[test]
    fn allow_once_mounts_exactly_the_path_and_runs_again_saying_so() {
        let (_t, file) = data_file();
        let fake = Fake::new(vec![denied(&file, false), ran(Status::Ok)]);
        let l = looped();
        let (f, asked) = drive(&l, &fake, true, &[Answer::Allow]);
        assert_eq!(asked, [Denial { path: file.display().to_string(), is_directory: false, secret: false }]);
        assert_eq!(fake.ran.load(Ordering::SeqCst), 2);
        assert_eq!(f.outcome.status, Status::Ok);
        assert_eq!(f.diagnostic, None);
        assert_eq!(*fake.once.lock(), [OnceMount { path: file.clone(), source: file.clone(), is_dir: false }]);
        let note = f.outcome.replay.as_deref().unwrap();
        assert!(note.starts_with(&format!("Read access to {} was allowed once", file.display())), "{note}");
        assert!(note.contains("just that file mounted read-only, and this call ran again"), "{note}");
        assert!(l.grants().denied().is_empty());
    }

    #[test]
    fn allow_with_the_clients_mode_event_is_a_grant_for_the_session_and_runs_again() {
        let (_t, file) = data_file();
        let fake = Fake::new(vec![denied(&file, false), ran(Status::Ok)]);
        let l = looped();
        // The client's mode event mounts the path before its answer arrives.
        let epoch = fake.epoch.clone();
        let f = block(l.run(&fake, true, |_| {
            epoch.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Answer::Allow)
        }));
        assert_eq!(fake.ran.load(Ordering::SeqCst), 2);
        assert!(fake.once.lock().is_empty(), "nothing allowed once: the mode event mounted it");
        assert_eq!(
            f.outcome.replay.as_deref(),
            Some(
                format!(
                    "Read access to {} was granted, so the sandbox restarted with it and this call ran again.",
                    file.display()
                )
                .as_str()
            )
        );
    }

    #[test]
    fn a_denial_is_not_run_again_and_the_next_read_there_is_refused_without_asking() {
        let (_t, file) = data_file();
        let fake = Fake::new(vec![denied(&file, false), denied(&file, false)]);
        let l = looped();
        let (f, asked) = drive(&l, &fake, true, &[Answer::Deny]);
        assert_eq!((asked.len(), fake.ran.load(Ordering::SeqCst)), (1, 1));
        assert_eq!(f.outcome.status, Status::PermissionNeeded);
        assert!(f.diagnostic.as_deref().unwrap().contains("was denied (denied by the user)"), "{f:?}");
        assert_eq!(l.grants().denied(), [file.parent().unwrap().to_path_buf()]);
        let (again, asked) = drive(&l, &fake, true, &[]);
        assert!(asked.is_empty());
        assert!(again.diagnostic.unwrap().contains("were denied earlier in this session"));
        // Cleared by the user (/sandbox clear-denials): the next read asks again.
        assert_eq!(l.grants().clear_denials(), 1);
        assert!(l.grants().denied().is_empty());
        assert_eq!(l.grants().clear_denials(), 0);
        let fresh = Fake::new(vec![denied(&file, false)]);
        let (_, asked) = drive(&l, &fresh, true, &[Answer::Deny]);
        assert_eq!(asked.len(), 1, "asked again after the clear");
    }

    #[test]
    fn no_answer_or_an_abort_counts_as_no_and_is_remembered_as_abandoned() {
        let (_t, file) = data_file();
        for (answer, why) in [(Answer::Timeout, "no answer within 30 s"), (Answer::Aborted, "the call was aborted")] {
            let fake = Fake::new(vec![denied(&file, false)]);
            let l = looped();
            let (f, _) = drive(&l, &fake, true, &[answer]);
            assert_eq!(fake.ran.load(Ordering::SeqCst), 1);
            assert!(f.diagnostic.as_deref().unwrap().contains(why), "{f:?}");
            // A late grant that covers it is matched to the prompt nobody waited for.
            assert_eq!(l.grants().take_late(&[file.parent().unwrap().to_path_buf()]), Some(file.clone()));
        }
    }

    #[test]
    fn a_grant_that_changes_nothing_for_the_read_is_not_asked_about_again() {
        // Allowed, and the new sandbox refuses the same read: without the
        // stop, the loop would ask and run again for ever.
        let (_t, file) = data_file();
        let fake = Fake::new(vec![denied(&file, false), denied(&file, false), denied(&file, false)]);
        let l = looped();
        let (f, asked) = drive(&l, &fake, true, &[Answer::Allow, Answer::Allow]);
        assert_eq!((asked.len(), fake.ran.load(Ordering::SeqCst)), (1, 2));
        assert!(f.diagnostic.as_deref().unwrap().contains("was refused again in the new sandbox"), "{f:?}");
    }

    #[test]
    fn a_project_secret_under_another_name_is_refused_without_asking() {
        let mut fake = Fake::new(vec![denied(Path::new("/srv/p/.env"), false)]);
        fake.masks.push(("/srv/p/.env".into(), Mask::SecretElsewhere("/workspace/.env".into())));
        let l = looped();
        let (f, asked) = drive(&l, &fake, true, &[]);
        assert!(asked.is_empty());
        assert!(f.diagnostic.as_deref().unwrap().starts_with("/srv/p/.env is the project's secret /workspace/.env"));
    }

    #[test]
    fn a_host_secret_is_never_asked_about_nor_granted() {
        let mut fake = Fake::new(vec![denied(Path::new("/workspace/.aws/credentials"), false)]);
        fake.masks.push(("/workspace/.aws/credentials".into(), Mask::HostSecret("/workspace/.aws".into())));
        let l = looped();
        let (f, asked) = drive(&l, &fake, true, &[]);
        assert!(asked.is_empty());
        assert!(f
            .diagnostic
            .as_deref()
            .unwrap()
            .starts_with("/workspace/.aws/credentials is a host secret (under /workspace/.aws"));
        // Nor through an answer handed over directly.
        let d = Denial { path: "/workspace/.aws/credentials".into(), is_directory: false, secret: true };
        assert!(matches!(l.apply(&fake, &d, Answer::Allow), Applied::Stop(why) if why.contains("is a host secret")));
        assert!(fake.unmasked.lock().is_empty() && fake.once.lock().is_empty());
    }

    #[test]
    fn a_path_no_grant_can_mount_is_refused_at_once_with_the_reason() {
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let home = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir(home.join(".ssh")).unwrap();
        std::fs::write(home.join(".ssh/id_ed25519"), "k").unwrap();
        std::os::unix::fs::symlink(home.join(".ssh/id_ed25519"), home.join("innocent")).unwrap();
        std::fs::write(home.join("plain.txt"), "p").unwrap();
        let cases = [
            (home.join(".ssh/id_ed25519"), false, "a host secret"),
            (home.join("innocent"), false, "a host secret"),
            (PathBuf::from("/lib64/nothing-here"), false, "reserved sandbox mount /lib64"),
            (PathBuf::from("/"), true, "the whole filesystem"),
        ];
        for (path, is_dir, why) in cases {
            let mut fake = Fake::new(vec![denied(&path, is_dir)]);
            fake.home = Some(home.clone());
            let (f, asked) = drive(&looped(), &fake, true, &[]);
            assert!(asked.is_empty(), "{}: asked", path.display());
            let d = f.diagnostic.unwrap();
            assert!(d.contains("can never be made readable") && d.contains(why), "{}: {d}", path.display());
        }
        // Baseline: a plain file next to them is asked about.
        let mut fake = Fake::new(vec![denied(&home.join("plain.txt"), false)]);
        fake.home = Some(home.clone());
        let (_, asked) = drive(&looped(), &fake, true, &[Answer::Deny]);
        assert_eq!(asked.len(), 1);
    }

    #[test]
    fn a_project_secret_allowed_once_is_unmasked_alone() {
        let host = PathBuf::from("/home/u/proj/.env");
        let mut fake = Fake::new(vec![denied(Path::new("/workspace/.env"), false), ran(Status::Ok)]);
        fake.masks.push(("/workspace/.env".into(), Mask::Secret(host.clone())));
        let l = looped();
        let (f, _) = drive(&l, &fake, true, &[Answer::Allow]);
        assert_eq!(*fake.unmasked.lock(), [host]);
        assert!(f.outcome.replay.unwrap().contains("which looks like a secret, was allowed once"));
    }

    #[test]
    fn nobody_to_ask_refuses_without_asking() {
        let (_t, file) = data_file();
        let fake = Fake::new(vec![denied(&file, false), denied(&file, false)]);
        let (f, asked) = drive(&looped(), &fake, false, &[]);
        assert!(asked.is_empty());
        assert!(f.diagnostic.unwrap().contains("has no UI to ask the user"));
        // No permission extension in the pi session.
        let (f, asked) = drive(&GrantLoop::default(), &fake, true, &[]);
        assert!(asked.is_empty());
        assert!(f.diagnostic.unwrap().contains("there is no permission extension"));
    }

    #[test]
    fn a_second_denial_in_the_rerun_is_asked_about_in_turn() {
        let (_t, file) = data_file();
        let (_u, other) = data_file();
        let fake = Fake::new(vec![denied(&file, false), denied(&other, false)]);
        let l = looped();
        let (f, asked) = drive(&l, &fake, true, &[Answer::Allow, Answer::Deny]);
        assert_eq!(asked.iter().map(|d| PathBuf::from(&d.path)).collect::<Vec<_>>(), [file.clone(), other.clone()]);
        assert_eq!(fake.ran.load(Ordering::SeqCst), 2);
        assert_eq!(f.outcome.permission_path, Some(other.display().to_string()));
        assert!(f
            .diagnostic
            .unwrap()
            .contains(&format!("Read of {} was denied (denied by the user)", other.display())));
        assert_eq!(fake.once.lock().len(), 1);
        // The same path denied again after its grant: not asked again, not run a third time.
        let fake = Fake::new(vec![denied(&file, false), denied(&file, false)]);
        let (f, _) = drive(&l, &fake, true, &[Answer::Allow, Answer::Allow]);
        assert_eq!(fake.ran.load(Ordering::SeqCst), 2);
        assert!(f.diagnostic.unwrap().contains("was refused again in the new sandbox"));
    }

    #[test]
    fn allow_once_grants_of_one_call_stay_for_its_reruns() {
        let (_t, p) = data_file();
        let (_u, q) = data_file();
        // Reads p then q; after each restart only what is mounted counts.
        let mut fake = Fake::new(vec![denied(&p, false), denied(&q, false), ran(Status::Ok)]);
        fake.forgets = true;
        let l = looped();
        let (f, asked) = drive(&l, &fake, true, &[Answer::Allow, Answer::Allow]);
        assert_eq!(asked.len(), 2, "asked once per file");
        assert_eq!(f.outcome.status, Status::Ok);
        let mounted: Vec<PathBuf> = fake.once.lock().iter().map(|m| m.path.clone()).collect();
        assert_eq!(mounted, [p.clone(), q.clone()], "the second rerun's sandbox has both");
        // The next call starts afresh: nothing of this call is carried into it.
        let fake = Fake { forgets: true, ..Fake::new(vec![denied(&q, false), ran(Status::Ok)]) };
        let (_, asked) = drive(&l, &fake, true, &[Answer::Allow]);
        assert_eq!(asked.len(), 1);
        assert_eq!(fake.once.lock().iter().map(|m| m.path.clone()).collect::<Vec<_>>(), [q]);
    }

    #[test]
    fn a_runtime_that_never_reruns_names_what_was_missing_and_how_it_was_granted() {
        let (_t, file) = data_file();
        let mut fake = Fake::new(vec![denied(&file, false)]);
        fake.after = AfterGrant::NameWhatWasMissing;
        let l = looped();
        let (f, asked) = drive(&l, &fake, true, &[Answer::Allow]);
        assert_eq!((asked.len(), fake.ran.load(Ordering::SeqCst)), (1, 1), "the command ran once");
        assert_eq!(fake.once.lock().len(), 1, "the grant is in place for the next command");
        assert_eq!(f.outcome.replay, None);
        assert_eq!(
            f.diagnostic.unwrap(),
            format!(
                "The command needed {}, which was outside the sandbox mounts; it was allowed once: the next sandbox \
                 has just that file mounted read-only, {UNTIL_RESTART}. The command was not run again (its side \
                 effects would repeat): run it again to use the grant.",
                file.display()
            )
        );
        assert!(Grant::Remounted.not_rerun_text("/srv/d").contains("/srv/d, which was outside the sandbox mounts; read access to it was granted. The command was not run again"));
        assert!(Grant::Unmasked
            .not_rerun_text("/workspace/.env")
            .contains("which is hidden as a secret; it was allowed once"));
        // A denial reads the same as for a runtime that reruns.
        let mut fake = Fake::new(vec![denied(&file, false)]);
        fake.after = AfterGrant::NameWhatWasMissing;
        let (f, _) = drive(&looped(), &fake, true, &[Answer::Deny]);
        assert!(f.diagnostic.unwrap().contains("was denied (denied by the user)"));
    }

    #[test]
    fn the_time_spent_waiting_is_a_field_the_status_line_tells() {
        let (_t, file) = data_file();
        let fake = Fake::new(vec![denied(&file, false), ran(Status::Ok)]);
        let l = looped();
        let f = block(l.run(&fake, true, |_| async {
            tokio::time::sleep(Duration::from_millis(150)).await;
            Answer::Allow
        }));
        let o = &f.outcome;
        assert!(o.waited_ms >= 150, "{}", o.waited_ms);
        assert!(o.duration_ms >= o.waited_ms, "the call's time covers the wait: {} < {}", o.duration_ms, o.waited_ms);
        let text = render(o);
        let head = format!(
            "status: ok ({:.1}s, {:.1}s of it waiting for the user, worker generation 1)",
            o.duration_ms as f64 / 1000.0,
            o.waited_ms as f64 / 1000.0
        );
        assert!(text.starts_with(&head), "{text}");
        // Without a prompt: the run's own time, and nothing about waiting.
        let fake = Fake::new(vec![ran(Status::Ok)]);
        let f = drive(&l, &fake, true, &[]).0;
        assert_eq!((f.outcome.waited_ms, f.outcome.duration_ms), (0, 5));
        assert!(render(&f.outcome).starts_with("status: ok (0.0s, worker generation 1)"));
    }

    #[test]
    fn an_answer_handed_over_alone_leaves_its_note_for_the_next_run() {
        let (_t, file) = data_file();
        let fake = Fake::new(vec![ran(Status::Ok), ran(Status::Ok)]);
        let l = looped();
        let d = Denial { path: file.display().to_string(), is_directory: false, secret: false };
        assert_eq!(l.decide(&fake, &d, true), Decision::Ask);
        let Applied::Granted(grant) = l.apply(&fake, &d, Answer::Allow) else { panic!("granted") };
        l.note_for_next_run(grant.rerun_note(&d.path));
        assert!(block(l.run_once(&fake)).replay.unwrap().contains("was allowed once"));
        assert_eq!(block(l.run_once(&fake)).replay, None, "told once");
    }
}
